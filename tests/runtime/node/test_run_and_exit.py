"""A node's child ends without tearing its modules down, but exits as the interpreter would."""

from __future__ import annotations

import subprocess
import sys
import weakref

import pytest

from troupe.runtime.node import child

PROGRAM = """
import atexit, sys, weakref
from troupe.runtime.node.child import run_and_exit

class Kept:
    pass

def main():
    atexit.register(lambda: print("atexit ran"))
    global kept
    kept = Kept()
    weakref.finalize(kept, print, "finalizer ran")
    print("buffered, never flushed by main")
    {body}

run_and_exit(main)
print("not reached")
"""


def _run(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM.format(body=body)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("body", "code", "stderr"),
    [
        ("return", 0, ""),
        ("sys.exit(3)", 3, ""),
        ("sys.exit('the spec is bad')", 1, "the spec is bad"),
        ("raise ValueError('boom')", 1, "ValueError: boom"),
    ],
)
def test_exit_status_output_and_atexit_hooks_are_the_interpreters(body: str, code: int, stderr: str) -> None:
    done = _run(body)
    assert done.returncode == code
    lines = done.stdout.splitlines()
    assert lines[0] == "buffered, never flushed by main"
    assert sorted(lines[1:]) == ["atexit ran", "finalizer ran"]  # in atexit's order
    assert stderr in done.stderr
    if not stderr:
        assert done.stderr == ""


class _Kept:
    pass


def test_only_torchs_library_finalizers_are_skipped_at_exit() -> None:
    torch_library = pytest.importorskip("torch.library")
    kept = _Kept()
    ours = weakref.finalize(kept, print, "ours")
    child._skip_torch_library_release()
    registry = weakref.finalize._registry  # type: ignore[attr-defined]
    torchs = [f for f, info in registry.items() if info.func is torch_library._del_library]
    assert torchs, "torch registers a finalizer per operator library: none found"
    assert not any(f.atexit for f in torchs)
    assert ours.atexit
    ours.detach()
