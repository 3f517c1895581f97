"""SIGINT, SIGTERM and SIGHUP stop the long-running troupe commands: gracefully, with exit status
130, 143 or 129 and no process of theirs left behind; a second Ctrl-C or SIGTERM stops them at
once (a hangup again does not: it comes more than once as a terminal goes).

Real processes on loopback. Each signal comes at a random moment after the command is up (a
seeded delay; TROUPE_STOP_SEED replays it).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from support.hook_stages import read_records
from support.run_resume_helpers import (
    dataset_task_ids,
    run_args,
    running,
    small_pipeline,
    summary_counts,
)
from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("TROUPE_STOP_SEED", "5"))

NODE_TOML = """
[node]
stop_grace_s = 5

[[workers]]
name = "w-echo"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]

[[workers]]
name = "w-relay"
actors = [{ name = "relay", class = "troupe.actors.demo.actors:Relay" }]
"""


def _after(delay: float) -> Callable[[], bool]:
    deadline = time.monotonic() + delay
    return lambda: time.monotonic() >= deadline


@pytest.mark.parametrize(
    ("command", "signum", "group"),
    [
        ("node", signal.SIGTERM, False),
        ("node-with-master", signal.SIGINT, True),
        ("master", signal.SIGTERM, False),
        ("node", signal.SIGHUP, True),  # its ssh session closed: a hangup, to its process group
        ("master", signal.SIGHUP, True),
    ],
)
def test_a_long_running_command_stops_on_a_signal_and_leaves_no_process(
    tmp_path: Path, command: str, signum: int, group: bool
) -> None:
    """`node start` (alone or with the master inside) and `master start`: one signal, a clean
    stop, exit 128 + the signal, every process of the command gone."""
    config = tmp_path / "node.toml"
    config.write_text(NODE_TOML)
    logs, journal = tmp_path / "logs", tmp_path / "journal.db"
    args, ready = {
        "node": (
            ["node", "start", "--config", str(config), "--endpoint", free_endpoint(), "--logs", str(logs)],
            "worker_registered",
        ),
        "node-with-master": (
            [
                "node",
                "start",
                "--config",
                str(config),
                "--endpoint",
                free_endpoint(),
                "--logs",
                str(logs),
                "--with-master",
                "--master",
                free_endpoint(),
                "--journal",
                str(journal),
                "--new",
            ],
            "worker_registered",
        ),
        "master": (
            [
                "master",
                "start",
                "--endpoint",
                free_endpoint(),
                "--logs",
                str(logs),
                "--journal",
                str(journal),
                "--new",
            ],
            "master_started",
        ),
    }[command]
    delay = random.Random(f"{SEED}-{command}-{signum}").uniform(0.0, 1.0)
    with running(args, tmp_path, command) as cmd:
        cmd.wait_until(ready, lambda: ready in cmd.text(), timeout=120)
        cmd.wait_until("the random moment", _after(delay))
        cmd.signal(signum, group=group)
        assert cmd.wait(timeout=60) == 128 + signum, f"seed {SEED}:\n{cmd.text()[-3000:]}"
        assert not cmd.survivors(), f"seed {SEED}: processes left behind"
    if command != "master":
        assert len(cmd.seen) >= 3  # the supervisor and both workers were tracked, and are gone


# Enough items that both signals land while the run still works (a run of 8 small items can end
# inside the random delay now that workers start from the template).
ITEMS_TWICE = 32


@pytest.mark.timeout(400)
def test_a_second_signal_stops_troupe_run_at_once_and_a_rerun_completes(tmp_path: Path) -> None:
    """A signal, then another during the graceful stop: `troupe run` kills its process tree and
    exits at once, with the first signal's status. What was committed stays committed: a rerun
    completes, every episode exactly once."""
    config, out = small_pipeline(tmp_path), tmp_path / "out"
    committed = out / ".troupe" / "episodes" / "committed"
    delay = random.Random(f"{SEED}-twice").uniform(0.0, 0.5)
    with running(run_args(config, out, ITEMS_TWICE), tmp_path, "run") as run:
        run.wait_until("a committed episode", lambda: committed.is_dir() and any(committed.iterdir()))
        run.wait_until("the random moment", _after(delay))
        # Back to back, so the graceful stop cannot end before the second arrives; two different
        # signals, as the same one sent twice can merge into one while it is pending.
        run.signal(signal.SIGTERM)
        run.signal(signal.SIGINT)
        status = run.wait(timeout=60)
        text = run.text()
        first = "SIGTERM" if "SIGTERM: stopping gracefully" in text else "SIGINT"
        assert f"{first}: stopping gracefully" in text and "stopped at once" in text, text[-3000:]
        again = "Ctrl-C" if first == "SIGINT" else "SIGTERM"  # how the one who stopped it stops it at once
        assert f"({again} again to stop at once)" in text, text[-3000:]
        assert status == 128 + signal.Signals[first].value, f"seed {SEED}:\n{text[-3000:]}"
        assert not run.survivors(), f"seed {SEED}: processes of the run left behind"
        assert len(run.seen) >= 5  # the supervisor and a replica per stage were tracked
        assert not list((out / "logs").glob("local.*.pids")), "the node's pids record was left"

    with running(run_args(config, out, ITEMS_TWICE), tmp_path, "rerun") as rerun:
        assert rerun.wait(timeout=300) == 0, f"seed {SEED}:\n{rerun.text()[-3000:]}"
    if "every item was done by an earlier run" not in rerun.text():  # else the stop came after the last
        counts = summary_counts(rerun.text())
        done = counts["ok"] + counts["pruned"] + counts["kept"] + counts["before"]
        assert counts["dead"] == 0 and done == ITEMS_TWICE
    total, ids = dataset_task_ids(out)
    assert total == len(set(ids)) == len(ids) == len(list(committed.iterdir()))


@pytest.mark.timeout(300)
def test_a_ctrl_c_at_the_terminal_while_the_children_start_shows_no_traceback(tmp_path: Path) -> None:
    """A terminal's Ctrl-C goes to its whole foreground process group. The processes a command
    starts run in sessions of their own, so it reaches the command only, which stops them:
    none dies of a KeyboardInterrupt in the middle of its imports, printing its traceback."""
    config, out = small_pipeline(tmp_path), tmp_path / "out"
    with running(run_args(config, out, 8), tmp_path, "run") as run:
        run.wait_until("the first child process", lambda: bool(run.seen))
        group = os.getpgid(run.proc.pid)
        for child in list(run.seen.values()):
            try:
                assert os.getpgid(child.pid) != group, f"{child.cmdline()} is in the command's group"
            except ProcessLookupError:
                pass  # gone already (the class check's child, say)
        run.signal(signal.SIGINT, group=True)  # as the terminal does, while the children import
        status = run.wait(timeout=120)
        text = run.text()
        assert status == 128 + signal.SIGINT, text[-3000:]
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
        assert not run.survivors(), "processes of the run left behind"


HUNG_UP_ITEMS = 64

HUNG_UP_PIPELINE = """
[pipeline]
name = "hung-up"
items = {items}

[[stages]]
name = "a"
actor = "support.hook_stages:RecordingStage"
max_replicas = 1
kwargs = {{ log = {log}, label = "a", cost_s = 0.1 }}

[[stages]]
name = "b"
actor = "support.hook_stages:RecordingStage"
kwargs = {{ log = {log}, label = "b" }}
"""


@pytest.mark.timeout(300)
def test_a_hangup_stops_troupe_run_gracefully_and_a_rerun_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGHUP, as a terminal that goes (an ssh session closing) sends it to the command's
    process group, stops `troupe run` as Ctrl-C does: its stop line, exit 129, its processes
    stopped, its journal closed and its pids record gone; the rerun completes the items. It
    used to die of the signal at once, saying nothing, leaving its template and workers to
    find out alone. The hangup comes twice, as from the shell and from the kernel: the second
    is no second stop."""
    monkeypatch.setenv("PYTHONPATH", import_path())  # the replicas import the test's stages
    log, out = tmp_path / "hooks.jsonl", tmp_path / "out"
    config = tmp_path / "hung-up.toml"
    config.write_text(HUNG_UP_PIPELINE.format(items=HUNG_UP_ITEMS, log=json.dumps(str(log))), "utf-8")
    args = ["run", str(config), "--out", str(out), "--endpoint", free_endpoint(), "--master", free_endpoint()]

    def processed() -> int:  # items through the last stage
        return sum(1 for r in read_records(log) if r["hook"] == "process" and r["stage"] == "b")

    with running(args, tmp_path, "run") as run:
        run.wait_until("items through the last stage", lambda: processed() >= 4)
        run.signal(signal.SIGHUP, group=True)
        run.signal(signal.SIGHUP, group=True)
        status = run.wait(timeout=120)
        text = run.text()
        assert status == 128 + signal.SIGHUP, text[-3000:]
        flat = " ".join(text.split())
        assert "SIGHUP: stopping gracefully" in flat and "stopped at once" not in flat, text[-3000:]
        assert re.search(rf"stopped: at least \d+ of {HUNG_UP_ITEMS} items done", flat), text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert not run.survivors(), "processes of the run left behind"
        assert len(run.seen) >= 3  # the template and a replica per stage were tracked
    assert processed() < HUNG_UP_ITEMS, "the run ended before the hangup: it tested nothing"
    assert not (out / ".troupe" / "journal.db-wal").exists()  # the journal was closed
    assert not list((out / "logs").glob("local.*.pids")), "the node's pids record was left"

    with running(args, tmp_path, "rerun") as rerun:
        assert rerun.wait(timeout=120) == 0, rerun.text()[-3000:]
    counts = summary_counts(rerun.text())
    assert counts["dead"] == 0
    assert counts["ok"] + counts["pruned"] + counts["kept"] + counts["before"] == HUNG_UP_ITEMS


BUSY_PIPELINE = """
[pipeline]
name = "busy"
items = 1

[[stages]]
name = "a"
actor = "support.hook_stages:RecordingStage"
kwargs = {{ log = {log}, label = "a", cost_s = 600 }}
"""


@pytest.mark.timeout(300)
def test_a_stop_that_waits_for_a_busy_replica_says_which_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica busy with an item (a plain `process` that sleeps) is given the run's stop
    grace, then killed: the run says which replica it waits for, rather than nothing for
    seconds; exit 130 and no process left all the same."""
    monkeypatch.setenv("PYTHONPATH", import_path())
    log, out = tmp_path / "hooks.jsonl", tmp_path / "out"
    config = tmp_path / "busy.toml"
    config.write_text(BUSY_PIPELINE.format(log=json.dumps(str(log))), "utf-8")
    args = ["run", str(config), "--out", str(out), "--endpoint", free_endpoint(), "--master", free_endpoint()]
    with running(args, tmp_path, "run") as run:
        run.wait_until("the item in process", lambda: any(r["hook"] == "process" for r in read_records(log)))
        run.signal(signal.SIGINT)
        status = run.wait(timeout=120)
        flat = " ".join(run.text().split())
        assert status == 130, flat[-3000:]
        said = "stopping: waiting for busy-a-0 to end what it is doing (at most 10 s, then it is killed)"
        assert said in flat, flat[-3000:]
        assert not run.survivors(), "processes of the run left behind"
