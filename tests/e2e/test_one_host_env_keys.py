"""A `$TROUPE_KEYS` set in the shell (as the README's cluster sections have users export it) is
some cluster's keys: a one-host `troupe run` and `troupe demo` start keyless nodes of their own,
and their clients must not present those keys to them. They did: every call waited 30 s, then
"no reply to 'jobs' ... busy, hung or gone"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.train_run_cli import finish, troupe
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import KEYS_ENV
from troupe.runtime.testing.plugin import import_path

pytestmark = pytest.mark.e2e

PIPELINE = """
[pipeline]
name = "keyless"
items = 2

[[stages]]
name = "only"
actor = "support.hook_stages:EchoStage"
"""


@pytest.fixture(autouse=True)
def keys_in_the_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    generate_keys(tmp_path / "keys")
    monkeypatch.setenv(KEYS_ENV, str(tmp_path / "keys"))
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


def test_a_one_host_run_ignores_the_shells_keys(tmp_path: Path) -> None:
    config = tmp_path / "keyless.toml"
    config.write_text(PIPELINE, encoding="utf-8")
    with troupe("run", str(config), "--out", str(tmp_path / "out"), "--json") as (proc, _):
        code, stdout, stderr = finish(proc)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert json.loads(stdout)["items"]["ok"] == 2


def test_the_demo_ignores_the_shells_keys(tmp_path: Path) -> None:
    with troupe("demo", "--logs", str(tmp_path / "logs")) as (proc, _):
        code, stdout, stderr = finish(proc)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert "ask greeter/greet -> 'hello, troupe'" in stdout
