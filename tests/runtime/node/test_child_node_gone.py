"""A child whose node is gone before its guard was in place exits at once, with status 1, and quietly:
its stderr is the node's terminal, where a refused `troupe run` had printed its one-line error and
then "supervisor: the node that started it (pid N) is gone" after it."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_child_started_after_its_node_died_exits_at_once_and_quietly() -> None:
    env = {**os.environ, "TROUPE_PARENT_PID": "1"}  # init: certainly not the parent of this child
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from troupe.runtime.node.child import die_with_parent, run_and_exit\n"
            "def main():\n"
            "    die_with_parent()\n"
            "    print('ran on')\n"
            "run_and_exit(main)",  # as a worker and a supervisor run
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr == ""
