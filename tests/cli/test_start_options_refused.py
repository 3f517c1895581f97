"""`troupe master start`, `troupe node start` and `troupe ctl` refuse a bad option in one line, exit 2, before
anything is made: an unknown --log-level (a traceback before), a master --name that is markup
or a path (a traceback, or a log file written outside --logs), a --node-timeout that is not
positive (its message named internal fields), an endpoint past port 65535 (it bound the port
modulo 65536)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.cli_session import troupe_in_session
from troupe.runtime.transports.loopback import free_endpoint

REFUSAL_S = 60  # a refusal comes before anything starts; a bound only, should it start after all


def troupe(*args: str) -> subprocess.CompletedProcess[str]:
    return troupe_in_session(*args, timeout=REFUSAL_S)


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (
            ["--log-level", "loud"],
            "error: --log-level: unknown log level 'loud': use debug, info, warning or error",
        ),
        (["--name", "[red]m[/] x"], "error: master name '[red]m[/] x' must be 1 to 100 ASCII letters"),
        (["--name", "../escaped"], "error: master name '../escaped' must be 1 to 100 ASCII letters"),
        (["--node-timeout", "-1"], "error: master: node_timeout_s (--node-timeout) must be > 0, got -1"),
        (
            ["--endpoint", "tcp://127.0.0.1:99999"],
            "error: master endpoint: endpoint 'tcp://127.0.0.1:99999' must be",
        ),
    ],
)
def test_master_start_refuses_a_bad_option(tmp_path: Path, option: list[str], said: str) -> None:
    args = ["--journal", str(tmp_path / "j.db"), "--new", "--logs", str(tmp_path / "logs")]
    if "--endpoint" not in option:
        args += ["--endpoint", free_endpoint()]
    done = troupe("master", "start", *args, *option)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(said), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "j.db").exists()
    assert not (tmp_path / "escaped.jsonl").exists()


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--log-level", "loud"], "error: command line: --log-level: unknown log level 'loud'"),
        (
            ["--endpoint", "tcp://127.0.0.1:99999"],
            "error: command line: --endpoint: endpoint 'tcp://127.0.0.1:99999'",
        ),
        (
            ["--master", "tcp:/127.0.0.1:7480"],
            "error: command line: --master: endpoint 'tcp:/127.0.0.1:7480'",
        ),
    ],
)
def test_node_start_refuses_a_bad_option(tmp_path: Path, option: list[str], said: str) -> None:
    args = ["--name", "n1", "--logs", str(tmp_path / "logs")]
    if "--endpoint" not in option:
        args += ["--endpoint", free_endpoint()]
    done = troupe("node", "start", *args, *option)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(said), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    "command", [["ctl", "ping", "--node"], ["ctl", "jobs", "--master"], ["logs", "tail", "--master"]]
)
def test_ctl_refuses_an_endpoint_past_port_65535(command: list[str]) -> None:
    done = troupe(*command, "tcp://127.0.0.1:99999")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "must be tcp://HOST:PORT (PORT 1-65535)" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [["ctl", "ping", "--node"], ["ctl", "jobs", "--master"]])
def test_ctl_says_a_host_name_that_does_not_resolve(command: list[str]) -> None:
    """A typo in a host name (``.invalid`` never resolves): said as such, one line, exit 2; it
    said no node answers there, as if the host were down."""
    done = troupe(*command, "tcp://nosuchhost.invalid:17470")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "the host name 'nosuchhost.invalid' does not resolve" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
def test_ctl_refuses_a_timeout_that_is_no_time(timeout: str) -> None:
    done = troupe("ctl", "ping", "--timeout", timeout)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert (
        done.stderr.strip()
        == f"error: --timeout must be a finite number of seconds above 0, got {float(timeout)}"
    )


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["run", "--endpoint", "tcp://127.0.0.1:99999"], "--endpoint"),
        (["run", "--master", "tcp:/127.0.0.1:7480"], "--master"),
        (["demo", "--endpoint", "tcp://127.0.0.1:99999"], "--endpoint"),
    ],
)
def test_run_and_demo_refuse_an_endpoint_that_is_none(
    tmp_path: Path, command: list[str], option: str
) -> None:
    """Checking endpoints' shape made these a pydantic traceback (they had bound port 34463)."""
    out = tmp_path / "out"
    place = ["--out", str(out)] if command[0] == "run" else ["--logs", str(out)]
    done = troupe(*command, *place)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(f"error: {option}: endpoint '"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()


def test_node_start_blames_the_option_not_the_config_file(tmp_path: Path) -> None:
    """A bad --name with a sound --config names the command line, not the file (it did)."""
    config = tmp_path / "node.toml"
    config.write_text('[node]\nname = "n1"\n')
    endpoint = free_endpoint()
    done = troupe("node", "start", "--config", str(config), "--name", "bad name!", "--endpoint", endpoint)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: command line: --name: may hold only ASCII letters"), done.stderr
    assert str(config) not in done.stderr


def test_run_refuses_one_port_for_its_node_and_its_master(tmp_path: Path) -> None:
    """`troupe run --endpoint E --master E`: one line, exit 2, nothing made in --out (the master
    bound the port first, and the node's error blamed "another node")."""
    endpoint = free_endpoint()
    done = troupe(
        "run", "--out", str(tmp_path / "out"), "--items", "2", "--endpoint", endpoint, "--master", endpoint
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"error: --endpoint {endpoint} is also --master: the run's node and master need a port each" in (
        done.stderr
    )
    assert not (tmp_path / "out").exists()
