"""A worker whose start hangs (its actor's constructor, its started() hook) is killed as hung
at ``[supervision] start_timeout_s``, warned about before, restarted under the restart policy,
and ``failed`` in the end with a reason that says it never finished starting. It stayed
"starting" for ever, with no log line: its heartbeat thread beat on, and it handled no message.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from support.cluster import ctl
from troupe.runtime.testing.plugin import free_endpoint, import_path, node_start_command, reap

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 1.5

CONFIG = """
[supervision]
interval_s = 0.1
heartbeat_timeout_s = 2
{table_bound}
[supervision.kinds.render]
{kind_bound}
[restart]
max_restarts = 1
backoff_base_s = 0.05
backoff_max_s = 0.1

[[workers]]
name = "w-hang"
kind = "render"
actors = [{{ name = "h", class = "support.cluster:{cls}" }}]
"""


def _status(endpoint: str) -> dict[str, Any] | None:
    out = ctl("ctl", "status", "--json", "--node", endpoint, "--timeout", "2")
    return json.loads(out.stdout) if out.returncode == 0 else None


@pytest.mark.parametrize(
    ("cls", "setting"),
    [
        ("HangsInConstructor", "[supervision] start_timeout_s"),
        ("HangsInStarted", "[supervision] start_timeout_s"),
        # Its kind's own bound, under the node's default of 180 s: a kind table refused the key.
        ("HangsInStarted", "[supervision.kinds.render] start_timeout_s"),
    ],
)
def test_a_worker_whose_start_hangs_is_killed_restarted_then_failed(
    tmp_path: Path, cls: str, setting: str
) -> None:
    config = tmp_path / "t.toml"
    bound = f"start_timeout_s = {START_TIMEOUT_S}"
    per_kind = setting.startswith("[supervision.kinds")
    config.write_text(
        CONFIG.format(table_bound="" if per_kind else bound, kind_bound=bound if per_kind else "", cls=cls)
    )
    endpoint, log_dir = free_endpoint(), tmp_path / "logs"
    env = {**os.environ, "PYTHONPATH": import_path(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        node_start_command(config, "t", endpoint, log_dir),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    seen: list[Any] = []
    try:
        deadline = time.monotonic() + 60  # a bound on a hang, not on speed
        worker: dict[str, Any] = {}
        while time.monotonic() < deadline and worker.get("state") != "failed":
            assert proc.poll() is None, f"the node exited ({proc.returncode})"
            status = _status(endpoint)
            worker = next((w for w in (status or {}).get("workers", []) if w["name"] == "w-hang"), {})
            seen.append(worker.get("state"))
        assert worker.get("state") == "failed", seen[-5:]
        assert worker["restarts"] == 1
        assert worker["exit"].startswith("start_timeout: never finished starting within 1.5s"), worker
    finally:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        assert not reap(proc, children)
    events = [json.loads(line) for line in (log_dir / "t.jsonl").read_text().splitlines()]
    slow = [e for e in events if e.get("event") == "worker_start_slow" and e.get("worker") == "w-hang"]
    killed = [e for e in events if e.get("event") == "worker_start_timeout" and e.get("worker") == "w-hang"]
    failed = [e for e in events if e.get("event") == "worker_failed" and e.get("worker") == "w-hang"]
    assert len(killed) == 2 and len(slow) == 4, (killed, slow)  # two starts, each warned twice first
    assert "started() hook" in killed[0]["hint"] and f"raise {setting} if" in killed[0]["hint"]
    assert f"killed as hung at 1.5 s ({setting})" in slow[0]["hint"]
    assert failed and failed[0]["reason"].startswith("start_timeout: never finished starting"), failed
