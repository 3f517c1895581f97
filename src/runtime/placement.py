"""Placement of replicas on the cluster's hosts by the resource tags they declare.

A node says what it offers in its config (``[node] tags = ["encoder", "gpu-small"]``) and its
beats (its CPUs and GPUs); a replica says what it needs (``tags = ["encoder"]``, ``gpus = 1``,
a stage's ``cpu = 4``). A host fits a replica when it carries every tag the replica names and at
least the CPUs and GPUs it asks for. Neither is reserved: a node with 8 CPUs fits any number of
replicas that need 4, one at a time (a run's scaler and slots bound how many). Replicas are spread
round-robin over the hosts that fit, in the order the hosts are given, so ``count`` replicas on
``n`` fitting hosts land ``ceil(count / n)`` or ``floor(count / n)`` on each.

A one-host cluster started by ``troupe run`` carries every tag (:meth:`Host.anything`): a config
written for a cluster runs unchanged on a laptop. On a cluster, :func:`cluster_hosts` asks the
master for its live nodes (each node tells its tags and GPUs in every beat).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from troupe.runtime.errors import AskTimeout, ConfigError, PeerLost, Unreachable
from troupe.runtime.security.process import installed

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime

__all__ = [
    "Host",
    "cluster_hosts",
    "cluster_status",
    "draining_fits",
    "fits",
    "hosts_of_status",
    "nodes_of_status",
    "nothing_fits",
    "place",
]


@dataclass(frozen=True)
class Host:
    """A node replicas can be started on.

    Attributes:
        name: the node's name.
        endpoint: its control endpoint (where ``spawn_worker`` goes).
        tags: what it offers; None: everything (the one-host cluster).
        gpus: its GPUs.
        draining: drained (``troupe ctl drain``): it runs what it runs, and takes nothing new.
        cpus: its CPUs; None: not said (the one-host cluster, a node older than its beat's
            count), which fits any CPU need.
    """

    name: str
    endpoint: str
    tags: frozenset[str] | None = field(default=frozenset())
    gpus: int = 0
    draining: bool = False
    cpus: int | None = None

    @classmethod
    def anything(cls, name: str, endpoint: str, gpus: int = 0) -> Host:
        """A host that carries every tag: the node of a one-host run."""
        return cls(name, endpoint, None, gpus)


def fits(host: Host, tags: Iterable[str] = (), gpus: int = 0, cpus: float = 0) -> bool:
    """Whether ``host`` may take a new replica that needs ``tags``, ``gpus`` and ``cpus``: it
    carries every tag and at least that many GPUs and CPUs, and it is not draining."""
    wanted = frozenset(tags)
    enough_cpus = host.cpus is None or host.cpus >= cpus
    return (
        not host.draining and host.gpus >= gpus and enough_cpus and (host.tags is None or wanted <= host.tags)
    )


def place(
    count: int,
    hosts: Sequence[Host],
    tags: Iterable[str] = (),
    gpus: int = 0,
    what: str = "replica",
    cpus: float = 0,
) -> list[Host]:
    """The host of each of ``count`` replicas that need ``tags``, ``gpus`` and ``cpus``, round-robin.

    Raises:
        ConfigError: no host fits (names what was asked and what each host offers).
    """
    candidates = [h for h in hosts if fits(h, tags, gpus, cpus)]
    if count <= 0:
        return []
    if not candidates:
        raise nothing_fits(what, hosts, tags, gpus, cpus)
    return [candidates[i % len(candidates)] for i in range(count)]


def draining_fits(
    hosts: Sequence[Host], tags: Iterable[str] = (), gpus: int = 0, cpus: float = 0
) -> list[str]:
    """The names of the draining ``hosts`` that would fit but for their drain."""
    wanted = list(tags)
    return [h.name for h in hosts if h.draining and fits(replace(h, draining=False), wanted, gpus, cpus)]


def nothing_fits(
    what: str, hosts: Sequence[Host], tags: Iterable[str], gpus: int, cpus: float = 0
) -> ConfigError:
    """The error for ``what``, which needs ``tags``, ``gpus`` and ``cpus`` that none of ``hosts`` offers."""
    offered = ", ".join(
        f"{h.name} (tags {sorted(h.tags) if h.tags is not None else 'any'}, gpus {h.gpus}"
        f"{'' if h.cpus is None else f', cpus {h.cpus}'}"
        f"{', draining: troupe ctl undrain ' + h.name if h.draining else ''})"
        for h in hosts
    )
    draining = draining_fits(hosts, tags, gpus, cpus)
    if draining:  # they fit but for their drain: not a question of tags
        return ConfigError(
            f"{what}: every node that could take it is draining ({', '.join(draining)}: "
            f"troupe ctl undrain NODE); the cluster offers: {offered}"
        )
    # A CPU or less is said by no one: every node has one.
    needs = f"{gpus} GPU(s)" if cpus <= 1 else f"{gpus} GPU(s) and {cpus:g} CPU(s)"
    return ConfigError(
        f"{what}: no node has tags {sorted(set(tags))}{' and' if cpus <= 1 else ','} {needs}; "
        f"the cluster offers: {offered or 'no nodes'}"
    )


async def cluster_hosts(runtime: Runtime, master: str, timeout: float = 5.0) -> list[Host]:
    """The master's live nodes as hosts, sorted by name (see :func:`hosts_of_status`).

    Args:
        runtime: a running runtime to ask from (its keys, if any, are those the cluster takes).
        master: the master's endpoint.
        timeout: seconds to wait for the master's answer.

    Raises:
        Unreachable: the master did not answer in time, or nothing listens at ``master``; the
            message names the endpoint.
    """
    return hosts_of_status(await cluster_status(runtime, master, timeout))


async def cluster_status(runtime: Runtime, master: str, timeout: float = 5.0) -> Any:
    """The master's ``status`` reply (see :func:`cluster_hosts` for the arguments and errors)."""
    try:
        status = await runtime.control(master, "status", None, timeout=timeout)
    except PeerLost as exc:
        raise Unreachable(
            f"the master at {master} went away before it answered (it stopped or died); start it "
            "again with `troupe master start` or pass the endpoint of the running one"
        ) from exc
    except Unreachable as exc:  # the transport's words: a handshake refused for keys, or no route
        raise Unreachable(f"the master at {master} cannot be asked: {_unprefixed(exc)}") from exc
    except AskTimeout as exc:
        raise Unreachable(
            f"no master answered at {master} within {timeout:g}s ({type(exc).__name__}); start one with "
            f"`troupe master start` or pass the endpoint of the running one {_keys_hint()}"
        ) from exc
    if not (isinstance(status, dict) and "master" in status):  # a node's status has no master name
        raise ConfigError(
            f"{master} answered, but not as a master (a node? --master takes the master's endpoint)"
        )
    return status


def _unprefixed(exc: Unreachable) -> str:
    """The transport's reason without the ask it failed (``ask 'status' to E: ...``)."""
    said = str(exc)
    return said.split(": ", 1)[1] if said.startswith("ask ") and ": " in said else said


def _keys_hint() -> str:
    """CURVE on one side only is silence, not a refusal: which side this process is on."""
    if installed() is not None:
        return "(with --keys, a master started without keys answers nothing: drop --keys there)"
    return "(a master with CURVE keys answers only --keys DIR of its cluster)"


def nodes_of_status(status: Any) -> frozenset[str]:
    """Every node a master's ``status`` reply lists, alive or dead: one it does not list, it has
    not heard from (since it started: a master that restarted knows no node until they beat)."""
    nodes = status.get("nodes") if isinstance(status, dict) else None
    listed = (n.get("node") for n in nodes if isinstance(n, dict)) if isinstance(nodes, list) else ()
    return frozenset(str(name) for name in listed if name)


def hosts_of_status(status: Any) -> list[Host]:
    """The live nodes of a master's ``status`` reply as hosts, sorted by name.

    Each host is named as its node, reached at the control endpoint its beats advertise (what
    other hosts reach it at), with the tags, the GPUs and the CPUs it reported; a node without
    tags (an older one) offers none, one that said no CPU count fits any CPU need. Dead nodes
    are left out.
    """
    nodes = status.get("nodes") if isinstance(status, dict) else None
    hosts = []
    for n in nodes if isinstance(nodes, list) else []:
        if not isinstance(n, dict) or not n.get("alive") or not n.get("endpoint"):
            continue
        resources = n.get("resources")
        gpus = resources.get("gpus", 0) if isinstance(resources, dict) else 0
        cpus = resources.get("cpus") if isinstance(resources, dict) else None
        tags = n.get("tags")
        hosts.append(
            Host(
                str(n["node"]),
                str(n["endpoint"]),
                frozenset(map(str, tags)) if isinstance(tags, list) else frozenset(),
                gpus if type(gpus) is int and gpus > 0 else 0,
                n.get("draining") is True,
                cpus if type(cpus) is int and cpus > 0 else None,
            )
        )
    return sorted(hosts, key=lambda h: h.name)
