"""A worker that cannot start says why in the node's status, not only "exit 1".

A real node; workers are added with ``spawn_worker`` (a node's config is checked before it
starts, a worker spawned later is not): one whose actor class does not import, one whose
constructor raises. Each exits 1; ``last_error`` carries the cause and ``ctl status`` shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from troupe.runtime import ConfigError
from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

# The plugin's fixture, also when the `troupe` pytest11 entry point is not installed.
troupe_cluster = troupe_testing.troupe_cluster

CONFIG = """
[node]
stop_grace_s = 2

[restart]
max_restarts = 1
backoff_base_s = 0.05
backoff_max_s = 0.1

[[workers]]
name = "w-ok"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
"""

BROKEN = {
    "w-import": (
        {"name": "a", "class": "mypkg_not_installed.actors:Renderer"},
        "No module named 'mypkg_not_installed'",
    ),
    "w-ctor": (
        {"name": "a", "class": "troupe.actors.demo.actors:Echo", "kwargs": {"bogus": 1}},
        "TypeError: Echo() takes no arguments",
    ),
}


def _has_errors(status: dict[str, Any]) -> bool:
    workers = {w["name"]: w for w in status["workers"]}
    return all(n in workers and workers[n]["last_error"] for n in BROKEN)


async def test_a_worker_that_cannot_start_shows_its_error_in_status(
    troupe_cluster: Callable[..., Cluster],
) -> None:
    """An import failure and a raising constructor each show their one-line cause as last_error, in JSON and
    in ctl status."""
    cluster = troupe_cluster(CONFIG)
    for name, (actor, cause) in BROKEN.items():
        with pytest.raises(ConfigError) as refused:  # it exits before it registers: said at once
            await cluster.control(
                "spawn_worker", {"name": name, "actors": [actor], "timeout_s": 30}, timeout=40
            )
        assert "exited while starting" in str(refused.value) and cause in str(refused.value)
    status = await cluster.wait_for(_has_errors, timeout=30)
    workers = {w["name"]: w for w in status["workers"]}
    for name, (_, cause) in BROKEN.items():
        assert workers[name]["exit"].endswith("exit 1"), workers[name]
        assert cause in workers[name]["last_error"], workers[name]
        assert "\n" not in workers[name]["last_error"]
    assert workers["w-ok"]["last_error"] is None
    lines = [json.loads(ln) for ln in (cluster.log_dir / "t.jsonl").read_text().splitlines()]
    exits = {ln["worker"]: ln for ln in lines if ln["event"] == "worker_exited"}
    assert BROKEN["w-ctor"][1] in exits["w-ctor"]["error"]  # the cause is in the JSON log too

    env = {**os.environ, "COLUMNS": "400"}
    shown = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "ctl", "status", "--node", cluster.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    assert "last error" in shown.stdout
    for _, cause in BROKEN.values():
        assert cause in shown.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "ctl", "status", "--json", "--node", cluster.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    by_name = {w["name"]: w for w in json.loads(as_json.stdout)["workers"]}
    assert BROKEN["w-ctor"][1] in by_name["w-ctor"]["last_error"]
