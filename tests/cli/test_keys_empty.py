"""`--keys ''` (a script's ``--keys "$KEYS"`` with KEYS unset) was taken as the current folder,
keys or not, by every command; and ``[node] keys = ""`` likewise (report kl 2). Refused now in one
line, exit 2. Decided: an empty ``$TROUPE_KEYS`` is no keys, as an unset one (the shells'
convention, and ``TROUPE_KEYS= troupe ...`` the way to run one command without them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from troupe.cli.commands import ctl
from troupe.cli.main import app
from troupe.runtime.security.process import KEYS_ENV, install, installed

NODE = "tcp://127.0.0.1:49711"  # never asked: the commands stop before, or the reply is faked
SAID = "error: --keys is empty (an empty path would be the current folder): give the keys directory"


@pytest.mark.parametrize(
    "args",
    [
        ["ctl", "--keys", "", "ping", "--node", NODE],
        ["ctl", "ping", "--node", NODE, "--keys", ""],
        ["logs", "--keys", "", "tail", "--master", NODE],
        ["node", "start", "--keys", "", "--endpoint", NODE],
        ["master", "start", "--keys", "", "--journal", "j.db"],
        ["run", "--cluster", NODE, "--keys", ""],
    ],
    ids=["ctl", "ctl-command", "logs", "node", "master", "run"],
)
def test_an_empty_keys_option_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, args, env={KEYS_ENV: None, "COLUMNS": "300"})
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith(SAID), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing made: no journal, no logs


def test_an_empty_keys_in_a_node_config_is_refused_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[node]\nkeys = ""\n')
    done = CliRunner().invoke(app, ["node", "start", "--config", str(config)], env={KEYS_ENV: None})
    assert done.exit_code == 2, done.output
    assert done.stderr.strip() == (
        f"error: {config}: node.keys: is empty; give the keys directory, or leave keys out to use none"
    ), done.stderr


def test_an_empty_environment_variable_is_no_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def answered(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
        return {"node": "n1", "pid": 1}

    monkeypatch.setattr(ctl, "run_async", answered)
    monkeypatch.chdir(tmp_path)  # keys or not here, they are not taken
    install(None)
    done = CliRunner().invoke(app, ["ctl", "ping", "--node", NODE], env={KEYS_ENV: ""})
    assert done.exit_code == 0, done.output
    assert installed() is None
