"""The pipeline's bookkeeping, pure: stage meters (the throughput model) and the scaler.

Throughput model (Nimbus): each stage s has a latency per item ``l_s``, a mean concurrency
``N_s`` (replicas, averaged over the time the stage was active) and so a throughput
``mu_s = N_s / l_s``. The pipeline can go no faster than its slowest stage:
``lambda_theory = min(mu_s)``. ``lambda`` is what was measured (items out of the pipeline per
second), ``lambda_succ`` counts only successful items. Time is always passed in.

``l_s`` is the engine's view: per item, from the moment a replica could start the item (its
call arrived, or its previous call ended, whichever is later) to the reply. ``actor_s`` is the
time the same items spent inside the stage's code; the gap between the two is what the engine
and the messaging cost per item.
"""

from __future__ import annotations

from dataclasses import dataclass

from .result import PipelineMetrics, StageMetrics

__all__ = [
    "Scale",
    "ScaleInput",
    "StageMeter",
    "decide_scaling",
    "pipeline_metrics",
]


@dataclass
class StageMeter:
    """Accumulates one stage's events; ``now`` comes in with every event."""

    name: str
    queue_bound: int
    items_in: int = 0
    items_out: int = 0
    failed: int = 0
    errors: int = 0
    queue_depth: int = 0
    queue_max: int = 0
    replicas: int = 0
    inflight: int = 0
    _latency_sum: float = 0.0
    _latency_n: int = 0
    _actor_sum: float = 0.0
    _replica_area: float = 0.0
    _busy_area: float = 0.0
    _last: float | None = None
    _first: float | None = None
    _end: float | None = None
    _area_at_end: tuple[float, float] = (0.0, 0.0)

    def _advance(self, now: float) -> None:
        # Areas count from the stage's first item on: replicas waiting for the pipeline to
        # fill are start-up, not the stage's concurrency.
        if self._first is not None and self._last is not None and now > self._last:
            dt = now - self._last
            self._replica_area += self.replicas * dt
            self._busy_area += min(self.inflight, self.replicas) * dt if self.replicas else self.inflight * dt
        self._last = now

    def set_replicas(self, n: int, now: float) -> None:
        """The number of live replicas changed."""
        self._advance(now)
        self.replicas = n

    def queued(self, depth: int, now: float) -> None:
        """An item entered the input queue (``depth`` after it)."""
        self.items_in += 1
        self.queue_depth = depth
        self.queue_max = max(self.queue_max, depth)

    def dispatched(self, n: int, depth: int, now: float) -> None:
        """``n`` items left the queue for a replica."""
        self._advance(now)
        if self._first is None:
            self._first = now
        self.inflight += n
        self.queue_depth = depth

    def undispatched(self, n: int, depth: int, now: float) -> None:
        """``n`` items dispatched went back unsent (to the queue, or to be retried): the call
        that was to take them could not carry them."""
        self._advance(now)
        self.inflight -= n
        self.queue_depth = depth

    def refused(self, n: int) -> None:
        """``n`` items that alone cannot fit one call went to be retried unsent: failed attempts,
        as a call's failed items are (no call carried them, so no latency nor replica time)."""
        self.errors += n

    def finished(
        self, ok: int, failed: int, errors: int, latency_s: float, now: float, actor_s: float | None = None
    ) -> None:
        """A call returned: ``ok`` items out, ``failed`` pruned, ``errors`` to retry; ``latency_s``
        and ``actor_s`` (default: the same) per item, seen by the engine and inside the actor."""
        self._advance(now)
        n = ok + failed + errors
        self.inflight -= n
        self.items_out += ok
        self.failed += failed
        self.errors += errors
        self._latency_sum += latency_s * n
        self._actor_sum += (latency_s if actor_s is None else actor_s) * n
        self._latency_n += n
        self._end = now
        self._area_at_end = (self._replica_area, self._busy_area)

    def snapshot(self, now: float) -> StageMetrics:
        """Freeze the figures so far."""
        self._advance(now)
        latency = self._latency_sum / self._latency_n if self._latency_n else 0.0
        start = self._first
        # Once idle after its last item, the stage's window closes at that item: replicas
        # kept after it (until the scaler retires them) are not its concurrency.
        idle = self._end is not None and self.inflight == 0 and self.queue_depth == 0
        end = self._end if idle else now
        area, busy_area = self._area_at_end if idle else (self._replica_area, self._busy_area)
        span = (end - start) if start is not None and end is not None else 0.0
        # Concurrency: replicas averaged over the stage's active window.
        concurrency = area / span if span > 0 else float(self.replicas)
        throughput = concurrency / latency if latency > 0 else 0.0
        busy = busy_area / area if area > 0 else 0.0
        return StageMetrics(
            self.name,
            self.items_in,
            self.items_out,
            self.failed,
            self.errors,
            latency,
            concurrency,
            throughput,
            self.queue_depth,
            self.queue_max,
            self.queue_bound,
            min(busy, 1.0),
            self.replicas,
            self._actor_sum / self._latency_n if self._latency_n else 0.0,
        )


def pipeline_metrics(
    stages: list[StageMeter], ok: int, pruned: int, dead: int, start: float, now: float
) -> PipelineMetrics:
    """Combine stage meters into the pipeline's figures."""
    snaps = tuple(m.snapshot(now) for m in stages)
    elapsed = max(now - start, 1e-9)
    done = ok + pruned + dead
    rated = [s for s in snaps if s.throughput > 0]
    slowest = min(rated, key=lambda s: s.throughput) if rated else None
    return PipelineMetrics(
        snaps,
        elapsed,
        done,
        ok,
        pruned,
        dead,
        done / elapsed,
        ok / elapsed,
        slowest.throughput if slowest else 0.0,
        slowest.name if slowest else "",
    )


@dataclass(frozen=True, slots=True)
class ScaleInput:
    """What the scaler knows of one stage."""

    name: str
    replicas: int
    starting: int
    min_replicas: int
    max_replicas: int
    queue_depth: int
    inflight: int
    drained: bool


@dataclass(frozen=True, slots=True)
class Scale:
    """Add (delta > 0) or retire (delta < 0) replicas of a stage."""

    stage: str
    delta: int
    reason: str


def decide_scaling(stages: list[ScaleInput], budget: int) -> list[Scale]:
    """Move replica slots to where the backlog is.

    1. A drained stage (its upstream is exhausted, its queue empty, nothing in flight) gives
       back every replica.
    2. Free slots go, one at a time, to the stage with the largest backlog per replica that is
       below its maximum (the bottleneck).
    3. With no free slot, a stage with nothing queued and more than its minimum gives one
       replica to a stage whose backlog per replica is at least 2.
    """
    out: list[Scale] = []
    live = {s.name: s.replicas + s.starting for s in stages}
    for s in stages:
        if s.drained and live[s.name] > 0 and s.starting == 0:
            out.append(Scale(s.name, -s.replicas, "drained"))
            live[s.name] = 0
    free = budget - sum(live.values())

    def pressure(s: ScaleInput) -> float:
        return s.queue_depth / max(live[s.name], 1)

    wanting = sorted(
        (s for s in stages if not s.drained and s.queue_depth > 0 and live[s.name] < s.max_replicas),
        key=pressure,
        reverse=True,
    )
    if wanting and free > 0:
        target = wanting[0]
        out.append(Scale(target.name, 1, "free slot to the largest backlog"))
        return out
    if wanting and pressure(wanting[0]) >= 2:
        donors = [
            s
            for s in stages
            if s is not wanting[0]
            and not s.drained
            and s.queue_depth == 0
            and s.starting == 0
            and live[s.name] > max(s.min_replicas, 1)
        ]
        if donors:
            donor = max(donors, key=lambda s: live[s.name])
            out.append(Scale(donor.name, -1, f"idle, lends a slot to {wanting[0].name}"))
    return out
