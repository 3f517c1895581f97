"""A training run picks its node's default endpoint once its config is checked: the check
takes seconds, and another run that took the default meanwhile refused this one ("endpoint
... is in use; pass another --endpoint", an option the user never gave). The line that says so
is one line, piped too."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from troupe.cli.commands import run_train


def test_a_default_taken_while_the_config_is_checked_moves_to_a_free_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    taken.close()
    default = f"tcp://127.0.0.1:{port}"
    other_run = socket.socket()
    started: list[Any] = []

    def check_while_another_run_starts(*_: Any, **__: Any) -> Any:
        other_run.bind(("127.0.0.1", port))  # another troupe run takes the default meanwhile
        other_run.listen()
        return SimpleNamespace(train=SimpleNamespace(steps=1))

    monkeypatch.setattr(run_train, "check_train", check_while_another_run_starts)
    monkeypatch.setattr(run_train, "_trained_already", lambda *_: None)
    monkeypatch.setattr("troupe.cli.client.run_async", lambda _fn, *args, **_: started.append(args))
    try:
        run_train.finish_train(
            tmp_path / "t.toml", tmp_path / "out", None, None, None, None, False, True, default
        )
    finally:
        other_run.close()
    (args,) = started
    endpoint = args[3]
    assert endpoint.startswith("tcp://127.0.0.1:") and endpoint != default
    # One line, as a pipeline's run says it: piped, it was cut at column 80.
    said = (
        f"the default endpoint is taken (another troupe run?): this run's node listens on {endpoint} "
        f"(troupe ctl status --node {endpoint})"
    )
    assert said in capsys.readouterr().err.splitlines()
