"""The pipeline's pure bookkeeping: stage meters, the throughput model and the scaler, time passed in."""

from __future__ import annotations

import pytest

from troupe.runtime.pipeline.model import (
    Scale,
    ScaleInput,
    StageMeter,
    StageMetrics,
    decide_scaling,
    pipeline_metrics,
)


def _meter_two_replicas() -> StageMeter:
    """Two replicas from t=0; two items in at t=0, one out at t=1 (1 s), one at t=2 (2 s)."""
    m = StageMeter("s", queue_bound=4)
    m.set_replicas(2, 0.0)
    m.queued(1, 0.0)
    m.queued(2, 0.0)
    m.dispatched(2, 0, 0.0)
    m.finished(1, 0, 0, 1.0, 1.0)
    m.finished(1, 0, 0, 2.0, 2.0)
    return m


def _stage(
    name: str,
    *,
    replicas: int = 1,
    starting: int = 0,
    lo: int = 1,
    hi: int = 3,
    queue: int = 0,
    inflight: int = 0,
    drained: bool = False,
) -> ScaleInput:
    return ScaleInput(name, replicas, starting, lo, hi, queue, inflight, drained)


# -- StageMeter -------------------------------------------------------------------------------


def test_meter_latency_is_mean_per_item() -> None:
    """l_s is the mean latency over every finished item, a batch weighted by its size."""
    m = StageMeter("s", queue_bound=8)
    m.set_replicas(1, 0.0)
    m.dispatched(3, 0, 0.0)
    m.finished(3, 0, 0, 0.5, 1.5)  # a batch of 3 at 0.5 s per item
    m.dispatched(1, 0, 1.5)
    m.finished(1, 0, 0, 2.5, 4.0)
    assert m.snapshot(4.0).latency_s == pytest.approx((3 * 0.5 + 2.5) / 4)


def test_meter_counts_and_queue_figures() -> None:
    """Items in, out, pruned and errored are counted; queue depth and its maximum are tracked."""
    m = StageMeter("s", queue_bound=8)
    m.set_replicas(1, 0.0)
    for depth in (1, 2, 3):
        m.queued(depth, 0.0)
    m.dispatched(3, 0, 0.0)
    m.finished(1, 1, 1, 0.1, 0.3)
    snap = m.snapshot(0.3)
    assert (snap.items_in, snap.items_out, snap.failed, snap.errors) == (3, 1, 1, 1)
    assert (snap.queue_depth, snap.queue_max, snap.queue_bound) == (0, 3, 8)


def test_meter_concurrency_throughput_and_busy_fraction() -> None:
    """N_s averages the replicas over the active window, mu_s = N_s / l_s, busy = busy area / replica area."""
    snap = _meter_two_replicas().snapshot(2.0)
    assert snap.latency_s == pytest.approx(1.5)
    assert snap.concurrency == pytest.approx(2.0)
    assert snap.throughput == pytest.approx(2.0 / 1.5)
    # [0, 1]: two of two replicas busy, [1, 2]: one of two -> 3 / 4.
    assert snap.busy_fraction == pytest.approx(0.75)
    assert snap.replicas == 2


def test_meter_concurrency_follows_replica_changes() -> None:
    """A stage with one replica for 1 s and three for 1 s has a mean concurrency of 2."""
    m = StageMeter("s", queue_bound=8)
    m.set_replicas(1, 0.0)
    m.dispatched(1, 5, 0.0)
    m.set_replicas(3, 1.0)
    m.dispatched(1, 4, 1.0)
    m.finished(2, 0, 0, 1.0, 2.0)
    assert m.snapshot(2.0).concurrency == pytest.approx(2.0)


def test_meter_concurrency_never_exceeds_replicas() -> None:
    """Time a replica waits for its first item, or idles after the last, does not inflate N_s."""
    m = StageMeter("s", queue_bound=4)
    m.set_replicas(1, 0.0)
    m.queued(1, 5.0)
    m.dispatched(1, 0, 5.0)  # the pipeline took 5 s to fill up to this stage
    m.finished(1, 0, 0, 1.0, 6.0)
    for now in (6.0, 9.0, 60.0):  # the scaler has not retired the replica yet
        snap = m.snapshot(now)
        assert snap.concurrency == pytest.approx(1.0)
        assert snap.throughput == pytest.approx(1.0)
        assert 0.0 <= snap.busy_fraction <= 1.0


def test_meter_snapshot_is_frozen() -> None:
    """A snapshot is a frozen value: later events do not change it."""
    m = _meter_two_replicas()
    snap = m.snapshot(2.0)
    m.queued(1, 3.0)
    assert snap.items_in == 2
    with pytest.raises(AttributeError):
        snap.items_in = 5  # type: ignore[misc]


# -- pipeline_metrics -------------------------------------------------------------------------


def _rated_meter(name: str, replicas: int, latency: float) -> StageMeter:
    m = StageMeter(name, queue_bound=4)
    m.set_replicas(replicas, 0.0)
    m.dispatched(1, 0, 0.0)
    m.finished(1, 0, 0, latency, 10.0)
    return m


def test_pipeline_theory_is_slowest_stage() -> None:
    """lambda_theory = min(mu_s) and the bottleneck names that stage."""
    stages = [_rated_meter("load", 1, 0.1), _rated_meter("render", 2, 0.5), _rated_meter("store", 1, 0.2)]
    m = pipeline_metrics(stages, ok=8, pruned=1, dead=1, start=0.0, now=10.0)
    by_name = {s.name: s for s in m.stages}
    assert by_name["render"].throughput == pytest.approx(4.0)
    assert m.lambda_theory == pytest.approx(4.0)
    assert m.bottleneck == "render"


def test_pipeline_lambda_and_lambda_succ() -> None:
    """lambda counts every item done per second, lambda_succ only the successful ones."""
    stages = [_rated_meter("a", 1, 0.5)]
    m = pipeline_metrics(stages, ok=6, pruned=3, dead=1, start=100.0, now=105.0)
    assert (m.items_done, m.items_ok, m.items_pruned, m.items_dead) == (10, 6, 3, 1)
    assert m.elapsed_s == pytest.approx(5.0)
    assert m.lambda_measured == pytest.approx(2.0)
    assert m.lambda_succ == pytest.approx(1.2)
    assert m.efficiency == pytest.approx(2.0 / m.lambda_theory)


def test_pipeline_without_finished_items_has_no_bottleneck() -> None:
    """Before any item finishes there is no rate: lambda_theory 0, no bottleneck, efficiency 0."""
    m = StageMeter("a", queue_bound=4)
    m.set_replicas(1, 0.0)
    metrics = pipeline_metrics([m], ok=0, pruned=0, dead=0, start=0.0, now=1.0)
    assert (metrics.lambda_theory, metrics.bottleneck, metrics.efficiency) == (0.0, "", 0.0)
    assert isinstance(metrics.stages[0], StageMetrics)


# -- decide_scaling ---------------------------------------------------------------------------


def test_drained_stage_gives_back_every_replica() -> None:
    """A drained stage is scaled to zero; its slots go to the stage with a backlog."""
    stages = [
        _stage("plan", replicas=2, hi=2, drained=True),
        _stage("render", replicas=1, hi=3, queue=6),
    ]
    assert decide_scaling(stages, budget=3) == [
        Scale("plan", -2, "drained"),
        Scale("render", 1, "free slot to the largest backlog"),
    ]


def test_drained_stage_still_starting_keeps_its_replicas() -> None:
    """A stage with a replica still starting is not scaled down even if it looks drained."""
    stages = [_stage("plan", replicas=1, starting=1, drained=True), _stage("render", replicas=1)]
    assert decide_scaling(stages, budget=2) == []


def test_free_slot_goes_to_largest_backlog_per_replica() -> None:
    """One free slot goes to the stage with the most queued items per replica."""
    stages = [
        _stage("plan", replicas=2, queue=6),  # 3 per replica
        _stage("render", replicas=1, queue=4),  # 4 per replica
        _stage("store", replicas=1, queue=1),
    ]
    decisions = decide_scaling(stages, budget=5)
    assert [(d.stage, d.delta) for d in decisions] == [("render", 1)]


def test_free_slot_skips_stage_at_its_maximum() -> None:
    """A stage already at max_replicas gets no slot; the next largest backlog does."""
    stages = [
        _stage("plan", replicas=2, hi=3, queue=6),
        _stage("render", replicas=1, starting=1, hi=2, queue=40),  # at its max counting the starter
    ]
    decisions = decide_scaling(stages, budget=8)
    assert [(d.stage, d.delta) for d in decisions] == [("plan", 1)]


def test_idle_stage_above_minimum_lends_a_slot() -> None:
    """With no free slot, an idle stage above its minimum retires one replica for a backlog >= 2 per
    replica."""
    stages = [
        _stage("plan", replicas=2, lo=1, queue=0, inflight=1),
        _stage("render", replicas=1, hi=3, queue=2),
    ]
    decisions = decide_scaling(stages, budget=3)
    assert [(d.stage, d.delta) for d in decisions] == [("plan", -1)]
    assert "render" in decisions[0].reason


def test_idle_stage_at_minimum_does_not_lend() -> None:
    """An idle stage at its minimum keeps its replica even when another stage is backed up."""
    stages = [
        _stage("plan", replicas=2, lo=2, hi=2, queue=0),
        _stage("render", replicas=1, hi=3, queue=10),
    ]
    assert decide_scaling(stages, budget=3) == []


def test_small_backlog_borrows_nothing() -> None:
    """A backlog below 2 per replica does not take a slot from an idle stage."""
    stages = [
        _stage("plan", replicas=2, lo=1, queue=0),
        _stage("render", replicas=1, hi=3, queue=1),
    ]
    assert decide_scaling(stages, budget=3) == []


def test_balanced_pipeline_is_left_alone() -> None:
    """Every stage busy with less than 2 queued per replica and no free slot: no decision."""
    stages = [
        _stage("load", replicas=1, queue=1, inflight=1),
        _stage("plan", replicas=1, queue=1, inflight=1),
        _stage("render", replicas=2, queue=2, inflight=2),
    ]
    assert decide_scaling(stages, budget=4) == []


def test_no_growth_past_budget() -> None:
    """A backlog cannot grow a stage when the budget is spent and no stage is idle."""
    stages = [_stage("plan", replicas=1, queue=5), _stage("render", replicas=1, hi=4, queue=50)]
    assert decide_scaling(stages, budget=2) == []
