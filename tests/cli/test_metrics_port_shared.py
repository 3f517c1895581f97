"""`--metrics` on the port of the process's own endpoint is refused before anything starts: each
port was free alone, so the preflight passed, the metrics took the port, the endpoint's bind
failed blaming "another master", and `master start --new` had made the journal already."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from troupe.cli.preflight import shared_port_problem
from troupe.runtime.testing.plugin import free_endpoint


@pytest.mark.parametrize(
    ("metrics", "endpoint"),
    [("127.0.0.1:7480", "tcp://127.0.0.1:7480"), ("0.0.0.0:7480", "tcp://127.0.0.1:7480"),
     ("127.0.0.1:7480", "tcp://0.0.0.0:7480")],
)  # fmt: skip
def test_one_port_for_both_is_said(metrics: str, endpoint: str) -> None:
    said = shared_port_problem(metrics, endpoint=endpoint)
    assert said == f"--metrics {metrics} and --endpoint {endpoint} are one port: give the metrics another"


@pytest.mark.parametrize(
    ("metrics", "endpoint"),
    [(None, "tcp://127.0.0.1:7480"), ("127.0.0.1:7481", "tcp://127.0.0.1:7480"),
     ("127.0.0.2:7480", "tcp://127.0.0.1:7480"), ("127.0.0.1:0", "tcp://127.0.0.1:0"),
     ("127.0.0.1:7480", "ipc:///tmp/x"), ("127.0.0.1:7480", None)],
)  # fmt: skip
def test_other_ports_pass(metrics: str | None, endpoint: str | None) -> None:
    assert shared_port_problem(metrics, endpoint=endpoint) is None


def test_the_master_s_master_option_is_named(tmp_path: Path) -> None:
    said = shared_port_problem(
        "127.0.0.1:7490", endpoint="tcp://127.0.0.1:7480", master="tcp://127.0.0.1:7490"
    )
    assert said is not None and "and --master tcp://127.0.0.1:7490 are one port" in said


def test_master_start_refuses_it_and_makes_no_journal(tmp_path: Path) -> None:
    endpoint = free_endpoint()
    metrics = endpoint.removeprefix("tcp://")
    journal = tmp_path / "j.db"
    run = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "master", "start", "--journal", str(journal), "--new",
         "--endpoint", endpoint, "--logs", str(tmp_path / "logs"), "--metrics", metrics],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert f"error: --metrics {metrics} and --endpoint {endpoint} are one port" in " ".join(
        run.stderr.split()
    )
    assert not journal.exists()


def test_node_start_refuses_it(tmp_path: Path) -> None:
    endpoint = free_endpoint()
    metrics = endpoint.removeprefix("tcp://")
    run = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "node", "start", "--endpoint", endpoint,
         "--logs", str(tmp_path / "logs"), "--metrics", metrics],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert f"error: --metrics {metrics} and --endpoint {endpoint} are one port" in " ".join(
        run.stderr.split()
    )
