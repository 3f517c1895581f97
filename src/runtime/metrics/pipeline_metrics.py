"""The pipeline's figures as metric families: per stage, items in and out, l_s, N_s, mu_s, its
queue and how busy it is; for the whole pipeline, lambda, lambda_theory, lambda_succ and the
efficiency lambda / lambda_theory (DESIGN.md, Pipelines).

The figures come as the plain map the engine's metrics make (the ``pipeline`` section of the
node's status reply); a field that is missing is left out, not reported as zero. A node started
by the run adds them to its own families (``node_metrics``); a run whose replicas run on other
processes' nodes (``troupe run --cluster``) serves them alone from its own process, where the
engine is (:class:`PipelineCollector`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from troupe.runtime.library_logging import get_logger

from .families import Families, Family, number

__all__ = ["PipelineCollector", "pipeline_families"]

log = get_logger(__name__)

# (field of a stage's figures, its other names, metric, kind, help)
_STAGE = (
    ("items_in", (), "troupe_stage_items_in_total", "counter", "Items the stage took in."),
    ("items_out", (), "troupe_stage_items_out_total", "counter", "Items the stage passed on."),
    ("failed", (), "troupe_stage_items_failed_total", "counter", "Items the stage failed for good."),
    ("latency_s", ("l_s",), "troupe_stage_latency_seconds", "gauge", "l_s: mean seconds per item."),
    ("concurrency", ("N_s",), "troupe_stage_concurrency", "gauge", "N_s: mean items in work at once."),
    ("throughput", ("mu_s",), "troupe_stage_throughput", "gauge", "mu_s = N_s / l_s, items per second."),
    ("queue_depth", (), "troupe_stage_queue_depth", "gauge", "Items waiting in the stage's input queue."),
    ("queue_bound", (), "troupe_stage_queue_bound", "gauge", "The bound of the stage's input queue."),
    ("busy_fraction", ("busy",), "troupe_stage_busy_ratio", "gauge", "Fraction of time the stage was busy."),
    ("replicas", (), "troupe_stage_replicas", "gauge", "Replicas of the stage running now."),
)

_PIPELINE = (
    ("lambda_measured", ("lambda",), "troupe_pipeline_lambda", "lambda: items finished per second."),
    ("lambda_theory", (), "troupe_pipeline_lambda_theory", "lambda_theory = min over stages of mu_s."),
    ("lambda_succ", (), "troupe_pipeline_lambda_succ", "lambda_succ: successful items per second."),
    ("efficiency", (), "troupe_pipeline_efficiency", "lambda / lambda_theory."),
    ("elapsed_s", (), "troupe_pipeline_elapsed_seconds", "Seconds since the pipeline started."),
)

_OUTCOMES = (("items_ok", "ok"), ("items_pruned", "pruned"), ("items_dead", "dead"))


def _first(data: Any, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = number(data, key)
        if value is not None:
            return value
    return None


def pipeline_families(f: Families, figures: Any) -> None:
    """Add the pipeline's families for ``figures`` (the engine's metrics as a map) to ``f``."""
    if not isinstance(figures, dict):
        return
    for key, aliases, name, doc in _PIPELINE:
        value = _first(figures, (key, *aliases))
        if value is not None:
            f.gauge(name, doc, value)
    for key, outcome in _OUTCOMES:
        value = number(figures, key)
        if value is not None:
            f.counter(
                "troupe_pipeline_items_total", "Items finished, by outcome.", value, {"outcome": outcome}
            )
    for stage in figures.get("stages") or ():
        if not isinstance(stage, dict) or not isinstance(stage.get("name"), str):
            continue
        labels = {"stage": stage["name"]}
        for key, aliases, name, kind, doc in _STAGE:
            value = _first(stage, (key, *aliases))
            if value is None:
                continue
            if kind == "counter":
                f.counter(name, doc, value, labels)
            else:
                f.gauge(name, doc, value, labels)


class PipelineCollector:
    """The pipeline's families alone (a prometheus-client custom collector), for the process
    that drives a run on other processes' nodes: they never see its engine's figures.

    Args:
        labels: on every sample (the pipeline's name).

    Attributes:
        figures: reads the engine's figures as a map; None until the engine exists (a scrape
            then has no family).
    """

    def __init__(self, labels: Mapping[str, str]) -> None:
        self._labels = dict(labels)
        self.figures: Callable[[], Any] | None = None

    def collect(self) -> Iterator[Family]:
        """The pipeline's families, from its figures now."""
        f = Families(self._labels)
        figures = self.figures
        if figures is not None:
            try:
                pipeline_families(f, figures())
            except Exception as exc:  # its figures wait for the next scrape
                log.info("metrics_pipeline_unread", error=repr(exc))
        yield from f.all()
