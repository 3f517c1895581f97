"""Rendezvous of trainer ranks for torch.distributed.

A rank joins a group given explicitly (:class:`Rendezvous`) or by torchrun's environment
variables (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), so a
trainer started by torchrun works as one started by troupe. The backend is gloo on CPU and nccl
where CUDA is present (with gloo for CPU tensors too: asynchronous checkpoints need it).

:func:`rendezvous_from` takes the rendezvous from troupe's directory instead, so no launcher is
needed: rank 0 picks a port and publishes it as an actor under an agreed name; the other ranks ask
that actor (retrying until it exists) where to connect. In a node's worker, rank 0 publishes
through the worker's own ``spawn`` control, so the node names the actor in the directory the other
ranks' processes read; a run started again in the same process publishes its new port under the
same actor.

Gloo gives its peers the address it derives from the host name, which Debian and Ubuntu map to
loopback (``127.0.1.1 host``): ranks on other hosts then connect to their own loopback and the
group never forms. :func:`init_ranks` has gloo listen on the interface this host reaches rank 0
through instead (``GLOO_SOCKET_IFNAME``, the one knob every gloo group of the process reads, the
checkpoints' included), unless the user set that variable; a group that still fails on a peer's
loopback address is :class:`RanksUnreachable`, which no restart mends.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import psutil
import torch
import torch.distributed as dist

from troupe.runtime import (
    Actor,
    ActorStopped,
    AskTimeout,
    MailboxFull,
    Runtime,
    UnknownActor,
    Unreachable,
    handles,
)
from troupe.runtime.transports.route import source_address

__all__ = [
    "GLOO_INTERFACE_ENV",
    "RanksUnreachable",
    "Rendezvous",
    "RendezvousActor",
    "close_ranks",
    "default_backend",
    "gloo_interface",
    "init_ranks",
    "pin_gloo_interface",
    "publish_rendezvous",
    "rendezvous_from",
]

_NOT_YET = (ActorStopped, AskTimeout, MailboxFull, UnknownActor, Unreachable)
"""Errors of asking rank 0's actor that mean "not published yet": ask again."""

RENDEZVOUS_CLASS = "troupe.actors.training.ranks:RendezvousActor"

GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"
"""The variable gloo reads, as each of its groups is made, for the interface it listens on."""

_pinned: str | None = None
"""The value :func:`pin_gloo_interface` last set in this process: a later group (rank 0 moved
to another host) may change it, where a value the user set is left alone."""

# gloo's words for a peer it could not connect to at a loopback address: that peer gave loopback.
_LOOPBACK_PEER = re.compile(r"connectFullMesh.*remote=\[(127\.[0-9.]+|::1)\]", re.DOTALL)


class RanksUnreachable(RuntimeError):
    """The ranks' group cannot form: a peer on another host gave gloo a loopback address to be
    reached at (its host name resolves to loopback, or its GLOO_SOCKET_IFNAME names ``lo``).
    Every restart would give the same address: the run ends on it."""


@dataclass(frozen=True)
class Rendezvous:
    """Where and as whom a rank joins: rank 0 listens on ``addr:port``, the others connect."""

    addr: str
    port: int
    rank: int
    world_size: int
    local_rank: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(f"Rendezvous.port={self.port!r}: expected 1..65535")
        if self.world_size < 1:
            raise ValueError(f"Rendezvous.world_size={self.world_size!r}: expected >= 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"Rendezvous.rank={self.rank!r}: expected 0..{self.world_size - 1} (world_size)")
        if self.local_rank < 0:
            raise ValueError(f"Rendezvous.local_rank={self.local_rank!r}: expected >= 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Rendezvous:
        """Read torchrun's variables (``LOCAL_RANK`` defaults to 0).

        Raises ValueError naming a missing or non-integer variable.
        """
        env = os.environ if env is None else env
        values: dict[str, int] = {}
        for name in ("MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            raw = env.get(name, "0" if name == "LOCAL_RANK" else None)
            if raw is None:
                raise ValueError(f"environment variable {name} is not set (torchrun sets it)")
            try:
                values[name] = int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r}: expected an integer") from None
        addr = env.get("MASTER_ADDR")
        if not addr:
            raise ValueError("environment variable MASTER_ADDR is not set (torchrun sets it)")
        return cls(addr, values["MASTER_PORT"], values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])


def default_backend() -> str:
    """``cpu:gloo,cuda:nccl`` where CUDA is present, else ``gloo``."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init_ranks(
    rendezvous: Rendezvous | None = None,
    *,
    backend: str | None = None,
    timeout_s: float = 300.0,
) -> Rendezvous:
    """Join the default process group (from the environment when ``rendezvous`` is None).

    Where CUDA is present the rank uses GPU ``local_rank``. Gloo listens on the interface this
    host reaches rank 0 through (:func:`pin_gloo_interface`). Returns the rendezvous used.

    Raises:
        RuntimeError: a group is already initialised in this process, or gloo failed.
        RanksUnreachable: a peer gave gloo a loopback address while rank 0 is reached at another.
    """
    if dist.is_initialized():
        raise RuntimeError("init_ranks: a torch.distributed process group is already initialised")
    rdv = Rendezvous.from_env() if rendezvous is None else rendezvous
    if torch.cuda.is_available():
        torch.cuda.set_device(rdv.local_rank % torch.cuda.device_count())
    pin_gloo_interface(rdv.addr)
    try:
        dist.init_process_group(
            backend=backend or default_backend(),
            init_method=f"tcp://{rdv.addr}:{rdv.port}",
            rank=rdv.rank,
            world_size=rdv.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except RuntimeError as exc:
        unreachable = _unreachable(exc, rdv)
        if unreachable is None:
            raise
        raise unreachable from exc
    return rdv


def gloo_interface(peer: str, interfaces: Mapping[str, Sequence[Any]] | None = None) -> str | None:
    """The network interface this host reaches ``peer`` (rank 0's address) through: the one that
    owns the source address the kernel picks for it; None where neither can be told.

    ``interfaces``: name to addresses (objects with ``.address``), as ``psutil.net_if_addrs()``.
    """
    local = source_address(peer)
    if local is None:
        return None
    found = psutil.net_if_addrs() if interfaces is None else interfaces
    for name, addresses in found.items():
        if any(str(a.address).split("%")[0] == local for a in addresses):
            return name
    return None


def pin_gloo_interface(peer: str, env: MutableMapping[str, str] | None = None) -> str | None:
    """Have gloo listen on the interface this host reaches ``peer`` through (``env``, default
    this process's environment, gets ``GLOO_SOCKET_IFNAME``); the interface gloo is given, or
    None for gloo's own choice. A value the user set wins: it is left, and returned. Where no
    interface can be told, a value this function set before is taken back."""
    global _pinned
    env = os.environ if env is None else env
    current = env.get(GLOO_INTERFACE_ENV)
    if current and current != _pinned:
        return current
    interface = gloo_interface(peer)
    if interface is None:
        if current:
            del env[GLOO_INTERFACE_ENV]
        _pinned = None
        return None
    env[GLOO_INTERFACE_ENV] = _pinned = interface
    return interface


def _unreachable(exc: RuntimeError, rdv: Rendezvous) -> RanksUnreachable | None:
    """The error to end the run on where gloo failed on a peer's loopback address while rank 0
    is reached at another (the ranks span hosts); None for any other failure (it may pass)."""
    said = _LOOPBACK_PEER.search(str(exc))
    if said is None or _is_loopback(rdv.addr):
        return None
    return RanksUnreachable(
        f"the ranks' gloo group cannot form: a peer gave the loopback address {said.group(1)} to "
        f"be reached at from other hosts (its host name resolves to loopback, or "
        f"{GLOO_INTERFACE_ENV} names lo there); start every trainer node with {GLOO_INTERFACE_ENV} "
        "set to the interface that reaches the other hosts (`ip -br addr`), then run again"
    )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def close_ranks() -> None:
    """Leave the process group (nothing when none is initialised)."""
    if dist.is_initialized():
        dist.destroy_process_group()


class RendezvousActor(Actor):
    """Rank 0's answer to ``rendezvous``: where the group's store listens, and its size."""

    def __init__(self, addr: str, port: int, world_size: int) -> None:
        self.where = {"addr": addr, "port": port, "world_size": world_size}

    @handles("rendezvous")
    def rendezvous(self, _: object) -> dict[str, object]:
        return dict(self.where)


async def publish_rendezvous(runtime: Runtime, name: str, rdv: Rendezvous) -> None:
    """Publish rank 0's ``rdv`` as the :class:`RendezvousActor` ``name`` in ``runtime``.

    An actor ``name`` of an earlier run of this process answers the new address from now on. In a
    node's worker the actor is started through the worker's own ``spawn`` control, so the node
    names it in its directory and the other ranks' processes find it (``runtime.spawn`` alone
    stays known to this process only); elsewhere (a runtime of its own) ``runtime.spawn`` does.

    Raises ValueError when ``name`` is taken by an actor that is no rendezvous.
    """
    where = {"addr": rdv.addr, "port": rdv.port, "world_size": rdv.world_size}
    cell = runtime.cells.get(name)
    if cell is not None:
        if not isinstance(cell.actor, RendezvousActor):
            raise ValueError(f"rendezvous name {name!r} is taken by a {type(cell.actor).__name__}")
        cell.actor.where = where
        return
    spawn = runtime.control_handlers.get("spawn")
    if spawn is not None:
        await spawn({"name": name, "class": RENDEZVOUS_CLASS, "kwargs": where})
    else:
        await runtime.spawn(RendezvousActor(rdv.addr, rdv.port, rdv.world_size), name)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


async def rendezvous_from(
    runtime: Runtime,
    name: str,
    rank: int,
    world_size: int,
    *,
    host: str = "127.0.0.1",
    local_rank: int = 0,
    timeout_s: float = 300.0,
    poll_s: float = 0.2,
) -> Rendezvous:
    """The rendezvous of ``rank`` through troupe's directory (then call :func:`init_ranks`).

    Rank 0 picks a free port on ``host`` (an address the other ranks reach) and publishes it as a
    :class:`RendezvousActor` named ``name`` (:func:`publish_rendezvous`); every other rank asks
    ``name`` until it answers or ``timeout_s`` passes (TimeoutError). A published world size
    other than ``world_size`` is a ValueError.
    """
    if rank == 0:
        rdv = Rendezvous(host, _free_port(host), 0, world_size, local_rank)
        await publish_rendezvous(runtime, name, rdv)
        return rdv
    Rendezvous(host, 1, rank, world_size, local_rank)  # check the arguments before waiting
    ref = runtime.ref(name)
    attempts = max(1, math.ceil(timeout_s / poll_s))
    for _ in range(attempts):
        try:
            where = await ref.ask("rendezvous", None, timeout=max(poll_s, 1.0))
        except _NOT_YET:
            await anyio.sleep(poll_s)
            continue
        if where["world_size"] != world_size:
            raise ValueError(
                f"rendezvous_from world_size={world_size}: rank 0 of {name!r} published {where['world_size']}"
            )
        return Rendezvous(str(where["addr"]), int(where["port"]), rank, world_size, local_rank)
    raise TimeoutError(f"rendezvous_from: no answer from {name!r} within {timeout_s} s")
