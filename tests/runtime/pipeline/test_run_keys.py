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

from troupe.runtime import AskTimeout, ConfigError, Unreachable
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.pipeline import run_keys
from troupe.runtime.pipeline.run_keys import RunMailbox, connect_run, run_identity, run_mailbox
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


def _routes_from(monkeypatch: pytest.MonkeyPatch, local: str) -> None:
    """This host reaches every peer from ``local`` (what the kernel's route would pick)."""
    monkeypatch.setattr(run_keys, "source_address", lambda peer: local)


def test_a_run_listens_on_its_address_towards_a_master_on_another_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its mailbox listened on 127.0.0.1: the master dialled its own loopback for a cancel."""
    generate_keys(tmp_path / "k")
    _routes_from(monkeypatch, "10.9.9.2")
    assert run_mailbox("tcp://10.9.9.1:7480", tmp_path / "k") == RunMailbox(
        "tcp://10.9.9.2:*", "cluster", None
    )
    # --endpoint wins; on loopback it needs no keys.
    given = run_mailbox("tcp://10.9.9.1:7480", tmp_path / "k", "tcp://10.9.9.3:49020")
    assert given.bind == "tcp://10.9.9.3:49020"
    assert run_mailbox("tcp://10.9.9.1:7480", None, "tcp://127.0.0.1:*").bind == "tcp://127.0.0.1:*"


def test_a_run_on_its_masters_host_keeps_its_mailbox_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generate_keys(tmp_path / "k")
    assert run_mailbox("tcp://127.0.0.1:7480", tmp_path / "k") == RunMailbox(
        "tcp://127.0.0.1:*", "cluster", None
    )
    _routes_from(monkeypatch, "10.9.9.1")  # the master's address is this host's own
    assert run_mailbox("tcp://10.9.9.1:7480", None) == RunMailbox("tcp://127.0.0.1:*", None, None)


def test_a_run_without_the_cluster_pair_stays_on_loopback_and_says_the_master_cannot_reach_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off loopback its mailbox would take orders from anyone (no keys), or fail the handshake of
    every node that pings it (an operator pair), which would stop its replicas."""
    _routes_from(monkeypatch, "10.9.9.2")
    mailbox = run_mailbox("tcp://10.9.9.1:7480", None)
    assert mailbox.bind == "tcp://127.0.0.1:*"
    assert mailbox.warning is not None and "cannot reach it" in mailbox.warning
    assert "next lease renewal (within 40 s)" in mailbox.warning
    with pytest.raises(ConfigError, match="not on loopback and the run has no cluster pair"):
        run_mailbox("tcp://10.9.9.1:7480", None, "tcp://10.9.9.2:49020")


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [("tcp://0.0.0.0:49020", "registered with the master by its address"), ("10.9.9.2:49020", "--endpoint")],
)
def test_an_endpoint_the_master_cannot_be_told_is_refused(tmp_path: Path, endpoint: str, said: str) -> None:
    generate_keys(tmp_path / "k")
    with pytest.raises(ConfigError, match=said):
        run_mailbox("tcp://10.9.9.1:7480", tmp_path / "k", endpoint)
