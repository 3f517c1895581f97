"""A standalone node's ``<name>.<pid>.pids`` record, as a user meets it: a second ``troupe node
start`` of the same name and --logs is refused while the first runs (au 4: both ran and wrote
one ``<name>.jsonl``), and a stop at once (a second signal) removes the record as a clean stop
does (fh 3: it stayed, naming dead processes, until a node of that name started there again).
Of two started in the same instant, exactly one runs (ns: both found no record, both ran): the
moment is made, not raced, the first held between its namesake check and its record.

Real processes on loopback, in ``$TROUPE_TEST_PORTS`` where the machine gives one.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from support.cli_scripts import HELD_AFTER_A_CALL
from support.cli_session import troupe_in_session
from support.cluster import ctl
from support.port_range import test_endpoint
from support.run_resume_helpers import running

pytestmark = pytest.mark.e2e

NODE_TOML = """
[node]
stop_grace_s = 5

[[workers]]
name = "w-echo"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
"""


def _start(config: Path) -> list[str]:
    return ["node", "start", "--config", str(config), "--name", "n1", "--endpoint", test_endpoint()]


@pytest.mark.timeout(300)
def test_a_namesake_is_refused_and_a_stop_at_once_leaves_no_record(tmp_path: Path) -> None:
    config, logs = tmp_path / "node.toml", tmp_path / "logs"
    config.write_text(NODE_TOML)
    args = ["--logs", str(logs)]
    with running([*_start(config), *args], tmp_path, "first") as first:
        first.wait_until("its worker", lambda: "worker_registered" in first.text(), timeout=120)
        assert [p.name for p in logs.glob("n1.*.pids")] == [f"n1.{first.proc.pid}.pids"]

        second = ctl(*_start(config), *args, timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        said = " ".join(second.stderr.split())
        assert f"node 'n1' already runs with its log in {logs} (pid {first.proc.pid})" in said, said
        assert second.stderr.count("error:") == 1 and "Traceback" not in said, said
        records = [json.loads(line) for line in (logs / "n1.jsonl").read_text().splitlines()]
        nodes = {r["pid"] for r in records if r.get("process") == "node"}
        assert nodes == {first.proc.pid}, "the refused node wrote into the live one's log"

        # Back to back, two different signals (the same one twice may merge while pending).
        first.signal(signal.SIGTERM)
        first.signal(signal.SIGINT)
        status = first.wait(timeout=60)
        text = first.text()
        taken = signal.SIGTERM if "SIGTERM: stopping gracefully" in text else signal.SIGINT
        assert "stopped at once" in text and status == 128 + taken, text[-3000:]
        assert not first.survivors()
    assert not list(logs.glob("n1.*.pids")), "the stopped node's record was left"


@pytest.mark.timeout(300)
def test_of_two_namesakes_started_at_once_one_runs_and_the_other_is_refused(tmp_path: Path) -> None:
    """The first is held where both of two started at once were: its check passed, its record
    not written yet (it writes it after reaping its predecessors). The second is refused naming
    it all the same, and writes nothing into its log; let go, the first runs, alone."""
    config, logs = tmp_path / "node.toml", tmp_path / "logs"
    config.write_text(NODE_TOML)
    held, release = tmp_path / "held", tmp_path / "release"
    hook = ["troupe.runtime.node.node:reap_predecessors", str(held), str(release)]
    args = ["--logs", str(logs)]
    with running([*hook, *_start(config), *args], tmp_path, "first", code=HELD_AFTER_A_CALL) as first:
        first.wait_until("its check passed and its record not written", held.exists, timeout=120)
        assert not list(logs.glob("n1.*.pids"))
        second = troupe_in_session(*_start(config), *args, timeout=120)  # a second that runs: killed
        release.write_text("")
        assert second.returncode == 2, second.stdout + second.stderr
        said = " ".join(second.stderr.split())
        assert f"node 'n1' already runs with its log in {logs} (pid {first.proc.pid})" in said, said
        assert second.stderr.count("error:") == 1 and "Traceback" not in said, said

        first.wait_until("its worker", lambda: "worker_registered" in first.text(), timeout=120)
        assert [p.name for p in logs.glob("n1.*.pids")] == [f"n1.{first.proc.pid}.pids"]
        records = [json.loads(line) for line in (logs / "n1.jsonl").read_text().splitlines()]
        assert {r["pid"] for r in records if r.get("process") == "node"} == {first.proc.pid}
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 128 + signal.SIGTERM, first.text()[-3000:]
        assert not first.survivors()
