"""An endpoint option (``--node``, ``--master``, ``--endpoint``, ``--cluster``) that urllib
cannot parse is refused in the words of any other bad endpoint, naming the value as typed and
the form expected, printed as text: it said urllib's words alone ("error: --node: Invalid IPv6
URL"; "'bold' does not appear to be an IPv4 or IPv6 address", the markup of ``[bold]x`` lost),
and ``troupe run --cluster`` a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from troupe.cli.main import app

EXPECTED = "must be tcp://HOST:PORT (PORT 1-65535), ipc://PATH or inproc://NAME"


@pytest.mark.parametrize(
    ("command", "value"),
    [
        (["ctl", "ping", "--node"], "tcp://127.0.0.1:1[/]"),
        (["ctl", "status", "--node"], "tcp://[bold]x:17570"),
        (["ctl", "jobs", "--master"], "tcp://[::1:80"),
        (["ctl", "top", "--node"], "tcp://[red]:80"),
        (["logs", "tail", "--master"], "tcp://127.0.0.1:1[/]"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_an_endpoint_urllib_refuses_is_named_as_typed(command: list[str], value: str) -> None:
    result = CliRunner().invoke(app, [*command, value], env={"COLUMNS": "80", "TERM": "dumb"})
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {command[-1]}: endpoint {value!r} {EXPECTED}\n", result.stderr


def test_troupe_run_says_the_same_of_its_endpoint(tmp_path: Path) -> None:
    value = "tcp://127.0.0.1:1[/]"
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", "--out", str(out), "--endpoint", value], env={"TERM": "dumb"})
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: --endpoint: endpoint {value!r} {EXPECTED}\n", result.stderr
    assert not out.exists()


def test_troupe_run_cluster_says_it_in_one_line_too(tmp_path: Path) -> None:
    """``--cluster`` took it to a traceback (``ValueError: Invalid IPv6 URL``)."""
    value = "tcp://[bold]x:1[/]"
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", "--out", str(out), "--cluster", value], env={"TERM": "dumb"})
    assert result.exit_code == 2, result.output
    said = f"error: --cluster {value!r}: not an endpoint to connect to; expected tcp://HOST:PORT\n"
    assert result.stderr == said, result.stderr


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("tcp://0.0.0.0:49020", "registered with the master by its address"),
        ("tcp://10.9.9.2:49020", "not on loopback and the run has no cluster pair"),
        ("tcp://127.0.0.1:1[/]", f"--endpoint: endpoint 'tcp://127.0.0.1:1[/]' {EXPECTED}"),
    ],
)
def test_troupe_run_cluster_refuses_an_endpoint_its_master_cannot_call(
    tmp_path: Path, value: str, said: str
) -> None:
    """With --cluster, --endpoint is where the run listens for its master (it was not used)."""
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        ["run", "--out", str(out), "--cluster", "tcp://127.0.0.1:49030", "--endpoint", value],
        env={"TERM": "dumb", "COLUMNS": "400", "TROUPE_KEYS": ""},
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert said in result.stderr
    assert not out.exists()
