"""A ``troupe run --cluster`` on a keyed cluster: its master can call the run's mailbox.

The master calls the run (``cancel_lease``) as every keyed member calls another: expecting the
cluster's server key. Here a runtime with the cluster pair stands for the master, on loopback,
with keys generated into tmp_path.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from troupe.runtime import AskTimeout, Unreachable
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.pipeline.run_keys import connect_run, run_identity
from troupe.runtime.security.keys import generate_keys, load_keys

WAIT_S = 30.0  # bound of every wait; never a bound on how fast anything is


async def _cancelled(_: Any) -> str:
    return "cancelled"


async def test_the_master_reaches_a_run_given_the_cluster_keys(tmp_path: Path) -> None:
    generate_keys(tmp_path / "k")  # cluster, operator and reader pairs, as the report's set-up
    warnings: list[str] = []
    async with (
        process_runtime("m", "master", security=load_keys(tmp_path / "k")) as master,
        connect_run(master.address, tmp_path / "k", warnings.append) as run,
    ):
        run.register_control("cancel_lease", _cancelled)
        with anyio.fail_after(WAIT_S):
            assert await master.control(run.address, "cancel_lease", timeout=WAIT_S) == "cancelled"
    assert warnings == []


async def test_a_run_with_only_an_operator_pair_says_the_master_cannot_reach_it(tmp_path: Path) -> None:
    generate_keys(tmp_path / "k")
    operator = tmp_path / "operator-machine"  # what README's "Security" gives an operator
    operator.mkdir(mode=0o700)
    for name in ("cluster.key", "operator.key", "operator.key_secret"):
        shutil.copy2(tmp_path / "k" / name, operator / name)
    assert run_identity(tmp_path / "k") == ("cluster", None)
    warnings: list[str] = []
    async with process_runtime("m", "master", security=load_keys(tmp_path / "k")) as master:
        master.register_control("ping", _cancelled)
        async with connect_run(master.address, operator, warnings.append) as run:
            with anyio.fail_after(WAIT_S):  # the run still reaches its master
                assert await run.control(master.address, "ping", timeout=WAIT_S) == "cancelled"
            run.register_control("cancel_lease", _cancelled)
            with anyio.fail_after(WAIT_S), pytest.raises((Unreachable, AskTimeout)):
                await master.control(run.address, "cancel_lease", timeout=2.0)
    assert len(warnings) == 1
    assert "hold no cluster pair" in warnings[0] and "next lease renewal (within 40 s)" in warnings[0]
