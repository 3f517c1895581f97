"""`troupe node start` and `troupe master start` given keys and ``--insecure`` (or the config's
``insecure = true``) started with the keys, the ``--insecure`` dropped without a word: which one
the user meant is theirs to say (report kl 4). Refused now in one line, exit 2, before anything is
made, each of the two named where it was given: the command line, the config file or
``$TROUPE_KEYS``."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from troupe.cli.main import app
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import KEYS_ENV, install

ENDPOINT = "tcp://127.0.0.1:49712"  # never bound: the start is refused before
CONTRADICT = "contradict each other: --insecure is to listen without keys"


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    made = tmp_path / "keys"
    generate_keys(made)
    return made


def _refused(tmp_path: Path, args: list[str], env_keys: Path | None = None) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {KEYS_ENV: str(env_keys) if env_keys is not None else None, "COLUMNS": "300"}
    logs = ["--logs", str(work / "logs")]
    done = CliRunner().invoke(app, [*args, "--endpoint", ENDPOINT, *logs], env=env)
    install(None)
    assert done.exit_code == 2, (done.output, done.exception)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert sorted(p.name for p in work.iterdir()) == [], "made something before the refusal"
    return done.stderr.strip()


@pytest.mark.parametrize("command", [["node", "start", "--name", "n1"], ["master", "start"]])
def test_keys_and_insecure_on_the_command_line_are_refused(
    tmp_path: Path, keys: Path, command: list[str]
) -> None:
    journal = ["--journal", str(tmp_path / "work" / "j.db")] if command[0] == "master" else []
    said = _refused(tmp_path, [*command, *journal, "--keys", str(keys), "--insecure"])
    assert said.startswith(f"error: --insecure and --keys {keys} {CONTRADICT}"), said
    said = _refused(tmp_path, [*command, *journal, "--insecure"], env_keys=keys)
    assert said.startswith(f"error: --insecure and ${KEYS_ENV} ({keys}) {CONTRADICT}"), said
    assert "`TROUPE_KEYS= troupe ...` runs one command without" in said, said


def test_a_node_configs_insecure_with_keys_is_refused_naming_where_each_is(
    tmp_path: Path, keys: Path
) -> None:
    both = tmp_path / "both.toml"
    both.write_text(f'[node]\ninsecure = true\nkeys = "{keys}"\n')
    said = _refused(tmp_path, ["node", "start", "--name", "n1", "--config", str(both)])
    assert said.startswith(
        f"error: [node] insecure of {both} and [node] keys ({keys}) of {both} {CONTRADICT}"
    )
    insecure = tmp_path / "insecure.toml"
    insecure.write_text("[node]\ninsecure = true\n")
    said = _refused(
        tmp_path, ["node", "start", "--name", "n1", "--config", str(insecure), "--keys", str(keys)]
    )
    assert said.startswith(f"error: [node] insecure of {insecure} and --keys {keys} {CONTRADICT}"), said
