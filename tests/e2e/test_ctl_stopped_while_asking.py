"""A one-shot ``troupe ctl`` command that only reads (ping, status, jobs, dead) stops nothing:
Ctrl-C while it waits for its answer ends it with 130 and says nothing, where it said "SIGINT:
stopping gracefully (Ctrl-C again to stop at once)" as if it had something to stop."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from support.raw_peer import WITHIN_S, RawPeer

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    "command",
    [
        ["ping", "--node", "{peer}"],
        ["status", "--node", "{peer}", "--master", "{peer}"],
        ["jobs", "--master", "{peer}"],
        ["dead", "some-job", "--master", "{peer}"],
    ],
    ids=lambda command: command[0],
)
def test_ctrl_c_while_waiting_for_the_answer_is_quiet(command: list[str]) -> None:
    with RawPeer() as peer:  # takes the request and never answers it
        args = [arg.format(peer=peer.endpoint) for arg in command]
        proc = subprocess.Popen(
            [sys.executable, "-m", "troupe.cli.main", "ctl", *args, "--timeout", "600"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            peer.receive()  # the request came: the command waits for its answer now
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=WITHIN_S) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
            out, err = proc.communicate(timeout=WITHIN_S)
    assert b"stopping gracefully" not in err and b"Traceback" not in err, err
    assert out == b"", out
