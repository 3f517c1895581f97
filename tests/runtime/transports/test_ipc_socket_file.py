"""An ``ipc://`` endpoint's socket file (report sh 7): ZeroMQ unlinks whatever is at the path
to bind it, so a second node bound to a running node's path took its socket without a word, and
the file stayed after its node stopped. A live listener's path is refused now (as a taken TCP
port is), a stale one is bound over, a file that is no socket is left alone, and the file goes
at close; the CLI tells no file, a stale one and a forbidden one apart, where it said "it
accepts connections, so it runs, but it is busy... or hung" for all of them."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from troupe.cli import master_client
from troupe.cli.preflight import endpoint_problem
from troupe.runtime.errors import Unreachable
from troupe.runtime.transports import ipc_socket
from troupe.runtime.transports.zmq import ZmqTransport


def test_a_live_node_s_socket_is_refused_and_removed_when_it_closes(tmp_path: Path) -> None:
    path = tmp_path / "n.sock"
    endpoint = f"ipc://{path}"
    first = ZmqTransport(bind=endpoint)
    try:
        inode = path.stat().st_ino
        with pytest.raises(Unreachable, match="Address already in use"):
            ZmqTransport(bind=endpoint)
        assert path.stat().st_ino == inode  # still the first one's
        said = endpoint_problem(endpoint, "--endpoint")
        assert said == f"endpoint {endpoint} is in use (another troupe node?); pass another --endpoint"
    finally:
        first.close()
    assert not path.exists()
    assert endpoint_problem(endpoint, "--endpoint") is None


def test_a_stale_socket_file_is_bound_over_and_a_plain_file_left_alone(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as ended:  # bound, never listened: its process ended
        ended.bind(str(stale))
    assert endpoint_problem(f"ipc://{stale}", "--endpoint") is None
    ZmqTransport(bind=f"ipc://{stale}").close()
    plain = tmp_path / "notes.txt"
    plain.write_text("mine")
    with pytest.raises(Unreachable, match="is a file, not a socket"):
        ZmqTransport(bind=f"ipc://{plain}")
    assert "is a file, not a socket" in (endpoint_problem(f"ipc://{plain}", "--endpoint") or "")
    assert plain.read_text() == "mine"


def test_a_socket_file_another_process_bound_since_is_not_removed(tmp_path: Path) -> None:
    path = tmp_path / "n.sock"
    transport = ZmqTransport(bind=f"ipc://{path}")
    path.unlink()  # its place taken by another's (a node started after a crash, say)
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))
        transport.close()
        assert path.exists()


def test_the_cli_says_why_nothing_answers_at_an_ipc_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "missing.sock"
    assert master_client.unreachable_why(f"ipc://{missing}", "node") == (
        f"no node listens at {missing} (no such socket file)"
    )
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as ended:
        ended.bind(str(stale))
    assert "a stale socket file" in (master_client.unreachable_why(f"ipc://{stale}", "master") or "")
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(tmp_path / "live.sock"))
        live.listen()
        assert master_client.unreachable_why(f"ipc://{tmp_path}/live.sock", "node") is None
        assert master_client.reachable(f"ipc://{tmp_path}/live.sock")
    # Root reaches any file: the kernel's refusal for another user's is stood in for.
    monkeypatch.setattr(ipc_socket, "connect_errno", lambda *_: errno.EACCES)
    said = master_client.unreachable_why(f"ipc://{stale}", "node") or ""
    assert said.startswith(f"not allowed to reach {stale} (permission denied"), said
    assert os.strerror(errno.EACCES).lower() in said.lower()
