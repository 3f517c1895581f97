"""`troupe node start --config node.toml` whose ``[node] keys`` names one keys directory, in a
shell whose ``$TROUPE_KEYS`` names another (an operator's, exported for ``troupe ctl``): the
node started on the environment's keys without a word, the config's ignored (report kl 1).
Decided: the command line wins over the config file, and the file over the environment; where
the file and the environment differ, one line at start names the keys used and those ignored."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from troupe.cli.commands import node
from troupe.cli.main import app
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import KEYS_ENV, install

ENDPOINT = "tcp://127.0.0.1:49710"  # never bound: the node's serving is replaced


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[Path | None, str]]:
    """Runs ``troupe node start ARGS`` with ``$TROUPE_KEYS`` as given, up to the node's serving:
    the keys it would serve with, and its ``note: keys:`` line on stderr ("" where none)."""
    served: list[NodeConfig] = []

    async def serve(cfg: NodeConfig, *_args: Any) -> None:
        served.append(cfg)

    monkeypatch.setattr(node, "_serve", serve)
    monkeypatch.chdir(tmp_path)

    def run(env_keys: Path | None, *args: str) -> tuple[Path | None, str]:
        served.clear()
        env = {KEYS_ENV: str(env_keys) if env_keys is not None else None, "COLUMNS": "200"}
        logs = str(tmp_path / "logs")
        done = CliRunner().invoke(
            app, ["node", "start", "--name", "n1", "--endpoint", ENDPOINT, "--logs", logs, *args], env=env
        )
        install(None)
        assert done.exit_code == 0, (done.output, done.exception)
        assert len(served) == 1
        notes = [line for line in done.stderr.splitlines() if line.startswith("note: keys:")]
        return served[0].keys, " ".join(" ".join(notes).split())

    return run


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("config", "env", "option"):
        out[name] = tmp_path / name
        generate_keys(out[name])
    return out


def _config(tmp_path: Path, keys: Path | None) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nkeys = "{keys}"\n' if keys is not None else '[node]\nlog_level = "info"\n')
    return path


def test_the_config_files_keys_win_over_the_environment_and_say_so(
    tmp_path: Path, dirs: dict[str, Path], started: Callable[..., tuple[Path | None, str]]
) -> None:
    config = _config(tmp_path, dirs["config"])
    keys, said = started(dirs["env"], "--config", str(config))
    assert keys == dirs["config"]
    assert said == (
        f"note: keys: {dirs['config']}, the [node] keys of {config}, are used; ${KEYS_ENV} "
        f"({dirs['env']}) is ignored (a node's config file wins over the environment, and "
        "--keys DIR over both)"
    ), said


def test_the_command_line_wins_over_both_and_the_environment_serves_where_nothing_else_names_keys(
    tmp_path: Path, dirs: dict[str, Path], started: Callable[..., tuple[Path | None, str]]
) -> None:
    config = _config(tmp_path, dirs["config"])
    option = ("--keys", str(dirs["option"]))
    assert started(dirs["env"], "--config", str(config), *option) == (dirs["option"], "")
    assert started(dirs["env"], "--config", str(_config(tmp_path, None))) == (dirs["env"], "")
    assert started(dirs["env"]) == (dirs["env"], "")
    config = _config(tmp_path, dirs["config"])
    assert started(None, "--config", str(config)) == (dirs["config"], "")
    assert started(dirs["config"], "--config", str(config)) == (dirs["config"], "")  # the same: no line
