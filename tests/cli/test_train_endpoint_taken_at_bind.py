"""A training run whose default endpoint is taken after it was found free (while the run checks
its checkpoints, before its node binds it) moves to a free port and says so, as a pipeline's run
does: it failed ("cannot bind a mailbox at tcp://127.0.0.1:7479: Address already in use ...;
pick --endpoint", exit 2), naming an option the user never gave. An endpoint that was given
still fails when taken.

The run is the command's own (``finish_train``, ``run_training``, the node it starts here, which
has no workers); the config's check, the run's preparation and its driver are stand-ins."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer

from troupe.actors.training import train_cluster, train_run
from troupe.cli.commands import run_train


@pytest.fixture
def port() -> Iterator[int]:
    """A loopback port free now, and whatever holds it closed after the test."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    number = probe.getsockname()[1]
    probe.close()
    yield number


class _Driver:
    """The training's driver, done at once: the run's node and its connection are what is tested."""

    def __init__(self, _rt: Any, _cfg: Any, _out: Path, hosts: list[Any], *_: Any) -> None:
        self.hosts = hosts
        self.spawned: list[Any] = []

    async def main(self, _fresh: bool) -> Any:
        # What the run logs of a finished training (train_finished), and the node's endpoint.
        return SimpleNamespace(
            endpoint=self.hosts[0].endpoint,
            steps=1,
            steps_this_run=1,
            resumed_from=0,
            loss=1.0,
            samples_per_s=1.0,
            restarts=0,
            checkpoints=[],
        )


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, port: int, endpoint: str | None) -> None:
    """``troupe run train.toml --json`` (``--endpoint`` where given), with the default
    ``tcp://127.0.0.1:PORT`` free when the run picks its endpoint and taken (another troupe run
    started at once) while it checks its checkpoints; what it printed as JSON."""
    out = tmp_path / "out"
    cfg = SimpleNamespace(train=SimpleNamespace(steps=1))
    other_run = socket.socket()

    def checked_while_another_run_starts(*_: Any) -> None:
        other_run.bind(("127.0.0.1", port))
        other_run.listen()
        return None

    class Held:
        def release(self) -> None:
            pass

    monkeypatch.setattr(run_train, "check_train", lambda *_: cfg)
    monkeypatch.setattr(run_train, "_trained_already", checked_while_another_run_starts)
    monkeypatch.setattr(run_train, "resume_step", lambda *_: 0)
    monkeypatch.setattr(run_train, "result_json", lambda result: {"endpoint": result.endpoint})
    monkeypatch.setattr(train_run, "prepare_run", lambda *_: (cfg, out, Held(), []))
    monkeypatch.setattr(train_run, "TrainDriver", _Driver)
    monkeypatch.setattr(train_cluster, "local_gpus", lambda: 0)
    try:
        run_train.finish_train(
            tmp_path / "train.toml", out, None, None, endpoint, None, False, True, f"tcp://127.0.0.1:{port}"
        )
    finally:
        other_run.close()


def test_a_default_taken_as_the_node_binds_moves_and_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], port: int
) -> None:
    _run(tmp_path, monkeypatch, port, None)
    captured = capsys.readouterr()
    default = f"tcp://127.0.0.1:{port}"
    endpoint = json.loads(captured.out)["endpoint"]  # stdout: the JSON object alone
    assert endpoint.startswith("tcp://127.0.0.1:") and endpoint != default
    said = (
        f"{default} was taken as the run started (another troupe run?): this run's node listens on "
        f"{endpoint} (troupe ctl status --node {endpoint})"
    )
    assert said in captured.err.splitlines(), captured.err


def test_a_given_endpoint_taken_as_the_node_binds_still_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], port: int
) -> None:
    given = f"tcp://127.0.0.1:{port}"
    with pytest.raises(typer.Exit) as exit_:
        _run(tmp_path, monkeypatch, port, given)
    assert exit_.value.exit_code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"cannot bind a mailbox at {given}" in err and "pick --endpoint" in err, err
