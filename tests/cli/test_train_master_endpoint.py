"""``troupe run TRAIN.toml --master E --endpoint N`` (report dt 5): with --master no node starts
here, and --endpoint was taken without a word; README sent the user to ``ctl status --node N``,
where nothing answers. The run now says so in one line, and where the ranks are watched.

The master is a runtime of this process answering ``status`` as a master with no nodes: the run
says its note once the master and the config passed, then is refused for want of a node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.train_run_cli import config_copy, finish, troupe
from troupe.runtime.core.runtime import process_runtime

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

CLI_S = 120.0  # bound of the command; never a bound on how fast it is


async def _status(_: Any) -> dict[str, Any]:
    return {"master": "m", "nodes": [], "workers": [], "jobs": []}


def _run(config: Path, out: Path, master: str) -> tuple[str, int, str]:
    with troupe("run", str(config), "--out", str(out), "--master", master) as (proc, endpoint):
        code, _, stderr = finish(proc, CLI_S)  # troupe() gives it --endpoint
    return endpoint, code, stderr


async def test_an_endpoint_given_with_master_is_said_to_be_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TROUPE_KEYS", raising=False)
    dataset = tmp_path / "data"
    (dataset / ".troupe" / "episodes").mkdir(parents=True)
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})
    async with process_runtime("m", "master") as master:
        master.register_control("status", _status)
        endpoint, code, stderr = await anyio.to_thread.run_sync(
            _run, config, tmp_path / "out", master.address
        )
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and lines[-1].endswith("the cluster offers: no nodes"), stderr
    notes = [line for line in lines if line.startswith("note: --endpoint")]
    assert notes == [
        f"note: --endpoint {endpoint} is not used with --master: this run starts no node (its ranks "
        "and encoders run on the cluster's nodes, named by the placing line); watch a rank with "
        "`troupe ctl status --node NODE` on its node (its training ranks table; --json: "
        "workers[].runtime.actor_metrics)"
    ], stderr
