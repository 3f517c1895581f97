"""The node ``troupe bench messaging`` starts to time a start-up: it dies with the benchmark
killed outright (SIGKILL), its template, supervisor and worker with it (finding sg 1: they ran
on for good); and the benchmark's probe of the starting node leaves no reply unclaimed (finding
dt 6: each one gave up on came back as a warning, printed on the benchmark's stderr)."""

from __future__ import annotations

import contextlib
import select
import time
from pathlib import Path

import anyio
import psutil
import pytest

import troupe.runtime.core.router
from support.log_capture import module_logs
from support.processes import gone_within, reap_if_ours, start_script
from troupe.cli.bench.messaging import measure_startup

pytestmark = pytest.mark.e2e

HANG_GUARD_S = 60.0  # only so a regression cannot hang the suite; nothing here measures speed
GONE_WITHIN_S = 30.0  # for all of them together: a bound on a poll of the process table

# The start-up measurement, its probe never answered (so the benchmark is still measuring when
# it is killed), the node's pid said as it starts.
_BENCH = """
import contextlib, sys
from pathlib import Path
import anyio
from troupe.cli.bench import bench_children, messaging

real_start = bench_children.start


def start(args, **popen_kwargs):
    proc = real_start(args, **popen_kwargs)
    print(proc.pid, flush=True)
    return proc


class Deaf:
    def ref(self, _name):
        return self

    async def ask(self, *_args, **_kwargs):
        await anyio.sleep_forever()

    control = ask


@contextlib.asynccontextmanager
async def connect(_endpoint, _name):
    yield Deaf()


bench_children.start = start
messaging.connect = connect
messaging.STARTUP_LIMIT_S = 600.0
anyio.run(messaging.measure_startup, Path("logs"))
"""


def test_a_benchmark_killed_while_it_times_a_start_leaves_no_node(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "bench.py").write_text(_BENCH, encoding="utf-8")
    bench = start_script(tmp_path, "bench.py", new_session=True)
    procs: list[psutil.Process] = []
    try:
        assert bench.stdout is not None
        ready, _, _ = select.select([bench.stdout], [], [], HANG_GUARD_S)
        line = bench.stdout.readline() if ready else ""
        assert line, f"no node started within {HANG_GUARD_S} s: {bench.poll()}"
        node = psutil.Process(int(line))
        deadline = time.monotonic() + HANG_GUARD_S
        while not any("troupe worker w0" in _cmdline(p) for p in node.children(recursive=True)):
            assert time.monotonic() < deadline, "the node's worker did not start"
            time.sleep(0.05)
        procs = [node, *node.children(recursive=True)]  # the node, its template, supervisor, worker
        bench.kill()
        bench.wait(HANG_GUARD_S)
        gone_by = time.monotonic() + GONE_WITHIN_S
        left = [p.pid for p in procs if not gone_within(p.pid, max(0.0, gone_by - time.monotonic()))]
        assert left == [], f"{left} of {[p.pid for p in procs]} outlived the benchmark"
    finally:
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
            reap_if_ours(proc.pid)
        if bench.poll() is None:
            bench.kill()
        bench.wait(HANG_GUARD_S)
        for stream in (bench.stdout, bench.stderr):
            if stream is not None:
                stream.close()


def test_probing_the_starting_node_leaves_no_reply_unclaimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with module_logs(monkeypatch, troupe.runtime.core.router) as logs:
        fig = anyio.run(measure_startup, tmp_path, backend="asyncio", backend_options={"use_uvloop": True})
    assert fig["startup_s"] > 0 and fig["idle_processes"] == 4
    assert [e for e in logs if e["event"] == "error_reply_unclaimed"] == []


def _cmdline(proc: psutil.Process) -> str:
    """``proc``'s command line, empty for a child that ended (a zombie) or went since it was listed."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""
