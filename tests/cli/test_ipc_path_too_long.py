"""An ``ipc://`` endpoint whose socket path is longer than a Unix socket holds (107 bytes) is
refused as that, with the limit, in one line, exit 2, before anything is made: the node's bind
said "is another node already running there?" and ``ctl`` "Input/output error". ev 7"""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq
from typer.testing import CliRunner

from troupe.cli.main import app
from troupe.runtime.node.config import check_endpoint


def _socket_path(tmp_path: Path, size: int) -> str:
    folder = str(tmp_path)
    return f"{folder}/{'s' * (size - len(folder) - 1)}"


def test_the_longest_socket_path_passes_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    assert zmq.IPC_PATH_MAX_LEN == 107  # Linux's sockaddr_un
    check_endpoint(f"ipc://{_socket_path(tmp_path, 107)}")
    too_long = f"ipc://{_socket_path(tmp_path, 108)}"
    with pytest.raises(ValueError) as refused:
        check_endpoint(too_long)
    assert str(refused.value) == (
        f"endpoint {too_long!r}: the socket path is 108 bytes; Unix sockets allow at most 107: "
        "use a shorter path"
    )
    check_endpoint(f"ipc://{'r' * 107}")  # relative: measured as given, as ZeroMQ passes it on


@pytest.mark.parametrize(
    "command",
    [
        ["ctl", "ping", "--node"],
        ["node", "start", "--logs", "LOGS", "--endpoint"],
        ["run", "--out", "OUT", "--endpoint"],
    ],
    ids=lambda v: " ".join(v[:2]),
)
def test_each_command_refuses_it_before_anything_is_made(tmp_path: Path, command: list[str]) -> None:
    endpoint = f"ipc://{_socket_path(tmp_path, 110)}"
    made = tmp_path / "made"
    args = [str(made) if arg in ("LOGS", "OUT") else arg for arg in command]
    result = CliRunner().invoke(app, [*args, endpoint], env={"COLUMNS": "80", "TERM": "dumb"})
    assert result.exit_code == 2, result.output
    assert result.stderr.endswith(
        f"{command[-1]}: endpoint {endpoint!r}: the socket path is 110 bytes; Unix sockets allow at most "
        "107: use a shorter path\n"
    ), result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert not made.exists()
