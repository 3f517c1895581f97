"""Actors' own figures: read from each actor's ``metrics()`` in the worker, exported by the node
as ``troupe_actor_counter_total`` (names ending in ``_total``) and ``troupe_actor_gauge``; bad
names and values dropped (a negative counter too), a raising, async or non-mapping ``metrics``
skipped without hiding the others, and each said once."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from support.log_capture import module_logs
from troupe.runtime.core.actor import Actor, handles
from troupe.runtime.metrics import actor_metrics
from troupe.runtime.metrics.actor_metrics import MAX_FIGURES, actor_metric_families, read_actor_metrics
from troupe.runtime.metrics.families import Families


class Counting:
    def __init__(self) -> None:
        self.hits = 3

    def metrics(self) -> Mapping[str, float]:
        return {"hits_total": self.hits, "hit_rate": 0.75, "bad name": 1, "nan": math.nan, "flag": True}


class Broken:
    def metrics(self) -> Mapping[str, float]:
        raise RuntimeError("oops")


class AsyncOne:
    async def metrics(self) -> Mapping[str, float]:  # a message handler, not figures
        return {"x": 1}


class Many:
    def metrics(self) -> Mapping[str, float]:
        return {f"m{i}": i for i in range(MAX_FIGURES + 10)}


def test_read_keeps_valid_figures_and_skips_what_cannot_be_read() -> None:
    actors: dict[str, Any] = {"c": Counting(), "b": Broken(), "a": AsyncOne(), "plain": object(), "m": Many()}
    found = read_actor_metrics(actors)
    assert found["c"] == {"hits_total": 3.0, "hit_rate": 0.75}
    assert "b" not in found and "a" not in found and "plain" not in found
    assert len(found["m"]) == MAX_FIGURES


def test_families_split_counters_from_gauges() -> None:
    f = Families({"node": "n1"})
    actor_metric_families(f, "w-1", {"actor_metrics": read_actor_metrics({"c": Counting()})})
    actor_metric_families(f, "w-2", {})  # an older worker says nothing: nothing added
    by_name = {family.name: family for family in f.all()}
    counter, gauge = by_name["troupe_actor_counter"], by_name["troupe_actor_gauge"]
    assert isinstance(counter, CounterMetricFamily) and isinstance(gauge, GaugeMetricFamily)
    labels = {"node": "n1", "worker": "w-1", "actor": "c"}
    assert [(s.name, s.labels, s.value) for s in counter.samples] == [
        ("troupe_actor_counter_total", {**labels, "name": "hits"}, 3.0)
    ]
    assert [(s.labels, s.value) for s in gauge.samples] == [({**labels, "name": "hit_rate"}, 0.75)]


def test_figures_left_out_are_said_once_per_actor(monkeypatch: pytest.MonkeyPatch) -> None:
    """They were dropped without a word: an actor's author saw nothing in Prometheus, and no why."""
    monkeypatch.setattr(actor_metrics, "_warned", set())
    with module_logs(monkeypatch, actor_metrics) as logs:
        read_actor_metrics({"c": Counting(), "m": Many()})
        read_actor_metrics({"c": Counting(), "m": Many()})  # the next scrape: said already
    dropped = {e["actor"]: e for e in logs if e["event"] == "actor_metrics_dropped"}
    assert sorted(dropped) == ["c", "m"] and len(logs) == 2
    assert dropped["c"]["figures"] == ["bad name", "nan", "flag"] and dropped["m"]["dropped"] == 10


class Listing:
    def metrics(self) -> Any:
        return [1, 2]


class CoroutineMaker:
    def metrics(self) -> Any:
        return AsyncOne().metrics()  # a coroutine, never awaited


class NegativeCounter:
    def metrics(self) -> Mapping[str, float]:
        return {"neg_total": -5, "ok_total": 2, "below_zero": -1.5}


class MetricsHandler(Actor):
    @handles("metrics")
    async def metrics(self, payload: Any) -> Any:  # answers a message: no figures, nothing to say
        return {}


def test_a_metrics_that_gives_no_mapping_is_said_once_per_actor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list, an ``async def metrics`` and a coroutine exported nothing and logged nothing: the
    actor's author saw no figure and no why. A message handler named ``metrics`` is no mistake."""
    monkeypatch.setattr(actor_metrics, "_warned", set())
    actors: dict[str, Any] = {
        "list": Listing(),
        "async": AsyncOne(),
        "coro": CoroutineMaker(),
        "handler": MetricsHandler(),
    }
    with module_logs(monkeypatch, actor_metrics) as logs:
        assert read_actor_metrics(actors) == {}
        assert read_actor_metrics(actors) == {}  # the next scrape: said already
    failed = {e["actor"]: e["error"] for e in logs if e["event"] == "actor_metrics_failed"}
    assert len(logs) == 3 and sorted(failed) == ["async", "coro", "list"]
    assert failed["list"] == "metrics() returned list, not a mapping of name -> number"
    assert failed["coro"] == "metrics() returned coroutine, not a mapping of name -> number"
    assert "async def" in failed["async"] and "plain def" in failed["async"]


def test_a_negative_counter_is_dropped_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """A counter only grows (Prometheus takes a fall for a reset): -5 was exported as one."""
    monkeypatch.setattr(actor_metrics, "_warned", set())
    with module_logs(monkeypatch, actor_metrics) as logs:
        found = read_actor_metrics({"n": NegativeCounter()})
    assert found == {"n": {"ok_total": 2.0, "below_zero": -1.5}}  # a gauge may be negative
    (dropped,) = logs
    assert dropped["event"] == "actor_metrics_dropped" and dropped["figures"] == ["neg_total"]
    assert "not negative for a counter" in dropped["rule"]
    f = Families({"node": "n1"})
    actor_metric_families(f, "w-1", {"actor_metrics": {"n": {"neg_total": -5.0}}})  # an older worker's
    assert not [s for family in f.all() for s in family.samples]
