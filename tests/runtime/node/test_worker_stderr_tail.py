"""The node keeps the tail of a worker's stderr and finds the one-line cause of its failure there."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import anyio

from troupe.runtime.node.worker_handles import StderrTail


def _tail_of(text: str) -> StderrTail:
    tail = StderrTail()
    tail.add(text.encode())
    return tail


async def test_the_last_exception_line_of_a_traceback_is_the_error() -> None:
    """A plain traceback gives its final line; a message passed to sys.exit is its own line."""
    traceback = textwrap.dedent(
        """\
        Traceback (most recent call last):
          File "x.py", line 1, in <module>
            import mypkg
        ModuleNotFoundError: No module named 'mypkg'
        """
    )
    assert _tail_of(traceback).last_error() == "ModuleNotFoundError: No module named 'mypkg'"
    assert _tail_of("worker w1: cannot import 'a:B'\n").last_error() == "worker w1: cannot import 'a:B'"
    assert _tail_of("").last_error() is None


async def test_an_exception_group_gives_its_member_not_the_frame() -> None:
    """anyio's task groups raise exception groups: the member's line is the error, not the +--- frame."""
    code = "raise ExceptionGroup('unhandled errors in a TaskGroup', [ValueError('bad kwargs: x')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert out.returncode == 1
    assert _tail_of(out.stderr.decode()).last_error() == "ValueError: bad kwargs: x"


async def test_only_the_tail_is_kept() -> None:
    """Output beyond the tail's size is dropped from the front; the last line survives."""
    tail = StderrTail()
    for i in range(10_000):
        tail.add(f"noise line {i}\n".encode())
    tail.add(b"RuntimeError: the end\n")
    assert tail.last_error() == "RuntimeError: the end"
    assert sum(len(c) for c in tail._chunks) <= 8192 + 64


async def test_pump_passes_a_child_s_stderr_on_and_keeps_it() -> None:
    """pump() reads a real child's stderr to its end, then the tail holds the child's error."""
    proc = await anyio.open_process(
        [sys.executable, "-c", "raise SystemExit('worker w: constructor failed')"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    tail = StderrTail()
    assert proc.stderr is not None
    with anyio.fail_after(30):
        await tail.pump(proc.stderr)
        assert await proc.wait() == 1
    assert tail.closed.is_set()
    assert tail.last_error() == "worker w: constructor failed"
