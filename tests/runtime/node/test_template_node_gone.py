"""A template whose node stops while it forks a worker ends quietly.

A node closes its end of the template's socket as it stops; a fork request it sent just before
is still served, and the template's answer (the new worker's pid) then has nobody to go to. It
used to end in a BrokenPipeError traceback on the terminal of a `troupe run` stopped while it
started its replicas. The test plays the node: a real template process, its socket, a request,
and the socket closed before the answer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from troupe.runtime.node.template import FD_ENV, MODULES_ENV

EXIT_WITHIN_S = 60.0  # a bound on a hang, not on speed


def test_a_template_whose_node_went_while_it_forked_exits_without_a_traceback(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stderr = tmp_path / "template.err"
    with stderr.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "troupe.lean_start", "troupe.runtime.node.template"],
            env={**os.environ, FD_ENV: str(theirs.fileno()), MODULES_ENV: "[]"},
            stdin=subprocess.DEVNULL,
            stderr=sink,
            pass_fds=(theirs.fileno(),),
        )
    theirs.close()
    try:
        ours.settimeout(EXIT_WITHIN_S)
        hello = json.loads(ours.recv(1 << 20))
        while "importing" in hello:  # what it imports before it is ready
            hello = json.loads(ours.recv(1 << 20))
        assert hello["ready"] is True
        read_end, write_end = os.pipe()
        request = {"env": dict(os.environ), "cwd": os.getcwd(), "modules": []}
        socket.send_fds(ours, [json.dumps(request).encode()], [write_end])
        os.close(write_end)
        ours.close()  # the node stops before the answer
        assert proc.wait(timeout=EXIT_WITHIN_S) == 0
        os.close(read_end)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=EXIT_WITHIN_S)
    said = stderr.read_text(errors="replace")
    assert "Traceback" not in said and "BrokenPipeError" not in said, said
