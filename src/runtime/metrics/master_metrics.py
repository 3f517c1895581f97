"""The master's Prometheus collector: tasks by job and state, leases, dispatches, lease expiries,
nodes alive and dead, registered workers, the driver's journal writes and the journal's size.

Everything is read from the master on each scrape (its task book, driver, node table, workers
and the two counters it keeps for this: ``dispatched`` and ``lease_expiries``); nothing is
fetched from elsewhere. Every metric is described in docs/METRICS.md.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .families import Families, Family
from .security_metrics import security_families

if TYPE_CHECKING:
    from .ports import MeteredMaster

__all__ = ["JOB_STATES", "MasterCollector"]

# A job's states (tasks/state.py, JobState), each listed, 0 included: a state no job was in had
# no series, so ``troupe_jobs{state="running"} == 0`` never fired.
JOB_STATES = ("running", "done", "failed", "cancelled")


class MasterCollector:
    """Collects a master's metrics (a prometheus-client custom collector).

    Args:
        master: the master, read on each scrape (node beat ages in its own clock).
        security: add the process's CURVE families (``troupe_curve_enabled``, ...); False for
            a master served beside a node in its process (``node start --with-master``), whose
            collector adds them already: one family twice in a scrape is invalid exposition,
            which strict parsers (promtool, the Pushgateway) reject whole.
    """

    def __init__(self, master: MeteredMaster, security: bool = True) -> None:
        self._master = master
        self._security = security

    async def refresh(self) -> None:
        """Nothing to fetch: the master's state is all in this process."""

    def collect(self) -> Iterator[Family]:
        """The master's metric families, from its state now."""
        m = self._master
        f = Families({"master": m.config.name})
        stats = m.book.statistics()
        f.declare("gauge", "troupe_tasks", "Tasks by job and state.", ["job", "state"])
        for job, counts in sorted(stats.jobs.items()):
            for state, n in sorted((str(s), n) for s, n in counts.items()):
                f.gauge("troupe_tasks", "Tasks by job and state.", n, {"job": job, "state": state})
        jobs = Counter(dict.fromkeys(JOB_STATES, 0))
        jobs.update(str(j.state) for j in m.book.jobs())
        f.declare("gauge", "troupe_jobs", "Jobs by state.", ["state"])
        for state, n in sorted(jobs.items()):
            f.gauge("troupe_jobs", "Jobs by state.", n, {"state": state})
        f.gauge("troupe_leases_outstanding", "Task copies leased and running now.", stats.leases_outstanding)
        f.counter("troupe_dispatches_total", "Leases granted to workers.", m.dispatched)
        f.counter("troupe_lease_expiries_total", "Leases that ran out without a renewal.", m.lease_expiries)
        f.counter(
            "troupe_speculative_launched_total",
            "Backup copies started for tail tasks.",
            stats.speculative_launched,
        )
        f.counter("troupe_speculative_won_total", "Backup copies that finished first.", stats.speculative_won)
        f.gauge(
            "troupe_tasks_done_per_second",
            "Tasks done per second over the throughput window.",
            m.ops.done_per_s(),
        )
        self._nodes(f)
        self._driver(f)
        if self._security:
            security_families(f, bool(getattr(m.config, "insecure", False)))
        yield from f.all()

    def _nodes(self, f: Families) -> None:
        m = self._master
        now = m.clock()
        alive = Counter({"alive": 0, "dead": 0, "left": 0})
        for info in m.nodes.nodes():
            alive["alive" if info.alive else "left" if info.left else "dead"] += 1
            f.gauge(
                "troupe_node_last_beat_age_seconds",
                "Seconds since the node's last beat reached the master.",
                max(0.0, now - info.last_beat),
                {"node": info.node},
            )
        for state, count in sorted(alive.items()):
            f.gauge("troupe_nodes", "Nodes that joined: alive, dead or left.", count, {"state": state})
        per_node: Counter[str] = Counter()
        for w in m.workers().values():
            per_node[str(w.get("node", ""))] += 1
        f.declare("gauge", "troupe_workers_registered", "Task workers registered, by node.", ["node"])
        for node, count in sorted(per_node.items()):
            f.gauge("troupe_workers_registered", "Task workers registered, by node.", count, {"node": node})

    def _driver(self, f: Families) -> None:
        m = self._master
        d = m.dispatcher.statistics()
        f.counter("troupe_master_events_total", "Events the task book handled.", d.events)
        f.counter("troupe_journal_batches_total", "Journal transactions written.", d.batches)
        f.counter("troupe_journal_records_total", "Journal records written.", d.records)
        f.counter("troupe_journal_append_seconds_total", "Seconds spent writing the journal.", d.append_s)
        f.gauge("troupe_parked_requests", "Workers' task requests waiting for a task (long polls).", d.parked)
        size = 0
        for suffix in ("", "-wal"):  # SQLite in WAL mode: the log holds what is not checkpointed
            try:
                size += os.stat(f"{m.journal.path}{suffix}").st_size
            except OSError:
                pass
        f.gauge("troupe_journal_size_bytes", "Bytes of the journal on disk (with its write-ahead log).", size)
