"""The troupe command as a user runs it: demo, logs tail, bad configs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.bench_cli import bench_json
from support.cluster import ctl, free_endpoint
from support.json_doc import undocumented

pytestmark = pytest.mark.e2e


def test_demo_runs_actors_across_processes_and_exits_cleanly(tmp_path: Path) -> None:
    """`troupe demo` starts a node with three worker processes, exchanges messages and exits 0."""
    out = ctl("demo", "--logs", str(tmp_path / "logs"), "--endpoint", free_endpoint(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "hello, troupe" in out.stdout
    assert "counter/get -> 100" in out.stdout
    assert "RemoteError" in out.stdout and "asked to fail" in out.stdout
    lines = (tmp_path / "logs" / "local.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    processes = {r["process"] for r in records}
    assert {"node", "w-echo", "w-greet", "w-relay"} <= processes
    assert all({"node", "pid", "level", "timestamp", "event"} <= set(r) for r in records)
    assert any(r.get("actor") == "echo" and "msg_id" in r for r in records), (
        "handler lines carry actor and msg_id"
    )


def test_logs_tail_renders_every_node_file(tmp_path: Path) -> None:
    """`troupe logs tail --no-follow` shows the last lines of each node's JSON log, readable, and passes
    non-JSON through."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text(
        json.dumps(
            {"timestamp": "t1", "level": "info", "node": "a", "process": "w0", "event": "hello", "k": 1}
        )
        + "\n"
    )
    (logs / "b.jsonl").write_text("not json at all\n")
    out = ctl("logs", "tail", "--logs", str(logs), "--no-follow")
    assert out.returncode == 0, out.stderr
    assert "t1 info a w0 hello k=1" in out.stdout
    assert "not json at all" in out.stdout
    raw = ctl("logs", "tail", "--logs", str(logs), "--no-follow", "--raw")
    assert '"event": "hello"' in raw.stdout


def test_bad_node_config_is_one_clear_error(tmp_path: Path) -> None:
    """A node config with a wrong field exits 2 naming the file and field, and never starts a node."""
    bad = tmp_path / "bad.toml"
    bad.write_text('[node]\nhwm = -1\nendpoint = "tcp://10.1.2.3:7000"\n')
    out = ctl("node", "start", "--config", str(bad), "--logs", str(tmp_path / "logs"))
    assert out.returncode == 2
    assert str(bad) in out.stderr and "hwm" in out.stderr and "loopback" in out.stderr
    assert "Traceback" not in out.stderr
    missing = ctl("node", "start", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "no such config file" in missing.stderr


def test_ctl_status_shows_the_running_pipeline_live(tmp_path: Path) -> None:
    """While `troupe run` works, `ctl status` against its node shows the stage metrics; the run
    then exits 0."""
    import time

    endpoint = free_endpoint()
    errors = tmp_path / "run-stderr.txt"
    with errors.open("wb") as err:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "troupe.cli.main",
                "run",
                "--scenes",
                "24",
                "--out",
                str(tmp_path / "out"),
                "--endpoint",
                endpoint,
                "--master",
                free_endpoint(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        seen = None
        deadline = time.monotonic() + 120
        while seen is None and run.poll() is None and time.monotonic() < deadline:  # bounded poll
            out = ctl("ctl", "status", "--json", "--node", endpoint, "--timeout", "2")
            if out.returncode == 0 and '"pipeline"' in out.stdout:
                status = json.loads(out.stdout)
                seen = status["pipeline"]
        assert seen is not None, "the pipeline never showed in ctl status"
        assert [s["name"] for s in seen["stages"]] == ["load", "plan", "render", "store"]
        assert {"lambda_measured", "lambda_theory", "lambda_succ", "bottleneck"} <= set(seen)
        assert undocumented("troupe ctl status --json", status) == []  # au 5: in docs/METRICS.md
        assert run.wait(timeout=300) == 0, errors.read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=30)


def test_bench_messaging_json_reports_every_figure_against_its_ceiling() -> None:
    """`troupe bench messaging --json` gives one object with the figures the issue names, each
    troupe throughput beside its raw ceiling and their ratio, and the asks beside the asyncio
    floor measured in the same run (a quick, single-run pass: this checks the command, not the
    machine's speed)."""
    fig = bench_json("messaging", "--quick", "--repeat", "1", timeout=300)
    for key in ("ask1", "ask64"):
        floor, troupe = fig[f"floor_{key}_per_s"], fig[f"troupe_{key}_per_s"]
        assert floor > 0 and troupe > 0
        assert fig[f"{key}_floor_ratio"] == pytest.approx(troupe / floor)
    for key in ("tell_small", "tell_large", "ask1", "ask64"):
        raw, troupe = fig[f"raw_{key}_per_s"], fig[f"troupe_{key}_per_s"]
        assert raw > 0 and troupe > 0
        assert fig[f"{key}_ratio"] == pytest.approx(troupe / raw)
        assert fig[f"local_{key}_ratio"] > 0
    assert fig["startup_s"] > 0
    assert fig["idle_rss_mib"] > 0 and fig["idle_processes"] == 4
    # Counts as ints, curve as a bool (ob 9: "curve": 0.0 was true to jq).
    assert type(fig["idle_processes"]) is int and type(fig["runs"]) is int
    assert fig["runs"] == 1 and fig["curve"] is False
