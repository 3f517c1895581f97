"""The interface gloo listens on (report dt 1): the one this host reaches rank 0 through, not
the address gloo derives from the host name (loopback where the name maps to 127.0.1.1, the
Debian and Ubuntu default: peers on other hosts connected to their own loopback, and every
restart of the run failed the same way). A user's ``GLOO_SOCKET_IFNAME`` wins; a group that
still fails on a peer's loopback address ends the run in one line saying what to set. Two
hosts for real: tests/e2e/test_netns_ranks.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from trainer_testdata import train_data, wait_progress, write_clips

from troupe.actors.training import ranks, trainer
from troupe.actors.training.ranks import (
    GLOO_INTERFACE_ENV,
    RanksUnreachable,
    Rendezvous,
    gloo_interface,
    init_ranks,
    pin_gloo_interface,
)
from troupe.actors.training.trainer import TrainerActor
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.transports.base import MemoryHub

# What gloo said (torch 2.13) as a rank on another host connected to the loopback its peer gave.
GLOO_SAID = (
    "Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:34698$0"
)


def _addresses(*addresses: str) -> list[Any]:
    return [SimpleNamespace(address=a) for a in addresses]


@pytest.fixture
def no_pin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Neither the user nor an earlier group of this process set the variable; whatever a test
    pins is taken back (monkeypatch's delenv restores nothing for a variable that was not set)."""
    monkeypatch.setattr(ranks, "_pinned", None)
    before = os.environ.pop(GLOO_INTERFACE_ENV, None)
    try:
        yield
    finally:
        os.environ.pop(GLOO_INTERFACE_ENV, None)
        if before is not None:
            os.environ[GLOO_INTERFACE_ENV] = before


def test_the_interface_is_the_one_owning_the_address_that_reaches_the_peer() -> None:
    interfaces = {"eth9": _addresses("10.9.9.9", "fe80::1%eth9"), "lo7": _addresses("::1", "127.0.0.1")}
    assert gloo_interface("127.0.0.1", interfaces) == "lo7"
    assert gloo_interface("127.0.0.1", {"eth9": _addresses("10.9.9.9")}) is None  # no owner found
    assert gloo_interface("no-such-host.invalid", interfaces) is None  # does not resolve


def test_the_interface_is_pinned_unless_the_user_set_one(
    no_pin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    found: list[str | None] = ["eth1"]
    monkeypatch.setattr(ranks, "gloo_interface", lambda peer: found[0])
    env: dict[str, str] = {}
    assert pin_gloo_interface("10.0.0.1", env) == "eth1" and env == {GLOO_INTERFACE_ENV: "eth1"}
    found[0] = "eth2"  # rank 0 restarted on a host reached another way: this process's own pin moves
    assert pin_gloo_interface("10.0.1.1", env) == "eth2" and env == {GLOO_INTERFACE_ENV: "eth2"}
    found[0] = None  # none can be told: gloo's own choice, not a stale pin
    assert pin_gloo_interface("10.0.2.1", env) is None and env == {}
    user = {GLOO_INTERFACE_ENV: "ens5"}
    found[0] = "eth1"
    assert pin_gloo_interface("10.0.0.1", user) == "ens5" and user == {GLOO_INTERFACE_ENV: "ens5"}


def test_a_group_is_made_on_the_pinned_interface(no_pin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(ranks, "gloo_interface", lambda peer: "eth7" if peer == "10.1.2.3" else None)

    def made(**_: Any) -> None:
        seen.append(os.environ.get(GLOO_INTERFACE_ENV))

    monkeypatch.setattr(ranks.dist, "init_process_group", made)
    init_ranks(Rendezvous("10.1.2.3", 29500, 1, 2))
    assert seen == ["eth7"]


def test_a_peer_at_loopback_across_hosts_ends_the_run_in_one_line(
    no_pin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(**_: Any) -> None:
        raise RuntimeError(GLOO_SAID)

    monkeypatch.setattr(ranks.dist, "init_process_group", fails)
    with pytest.raises(RanksUnreachable) as info:
        init_ranks(Rendezvous("10.1.2.3", 29500, 1, 2))
    said = str(info.value)
    assert "a peer gave the loopback address 127.0.0.1 to be reached at from other hosts" in said
    assert f"start every trainer node with {GLOO_INTERFACE_ENV} set to the interface" in said
    assert "\n" not in said
    # Ranks on one host (rank 0 at loopback) or another failure: gloo's error, as it may pass.
    with pytest.raises(RuntimeError) as plain:
        init_ranks(Rendezvous("127.0.0.1", 29500, 1, 2))
    assert not isinstance(plain.value, RanksUnreachable)


async def test_a_group_that_cannot_form_across_hosts_fails_the_rank_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not restarted train.max_restarts times: each restart gave the same loopback address."""

    async def rendezvous(*_: Any, **__: Any) -> Rendezvous:
        return Rendezvous("10.1.2.3", 29500, 1, 2)

    def unreachable(rdv: Rendezvous) -> Rendezvous:
        raise RanksUnreachable("the ranks' gloo group cannot form")

    monkeypatch.setattr(trainer, "rendezvous_from", rendezvous)
    monkeypatch.setattr(trainer, "init_ranks", unreachable)
    config = train_data(write_clips(tmp_path / "run"), 2, local_encoding=True)
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        rank = await runtime.spawn(TrainerActor(threads=1), "trainer")
        start = {"config": config, "out": str(tmp_path / "out"), "rank": 1, "world_size": 2}
        await rank.ask("start", start)
        failed = await wait_progress(rank, lambda p: p["state"] == "failed")
    assert failed["final"] is True
    assert failed["error"] == "RanksUnreachable: the ranks' gloo group cannot form", failed
