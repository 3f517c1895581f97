"""`troupe ctl --keys DIR COMMAND` (the form the README and `troupe ctl --help` show) ran with
``$TROUPE_KEYS`` instead: each command's own ``--keys``, filled from the environment, replaced
the group's (report ak 5). A shell whose profile exports an operator's keys then acted as that
operator on `troupe ctl --keys READER_DIR ...`. The command line wins now, wherever it names the
keys; and `troupe logs --keys DIR tail` takes them as `troupe ctl --keys DIR` does (report ak 6)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from troupe.cli.commands import ctl, logs
from troupe.cli.main import app
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import KEYS_ENV, install, installed

NODE = "tcp://127.0.0.1:48601"  # never asked: the node's reply is faked


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """An operator's and a reader's keys directory of one cluster."""
    made = tmp_path / "made"
    generate_keys(made)
    out = {}
    for role in ("operator", "reader"):
        own = out[role] = tmp_path / role
        own.mkdir(mode=0o700)
        for name in ("cluster.key", f"{role}.key", f"{role}.key_secret"):
            shutil.copy2(made / name, own / name)
    yield out
    install(None)


@pytest.fixture
def user_after(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Runs ``troupe ARGS`` with ``$TROUPE_KEYS`` set, the peer's answer faked: whose key it used."""

    def answered(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
        return {"node": "n1", "pid": 1}

    monkeypatch.setattr(ctl, "run_async", answered)
    monkeypatch.setattr(logs, "_tail_cluster", lambda *_args: None)

    def run(env_keys: Path, *args: str) -> str:
        install(None)
        done = CliRunner().invoke(app, list(args), env={KEYS_ENV: str(env_keys), "COLUMNS": "80"})
        assert done.exit_code == 0, done.output
        keys = installed()
        assert keys is not None
        return keys.user_id

    return run


def test_the_groups_keys_win_over_the_environment(
    dirs: dict[str, Path], user_after: Callable[..., str]
) -> None:
    reader, operator = dirs["reader"], dirs["operator"]
    assert user_after(operator, "ctl", "--keys", str(reader), "ping", "--node", NODE) == "reader"
    assert user_after(reader, "ctl", "--keys", str(operator), "ping", "--node", NODE) == "operator"


def test_the_commands_keys_win_wherever_they_stand(
    dirs: dict[str, Path], user_after: Callable[..., str]
) -> None:
    reader, operator = dirs["reader"], dirs["operator"]
    ping = ("ping", "--node", NODE)
    assert user_after(operator, "ctl", *ping, "--keys", str(reader)) == "reader"
    assert user_after(operator, "ctl", "--keys", str(operator), *ping, "--keys", str(reader)) == "reader"


def test_the_environment_serves_where_no_keys_are_given(
    dirs: dict[str, Path], user_after: Callable[..., str]
) -> None:
    assert user_after(dirs["reader"], "ctl", "ping", "--node", NODE) == "reader"
    assert user_after(dirs["reader"], "logs", "tail", "--master", NODE) == "reader"


def test_logs_takes_the_keys_before_its_command(
    dirs: dict[str, Path], user_after: Callable[..., str]
) -> None:
    tail = ("tail", "--master", NODE, "--no-follow")
    assert user_after(dirs["operator"], "logs", "--keys", str(dirs["reader"]), *tail) == "reader"
