"""`troupe logs tail -n N` shows every host's latest lines, whatever its clock (report tm 2: the
history was the newest N timestamps of all, and a host whose clock was two hours ahead filled
all of it, a host behind never appeared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

from troupe.cli.log_stream import ClusterLogs, latest_in_turns


def _line(node: str, hour: int, k: int) -> str:
    return json.dumps(
        {"timestamp": f"2026-01-01T{hour:02d}:00:{k:02d}Z", "node": node, "event": f"{node}{k}"}
    )


# Three hosts logging in the same minute: nA's clock two hours behind, nB's two hours ahead.
HOSTS = {"nA": 10, "master": 12, "nB": 14}


def _events(lines: list[str]) -> list[str]:
    return [json.loads(line)["event"] for line in lines]


def test_each_source_s_latest_lines_are_taken_in_turns_then_ordered_by_time() -> None:
    sources = [[(f"{h:02d}:{k:02d}", f"{node}{k}") for k in range(10)] for node, h in HOSTS.items()]
    assert latest_in_turns(sources, 5) == ["nA9", "master8", "master9", "nB8", "nB9"]  # newer first in a turn
    assert latest_in_turns(sources, 3) == ["nA9", "master9", "nB9"]
    assert latest_in_turns([[("1", "x")], []], 4) == ["x"] and latest_in_turns(sources, 0) == []


def test_the_files_history_has_every_host(tmp_path: Path) -> None:
    for node, hour in HOSTS.items():
        (tmp_path / f"{node}.jsonl").write_text("".join(_line(node, hour, k) + "\n" for k in range(10)))
    args = ["logs", "tail", "--logs", str(tmp_path), "--no-follow", "--json", "-n", "6"]
    done = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert _events(done.stdout.splitlines()) == ["nA8", "nA9", "master8", "master9", "nB8", "nB9"]


class _Cluster:
    """Stands in for the runtime the tail asks: the master's status, each host's kept lines."""

    async def control(self, endpoint: str, msg_type: str, payload: Any, timeout: float) -> object:
        if msg_type == "status":
            nodes = [
                {"node": n, "endpoint": f"tcp://{n}", "log_endpoint": f"tcp://{n}:9"} for n in ("nA", "nB")
            ]
            return {"master": "master", "log_endpoint": "tcp://master:9", "nodes": nodes}
        name = endpoint.removeprefix("tcp://")
        lines = [[k + 1, _line(name, HOSTS[name], k)] for k in range(10)]
        return {"incarnation": "A", "seq": 10, "lines": lines[-payload["limit"] :]}


def test_the_live_history_has_every_host() -> None:
    logs = ClusterLogs("tcp://master", frozenset(), lambda line, node: True, 3, lambda note: None)
    shown: list[str] = []

    class _Sub:
        def connect(self, endpoint: str) -> None:
            pass

    anyio.run(logs._start, _Cluster(), _Sub(), lambda node, line: shown.append(line))  # type: ignore[arg-type]
    assert _events(shown) == ["nA9", "master9", "nB9"]
