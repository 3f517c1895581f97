"""Where the engine starts a stage's replicas: one node, or the live nodes of a master's cluster.

A run on one node (the node ``troupe run`` starts, or ``--node``) has one host that carries every
tag. A run on a cluster (``troupe run --cluster MASTER``) asks the master for its live nodes
(:func:`~troupe.runtime.placement.cluster_hosts`) when it starts and every ``refresh_s`` after:
a node the master has as dead (it stopped beating, or stopped) leaves the list, and the engine
then treats the replicas it ran as lost; a node that joins is used for the next replicas
started. A node the master does not list at all has not beaten since the master (re)started:
it stays for ``unheard_s``, the time a live node's beat takes to reach a master back up, and
leaves only if it is still unheard of then (dropped at once, a restart of the master cost a
run the replicas of every node, and failed it when a replica had to start meanwhile).

Each new replica goes to the node, among those that fit the stage's resources (tags, GPUs, CPUs),
that runs the fewest replicas of that stage, then the fewest in all: a stage's replicas spread
over the nodes before any node gets a second one.

On a cluster, a node that said it stops (``spawn_worker`` answered ActorStopped, or its
connection ended under one) gets no replica while the master still lists it (it beats until its
stop is done, and is declared dead only its node timeout later): the node it goes to is another,
or none (:class:`NoNodeNow`). It gets replicas again once the master has dropped it and lists it
again (a node that comes back joins anew), or hears it beat ``_STOPPING_S`` after it said it stops (it
was restarted within the master's node timeout).
"""

from __future__ import annotations

import shlex
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ConfigError, TroupeError
from troupe.runtime.placement import (
    Host,
    cluster_hosts,
    cluster_status,
    draining_fits,
    fits,
    hosts_of_status,
    nodes_of_status,
    nothing_fits,
)
from troupe.runtime.security.process import installed

__all__ = ["EngineHosts", "NoNodeNow", "wait_for_nodes"]

_STOPPING_S = 10.0  # a node's stop takes its workers' grace (5 s by default); it beats meanwhile


class EngineHosts:
    """The nodes replicas may run on, and how many each runs.

    Args:
        hosts: the nodes to start with.
        master: the master to ask for live nodes again (a cluster run); None: ``hosts`` is fixed.
        runtime: the runtime to ask the master from.
        refresh_s: how often a cluster run asks.
        unheard_s: how long a node the master does not list at all is kept (see the module).
    """

    def __init__(
        self,
        hosts: Sequence[Host],
        master: str | None = None,
        runtime: Runtime | None = None,
        refresh_s: float = 1.0,
        unheard_s: float = 10.0,
    ) -> None:
        self.hosts = list(hosts)
        self.master = master
        self.runtime = runtime
        self.refresh_s = refresh_s
        self.unheard_s = unheard_s
        self._fitted: set[tuple[tuple[str, ...], int, float]] = set()  # what some node offered in this run
        self._unheard_since: dict[str, float] = {}  # node name -> when the master first did not list it
        self.changed = anyio.Event()  # set when a node leaves (or comes back)
        self._stage_load: dict[str, Counter[str]] = {}
        self._load: Counter[str] = Counter()
        self._avoid: dict[str, float] = {}  # node name -> until when (monotonic) it gets no replica
        self._stopping: dict[str, float] = {}  # node name -> when (monotonic) it said it stops
        self._gone_as: dict[str, str] = {}  # node name -> how the master has it, once it left the list

    @property
    def alive(self) -> frozenset[str]:
        """The names of the nodes that may run replicas now."""
        return frozenset(h.name for h in self.hosts)

    def pick(self, stage: str, tags: Sequence[str] = (), gpus: int = 0, cpus: float = 0) -> Host:
        """The node for a new replica of ``stage`` (counted as running there from now on).

        Raises:
            ConfigError: no live node fits (names what was asked and what the nodes offer).
        """
        live = [h for h in self.hosts if h.name not in self._stopping]
        fitting = [h for h in live if fits(h, tags, gpus, cpus)]
        wanted = (tuple(sorted(set(tags))), gpus, cpus)
        if not fitting:
            refusal = nothing_fits(f"stages.{stage}", live, tags, gpus, cpus)
            # A node offered them in this run (it died, stops or drains), or one that stops does.
            if wanted in self._fitted or any(fits(h, tags, gpus, cpus) for h in self.hosts):
                gone = "" if draining_fits(live, tags, gpus, cpus) else _GONE  # else undrain
                raise NoNodeNow(f"{refusal}{gone}: {_AGAIN}")
            raise refusal
        self._fitted.add(wanted)
        now = time.monotonic()
        # A node that just failed to start one is skipped while another fits (one that
        # stops gracefully stays in the master's list until its last beat).
        fitting = [h for h in fitting if self._avoid.get(h.name, 0.0) <= now] or fitting
        per_stage = self._stage_load.setdefault(stage, Counter())
        host = min(fitting, key=lambda h: (per_stage[h.name], self._load[h.name]))
        per_stage[host.name] += 1
        self._load[host.name] += 1
        return host

    def avoid(self, host: Host, for_s: float) -> None:
        """Start no replica on ``host`` for ``for_s`` seconds while another node fits."""
        self._avoid[host.name] = time.monotonic() + for_s

    def stopping(self, host: Host) -> None:
        """``host`` said it stops (or its connection ended under a spawn): it gets no replica
        until the master lists it again after dropping it, or hears it beat ``_STOPPING_S``
        later (see the module). Avoided only (:meth:`avoid`), it was tried again as the only
        node that fit, dead by then, and that spawn waited out its whole deadline. A fixed list
        (no master) has nobody to say that the node is back: its node is tried again, as before."""
        if self.master is not None:
            self._stopping[host.name] = time.monotonic()

    async def left(self, host: Host) -> str:
        """Return, once ``host`` is no longer among the live nodes, how the master has it:
        ``stopped`` (it said it stops: ``node_left``), ``dead`` (it went silent), or that it
        does not list it (not heard since the master restarted)."""
        while host.name in self.alive:
            await self.changed.wait()
        return self._gone_as.get(host.name, _UNLISTED)

    def gone(self, stage: str, host: Host) -> None:
        """A replica of ``stage`` on ``host`` stopped (or never started)."""
        per_stage = self._stage_load.setdefault(stage, Counter())
        per_stage[host.name] = max(0, per_stage[host.name] - 1)
        self._load[host.name] = max(0, self._load[host.name] - 1)

    async def watch(self) -> None:
        """Keep the list of live nodes fresh (a cluster run; returns at once otherwise)."""
        if self.master is None or self.runtime is None:
            return
        while True:
            await anyio.sleep(self.refresh_s)
            try:
                status = await cluster_status(self.runtime, self.master, timeout=max(5.0, self.refresh_s))
            except TroupeError:  # the master is busy or restarting: keep the last list
                continue
            hosts = self._with_unheard(hosts_of_status(status), nodes_of_status(status))
            self._gone_as = _gone_as(status)
            self._still_stopping(hosts, _beat_ages(status))
            if {h.name for h in hosts} != self.alive:
                self.hosts = hosts
                self.changed.set()
                self.changed = anyio.Event()
            else:
                self.hosts = hosts

    def _with_unheard(self, live: list[Host], listed: frozenset[str]) -> list[Host]:
        """``live`` and the hosts of this list that the master does not list at all, while it
        has not listed them for less than ``unheard_s``."""
        now = time.monotonic()
        for name in listed:
            self._unheard_since.pop(name, None)
        kept = [
            h
            for h in self.hosts
            if h.name not in listed and now - self._unheard_since.setdefault(h.name, now) < self.unheard_s
        ]
        return sorted(live + kept, key=lambda h: h.name)

    def _still_stopping(self, hosts: list[Host], ages: dict[str, float]) -> None:
        """Forget that a node said it stops once it left ``hosts`` (its return is a join), or
        once its last beat (``ages``: seconds ago, by node) came ``_STOPPING_S`` after it said so."""
        now = time.monotonic()
        listed = {h.name for h in hosts}
        for name, since in list(self._stopping.items()):
            age = ages.get(name)
            if name not in listed or (age is not None and now - age > since + _STOPPING_S):
                del self._stopping[name]


def _gone_as(status: Any) -> dict[str, str]:
    """How the master has each node it lists as not alive (``stopped``, ``dead``), by name."""
    nodes = status.get("nodes") if isinstance(status, dict) else None
    listed = [n for n in nodes if isinstance(n, dict) and n.get("node")] if isinstance(nodes, list) else []
    return {str(n["node"]): "stopped" if n.get("left") else "dead" for n in listed if not n.get("alive")}


_UNLISTED = "not listed (not heard from since the master started)"


def _beat_ages(status: Any) -> dict[str, float]:
    """How long ago the master heard each node it lists (``last_beat_age_s``), by name."""
    nodes = status.get("nodes") if isinstance(status, dict) else None
    listed = nodes if isinstance(nodes, list) else []
    return {
        str(n["node"]): float(n["last_beat_age_s"])
        for n in listed
        if isinstance(n, dict) and n.get("node") and type(n.get("last_beat_age_s")) in (int, float)
    }


_GONE = "; the node that offered them is gone (start it again, or another that offers them)"
_AGAIN = "the run tries again meanwhile, and the same command resumes what it did"


def given_up(said: str, tries: int) -> str:
    """A :class:`NoNodeNow`'s line as the run's last: it tries nothing again once it has ended
    (its retries' "the run tries again meanwhile" was said as the final error: report i14 3)."""
    what = said.removesuffix(f": {_AGAIN}")
    return (
        f"{what}: the run gave up after {tries} tries; start a node that offers them, then the "
        "same command again resumes what it did"
    )


class NoNodeNow(ConfigError):
    """No live node offers what a stage asks, though one did earlier in the run (it died): a
    start that may pass, once a node that offers it is back."""

    code = "no_node_now"  # its own: a ConfigError from a peer must not come back as this one


async def wait_for_nodes(
    runtime: Runtime, master: str, count: int, timeout_s: float = 60.0, keyed: bool = False
) -> list[Host]:
    """The master's live nodes, once at least ``count`` are alive. ``keyed``: the run was given
    keys (the node command it suggests takes them too, as where this process installed some).

    Raises:
        ConfigError: fewer than ``count`` nodes are alive after ``timeout_s`` (names them).
    """
    hosts = await cluster_hosts(runtime, master)
    with anyio.move_on_after(timeout_s):
        while len(hosts) < count:
            await anyio.sleep(0.2)
            hosts = await cluster_hosts(runtime, master)
    if len(hosts) < max(count, 1):
        names = ", ".join(h.name for h in hosts) or "none"
        raise ConfigError(
            f"--nodes {count}: {len(hosts)} node(s) alive on the master at {master} after "
            f"{timeout_s:g}s ({names}); start them with `troupe node start --master {shlex.quote(master)}"
            f"{' --keys DIR' if keyed or installed() is not None else ''}`"
        )
    return hosts
