"""The node's Prometheus collector: its workers, their mailboxes, supervision, bad input, and the
pipeline driven beside it.

Read on each scrape from the node itself (worker handles, its runtime's counters, its transport's
refusals, the pipeline's figures). What only another process knows is fetched once per scrape
by :meth:`NodeCollector.refresh`, before the scrape is rendered: each running worker's
``status`` (its actors' mailboxes and counters, its bad frames) and the supervisor's counts
(kills by reason, heartbeats), each with a short timeout, concurrently; a worker that does not
answer in time shows ``troupe_worker_answered 0`` and no mailbox figures for that scrape.

The one count kept here is exits by reason (``troupe_worker_exits_total``): the node tells
why a worker exited (to its ``worker_exit_listeners``) but counts only restarts, not causes.
Every metric is described in docs/METRICS.md.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import psutil

from troupe.runtime.library_logging import get_logger

from .actor_metrics import actor_metric_families
from .families import Families, Family, number, reason_label
from .pipeline_metrics import pipeline_families
from .security_metrics import security_families

if TYPE_CHECKING:
    from troupe.runtime.node.worker_handles import WorkerHandle

    from .ports import MeteredNode

__all__ = ["WORKER_STATES", "NodeCollector"]

log = get_logger(__name__)

_WORKER_STATUS_S = 1.0  # a worker slower than this to say its counts is reported as not answering

# A worker handle's states (node/worker_handles.py, HandleState), each listed for every kind, 0
# included: a series that vanished when its last worker left the state never read 0, so an
# alert on ``troupe_workers{state="failed"} > 0`` or a panel of running workers broke.
WORKER_STATES = ("starting", "running", "stopping", "stopped", "exited", "failed")

# Runtime counters (RuntimeStats and what the limits and CURVE work add to it), by metric.
_RUNTIME_COUNTERS = {
    "bad_frames": ("troupe_bad_frames_total", "Frames received that failed validation and were dropped."),
    "errors_suppressed": (
        "troupe_error_replies_suppressed_total",
        "Bad frames left unanswered beyond the sending peer's allowance.",
    ),
    "replies_dropped": (
        "troupe_replies_dropped_total",
        "Replies dropped because the asker's connection would not take them.",
    ),
    "late_replies": ("troupe_late_replies_total", "Replies that came after their ask had timed out."),
    # The throttle of peers that send bad frames (core/throttle.py).
    "throttles": ("troupe_peer_throttles_total", "Times a peer was throttled for sending bad frames."),
    "dropped_from_throttled": (
        "troupe_throttled_messages_dropped_total",
        "Messages dropped unread because their peer was throttled.",
    ),
}


@dataclass
class _Sample:
    """What the last refresh fetched from the other processes of the node."""

    workers: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # None: did not answer
    supervision: dict[str, Any] | None = None


class NodeCollector:
    """Collects a node's metrics (a prometheus-client custom collector).

    Args:
        node: the node, read on each scrape.
    """

    def __init__(self, node: MeteredNode) -> None:
        self._node = node
        self._sample = _Sample()
        self._exits: Counter[tuple[str, str, str]] = Counter()  # (worker, kind, reason) -> exits
        node.worker_exit_listeners.append(self._worker_exited)

    def _worker_exited(self, handle: WorkerHandle, reason: str) -> None:
        if handle.state.value == "stopped":  # stopped on purpose: no failure, nothing to count
            return
        self._exits[handle.spec.name, handle.spec.kind, reason_label(reason)] += 1

    async def refresh(self) -> None:
        """Fetch what the node's other processes know: workers' status, supervisor's counts."""
        runtime = self._node.runtime
        workers: dict[str, dict[str, Any] | None] = {}
        supervision: list[dict[str, Any] | None] = [None]

        async def ask_worker(name: str, endpoint: str) -> None:
            assert runtime is not None
            try:
                reply = await runtime.control(endpoint, "status", timeout=_WORKER_STATUS_S)
            except Exception:  # hung, restarting or gone: reported as not answering
                reply = None
            workers[name] = reply if isinstance(reply, dict) else None

        async def ask_supervision() -> None:
            try:
                supervision[0] = await self._node.supervision.describe()
            except Exception as exc:
                log.info("metrics_supervision_unread", error=repr(exc))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask_supervision)
            if runtime is not None:
                for name, handle in list(self._node.workers.items()):
                    if handle.state.value == "running" and handle.endpoint:
                        tg.start_soon(ask_worker, name, handle.endpoint)
        self._sample = _Sample(workers, supervision[0])

    def collect(self) -> Iterator[Family]:
        """The node's metric families, from its state now and the last refresh."""
        node = self._node
        f = Families({"node": node.name})
        f.gauge("troupe_node_uptime_seconds", "Seconds since the node started.", node.uptime_s)
        self._workers(f)
        self._processes(f)
        self._supervision(f)
        security_families(f, bool(getattr(getattr(node, "config", None), "insecure", False)))
        extra = node.status_extras.get("pipeline")
        if extra is not None:
            try:
                pipeline_families(f, extra())
            except Exception as exc:  # a pipeline between runs: its figures wait for the next scrape
                log.info("metrics_pipeline_unread", error=repr(exc))
        yield from f.all()

    def _workers(self, f: Families) -> None:
        handles = list(self._node.workers.values())
        f.declare("gauge", "troupe_workers_alive", "Worker processes alive, by kind.", ["kind"])
        alive: Counter[str] = Counter()
        states: Counter[tuple[str, str]] = Counter()
        for kind in {h.spec.kind for h in handles}:
            states.update({(kind, state): 0 for state in WORKER_STATES})
        for h in handles:
            states[h.spec.kind, h.state.value] += 1
            if h.process is not None and h.returncode is None:
                alive[h.spec.kind] += 1
            else:
                alive[h.spec.kind] += 0
        for kind, n in sorted(alive.items()):
            f.gauge("troupe_workers_alive", "Worker processes alive, by kind.", n, {"kind": kind})
        f.declare("gauge", "troupe_workers", "Worker slots by kind and state.", ["kind", "state"])
        for (kind, state), n in sorted(states.items()):
            f.gauge("troupe_workers", "Worker slots by kind and state.", n, {"kind": kind, "state": state})
        f.declare("counter", "troupe_worker_restarts_total", "Restarts of each worker.", ["worker", "kind"])
        # The node's count, not the handle's: an undrain replaces a handle with one at 0.
        restarts = Counter({(h.spec.name, h.spec.kind): 0 for h in handles})
        restarts.update(self._node.supervision.worker_restarts)
        for (worker, kind), n in sorted(restarts.items()):
            labels = {"worker": worker, "kind": kind}
            f.counter("troupe_worker_restarts_total", "Restarts of each worker.", n, labels)
        for h in handles:
            labels = {"worker": h.spec.name, "kind": h.spec.kind}
            rss = _rss_bytes(h.pid) if h.process is not None and h.returncode is None else 0
            f.gauge("troupe_worker_memory_rss_bytes", "Resident memory of each worker process.", rss, labels)
        f.declare(
            "counter",
            "troupe_worker_exits_total",
            "Worker exits not asked for, by cause (kills included).",
            ["worker", "kind", "reason"],
        )
        for (worker, kind, reason), n in sorted(self._exits.items()):
            f.counter(
                "troupe_worker_exits_total",
                "Worker exits not asked for, by cause (kills included).",
                n,
                {"worker": worker, "kind": kind, "reason": reason},
            )

    def _processes(self, f: Families) -> None:
        """Mailboxes and input counters of the node's own process and of each worker."""
        runtime = self._node.runtime
        if runtime is not None:
            _runtime_families(f, "node", _stats_dict(runtime.statistics()))
            _refused_families(f, runtime.transport)
        for name, reply in sorted(self._sample.workers.items()):
            f.gauge(
                "troupe_worker_answered",
                "Whether the worker answered the last scrape's status request in time.",
                1 if reply is not None else 0,
                {"worker": name},
            )
            if reply is not None:
                _runtime_families(f, name, reply)
                actor_metric_families(f, name, reply)

    def _supervision(self, f: Families) -> None:
        sup = self._node.supervision
        f.counter("troupe_supervisor_starts_total", "Supervisor processes started.", sup.starts)
        info = self._sample.supervision or {}
        status = info.get("supervisor")
        f.gauge(
            "troupe_supervisor_up",
            "Whether the supervisor answered the last scrape.",
            1 if isinstance(status, dict) else 0,
        )
        if not isinstance(status, dict):
            return
        f.declare("counter", "troupe_supervisor_kills_total", "Workers the supervisor killed.", ["reason"])
        kills = status.get("kills_by_reason") or {}
        for reason, n in sorted(kills.items()):
            f.counter(
                "troupe_supervisor_kills_total",
                "Workers the supervisor killed.",
                float(n),
                {"reason": reason_label(str(reason))},
            )
        for key, name, doc in (
            ("beats_received", "troupe_heartbeats_received_total", "Heartbeats the supervisor received."),
            ("beats_dropped", "troupe_heartbeats_bad_total", "Heartbeat datagrams that failed validation."),
            ("ignored_beats", "troupe_heartbeats_ignored_total", "Heartbeats from a stale or unwatched pid."),
        ):
            value = number(status, key)
            if value is not None:
                f.counter(name, doc, value)
        for worker, w in sorted((status.get("workers") or {}).items()):
            age = number(w, "last_beat_age_s")
            if age is not None:
                f.gauge(
                    "troupe_worker_heartbeat_age_seconds",
                    "Seconds since the worker's last heartbeat reached the supervisor.",
                    age,
                    {"worker": str(worker)},
                )


def _stats_dict(stats: Any) -> dict[str, Any]:
    """A runtime's statistics (a dataclass) as the plain map a worker's ``status`` replies."""
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return dataclasses.asdict(stats)
    return dict(stats) if isinstance(stats, dict) else {}


def _runtime_families(f: Families, process: str, stats: dict[str, Any]) -> None:
    """One process's mailboxes, actor counters, pending asks and bad-input counters."""
    p = {"process": process}
    for key, (name, doc) in _RUNTIME_COUNTERS.items():
        value = number(stats, key)
        if value is not None:
            f.counter(name, doc, value, p)
    for key, name, doc in (
        ("pending_asks", "troupe_pending_asks", "Asks waiting for their reply."),
        ("throttled_peers", "troupe_throttled_peers", "Peers throttled now for sending bad frames."),
    ):
        value = number(stats, key)
        if value is not None:
            f.gauge(name, doc, value, p)
    for actor, a in sorted((stats.get("actors") or {}).items()):
        labels = {"process": process, "actor": str(actor)}
        for key, kind, name, doc in (
            ("mailbox_depth", "gauge", "troupe_mailbox_depth", "Messages waiting in the actor's mailbox."),
            ("mailbox_capacity", "gauge", "troupe_mailbox_capacity", "The bound of the actor's mailbox."),
            ("handled", "counter", "troupe_actor_messages_handled_total", "Messages the actor handled."),
            ("failed", "counter", "troupe_actor_messages_failed_total", "Messages whose handler raised."),
        ):
            value = number(a, key)
            if value is None:
                continue
            if kind == "gauge":
                f.gauge(name, doc, value, labels)
            else:
                f.counter(name, doc, value, labels)


def _refused_families(f: Families, transport: Any) -> None:
    """Messages refused per peer (fault injection's partitions), from the node's transport."""
    refused = getattr(transport, "refused_counts", None)
    if callable(refused):
        refused = refused()
    for peer, n in sorted((refused or {}).items()):
        f.counter(
            "troupe_refused_messages_total",
            "Messages refused per peer (partitioned by fault injection, or refused peers).",
            float(n),
            {"peer": str(peer)},
        )


def _rss_bytes(pid: int | None) -> int:
    if not pid:
        return 0
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0
