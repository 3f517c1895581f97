"""``troupe run TRAIN.toml --master E`` on a cluster with CURVE keys (report dt 2): ``--keys DIR``
was refused ("a training run does not take it"), while a keyless run's error advised it; a
keyless run recorded --out, then said 5 s later that no master answered. The keys are taken
(``--keys``, or ``$TROUPE_KEYS``), and the master is asked with them before --out is made.

The master is a keyed runtime of this process answering ``status`` as a master with no nodes:
a run that reached it is refused for want of a node to place its workers on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.train_run_cli import config_copy, run_cli
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.security.keys import generate_keys, load_keys

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

CLI_S = 120.0  # bound of each command; never a bound on how fast it is


async def _status(_: Any) -> dict[str, Any]:
    return {"master": "m", "nodes": [], "workers": [], "jobs": []}


@asynccontextmanager
async def _keyed_master(keys: Path) -> AsyncIterator[str]:
    async with process_runtime("m", "master", security=load_keys(keys)) as master:
        master.register_control("status", _status)
        yield master.address


def _config(tmp_path: Path) -> Path:
    dataset = tmp_path / "data"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    return config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})


async def _run(*args: str) -> tuple[int, str, str]:
    return await anyio.to_thread.run_sync(lambda: run_cli("run", *args, timeout=CLI_S))


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TROUPE_KEYS", raising=False)
    generate_keys(tmp_path / "keys")
    return tmp_path / "keys"


async def test_a_keyless_run_is_told_the_master_wants_keys_before_out_is_made(
    tmp_path: Path, keys: Path
) -> None:
    out = tmp_path / "out"
    async with _keyed_master(keys) as master:
        code, stdout, stderr = await _run(str(_config(tmp_path)), "--out", str(out), "--master", master)
    assert code == 1, stdout + stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: --master: the master at {master} cannot be asked"), lines[0]
    assert "CURVE keys" in lines[0] and "--keys DIR, or $TROUPE_KEYS" in lines[0], lines[0]
    assert "AskTimeout" not in lines[0], lines[0]
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


@pytest.mark.parametrize("given", ["--keys", "$TROUPE_KEYS"])
async def test_the_cluster_s_keys_reach_the_master(
    tmp_path: Path, keys: Path, given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if given == "$TROUPE_KEYS":
        monkeypatch.setenv("TROUPE_KEYS", str(keys))
    flags = ("--keys", str(keys)) if given == "--keys" else ()
    async with _keyed_master(keys) as master:
        code, stdout, stderr = await _run(
            str(_config(tmp_path)), "--out", str(tmp_path / "out"), "--master", master, *flags
        )
    assert code != 0, stdout + stderr  # answered: it has no node to train on
    assert "cannot be asked" not in stderr and "CURVE" not in stderr, stderr
    assert "does not take it" not in stderr, stderr
    assert "the cluster offers: no nodes" in stderr, stderr


def test_keys_without_a_master_are_refused_naming_master(tmp_path: Path, keys: Path) -> None:
    out = tmp_path / "out"
    config = str(_config(tmp_path))
    code, stdout, stderr = run_cli("run", config, "--out", str(out), "--keys", str(keys), timeout=CLI_S)
    assert code == 2, stdout + stderr
    assert (
        "error: --keys: a training run on this host starts a node of its own, without keys; "
        "give --keys with --master MASTER"
    ) in stderr, stderr
    assert not out.exists()
