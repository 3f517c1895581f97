"""A node's child ends without tearing its modules down, but exits as the interpreter would."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import atexit, sys
from troupe.runtime.node.child import run_and_exit

def main():
    atexit.register(lambda: print("atexit ran"))
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
    assert done.stdout.splitlines() == ["buffered, never flushed by main", "atexit ran"]
    assert stderr in done.stderr
    if not stderr:
        assert done.stderr == ""
