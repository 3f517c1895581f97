"""What a benchmark starts dies with it, however the benchmark ends (bench_children.py). Killed
outright (SIGKILL: the OOM killer, the end of a lost ssh session), a benchmark runs no code: the
node or master it had started ran on for good, listening on its port."""

from __future__ import annotations

import ast
import select
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import troupe.cli.bench
from support.processes import gone_within, kill_all_in, reap_if_ours, start_script
from troupe.cli.bench import bench_children

WITHIN_S = 60.0  # a bound on a hang, not on speed
GONE_WITHIN_S = 30.0  # for all of them together: a bound on a poll of the process table

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# A benchmark that starts a process as every benchmark does, and a multiprocessing child as the
# raw pyzmq side does, says their pids once both are up, then waits to be killed.
_BENCH = """
import multiprocessing as mp, sys, time
from troupe.cli.bench import bench_children
from troupe.cli.bench.stopping import deaf_to_ctrl_c, start_deaf

MOST_S = 120  # each child ends by itself by then: a failing test leaves none for long


def wait(ready):
    ready.set()
    time.sleep(MOST_S)


if __name__ == "__main__":
    popen = bench_children.start([sys.executable, "-c", f"import time; time.sleep({MOST_S})"])
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=deaf_to_ctrl_c, args=(wait, ready), daemon=True)
    start_deaf(child)
    if not ready.wait(60):
        sys.exit("the multiprocessing child did not start within 60 s")
    print(popen.pid, child.pid, flush=True)
    time.sleep(MOST_S)
"""


@linux_only
def test_what_a_benchmark_killed_outright_started_dies_with_it(tmp_path: Path) -> None:
    (tmp_path / "bench.py").write_text(_BENCH, encoding="utf-8")
    bench = start_script(tmp_path, "bench.py", new_session=True)
    children: list[int] = []
    try:
        assert bench.stdout is not None
        ready, _, _ = select.select([bench.stdout], [], [], WITHIN_S)
        line = bench.stdout.readline() if ready else ""
        assert line, f"the benchmark said no pids within {WITHIN_S} s: {bench.poll()}"
        children = [int(pid) for pid in line.split()]
        bench.kill()
        bench.wait(WITHIN_S)
        gone_by = time.monotonic() + GONE_WITHIN_S
        left = [pid for pid in children if not gone_within(pid, max(0.0, gone_by - time.monotonic()))]
        assert left == [], f"{left} of {children} outlived the benchmark"
    finally:
        kill_all_in(tmp_path, bench)  # also what a failure left: they all work in tmp_path
        for pid in children:
            reap_if_ours(pid)
        for stream in (bench.stdout, bench.stderr):  # the children held them too: not read to the end
            if stream is not None:
                stream.close()


def test_a_child_is_started_from_the_main_thread_only() -> None:
    """The kernel ties the signal to the thread that started the child: from a worker thread
    (``anyio.to_thread``'s, which ends when idle), the child would die in mid-measurement."""
    raised: list[BaseException] = []

    def start_off_main() -> None:
        try:
            proc = bench_children.start([sys.executable, "-c", "pass"])
            proc.wait(WITHIN_S)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=start_off_main, name="not-main")
    thread.start()
    thread.join(WITHIN_S)
    assert len(raised) == 1 and isinstance(raised[0], RuntimeError), raised
    assert "'not-main'" in str(raised[0]) and "main thread" in str(raised[0])


def test_a_child_lives_as_long_as_the_benchmark_runs() -> None:
    proc = bench_children.start([sys.executable, "-c", "import sys; sys.exit(7)"])
    assert proc.wait(WITHIN_S) == 7
    assert (
        bench_children.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True).stdout
        == "ok\n"
    )


# Started otherwise on purpose, each with its reason in the module.
_NOT_THROUGH_BENCH_CHILDREN = {
    "bench_children.py",  # the helper itself
    "train_encode_alone.py",  # started on a worker thread; they end as their stdin does (EncodeAlone)
    "recovery.py",  # the spawn floor: a pre-exec hook would slow what it measures; it ends by itself
}
_STARTS = {"Popen", "run", "call", "check_call", "check_output"}


def test_every_process_a_benchmark_starts_goes_through_bench_children() -> None:
    """A bench that starts a process with plain ``subprocess`` leaves it running when killed
    outright (a whole node, a master: findings sg 1 and sg 3)."""
    folder = Path(troupe.cli.bench.__file__).parent
    plain = []
    for path in sorted(folder.glob("*.py")):
        if path.name in _NOT_THROUGH_BENCH_CHILDREN:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr in _STARTS
                and isinstance(func.value, ast.Name)
                and func.value.id == "subprocess"
            ):
                plain.append(f"{path.name}:{node.lineno}")
    assert plain == [], f"started with plain subprocess, not bench_children: {plain}"


@linux_only
def test_the_signal_is_one_a_node_stops_gracefully_on() -> None:
    """SIGTERM, not SIGKILL: a node or master stops as on any SIGTERM, its children with it."""
    script = (
        "import ctypes, signal, sys; out = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(out)); print(out.value)"  # PR_GET_PDEATHSIG
    )
    done = bench_children.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=WITHIN_S
    )
    assert int(done.stdout) == signal.SIGTERM, done
