"""``own_stdout``: within it, processes started write their stdout to stderr; ours stays ours.

``troupe run`` and ``troupe bench`` hold it while they work, so their stdout is their report
(``--json``) whatever the processes they start print.
"""

from __future__ import annotations

import subprocess
import sys

CODE = """
import subprocess, sys
from troupe.cli.commands.own_stdout import own_stdout

print("before", flush=True)
with own_stdout():
    subprocess.run([sys.executable, "-c", "print('a child talks')"], check=True)
    print("ours, within")
print("after", flush=True)
subprocess.run([sys.executable, "-c", "print('a child after')"], check=True)
"""


def test_children_print_to_stderr_within_and_to_stdout_again_after() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.splitlines() == ["before", "ours, within", "after", "a child after"]
    assert done.stderr.splitlines() == ["a child talks"]


def test_a_stdout_that_is_not_fd_1_is_left_as_it_is() -> None:
    code = (
        "import io, sys\n"
        "from troupe.cli.commands.own_stdout import own_stdout\n"
        "taken = io.StringIO(); real = sys.stdout; sys.stdout = taken\n"
        "with own_stdout():\n"
        "    print('into the caller')\n"
        "sys.stdout = real\n"
        "print(repr(taken.getvalue()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == repr("into the caller\n")
