"""What a pipeline run returns: its outcomes, outputs and finals, and the throughput model's
figures (``model`` explains them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PipelineMetrics", "PipelineResult", "StageMetrics"]


@dataclass(frozen=True, slots=True)
class StageMetrics:
    """What one stage did (frozen snapshot)."""

    name: str
    items_in: int
    items_out: int
    failed: int
    errors: int
    latency_s: float
    concurrency: float
    throughput: float
    queue_depth: int
    queue_max: int
    queue_bound: int
    busy_fraction: float
    replicas: int
    actor_latency_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PipelineMetrics:
    """The whole pipeline: its stages and the throughput model's figures."""

    stages: tuple[StageMetrics, ...]
    elapsed_s: float
    items_done: int
    items_ok: int
    items_pruned: int
    items_dead: int
    lambda_measured: float
    lambda_succ: float
    lambda_theory: float
    bottleneck: str

    @property
    def efficiency(self) -> float:
        """lambda / lambda_theory."""
        return self.lambda_measured / self.lambda_theory if self.lambda_theory > 0 else 0.0


@dataclass(frozen=True)
class PipelineResult:
    """The end of a run.

    Attributes:
        metrics: the figures of the run (the stages' counts among them).
        outcomes: each item's end: ``ok``, ``pruned``, ``dead``, or ``kept`` (an earlier run
            committed its output).
        errors: the last error of each pruned or dead item.
        outputs: the last stage's output per ok item (empty unless kept: ``keep_outputs``).
        finals: what each stage's ``finalize`` hook returned, by stage.
        scale_log: the scaler's decisions: (seconds since start, stage, replicas, what).
        kept: how many items an earlier run had committed.
        already_complete: ``out`` held a finished run of this pipeline (on a cluster, of the
            master's job as it is now): nothing ran, and ``finals`` are the recorded ones.
        wall_s: seconds from the call of ``run_pipeline`` to its return.
        startup_s: of them, until every stage's first replica served (the cluster started, the
            replicas spawned and answered).
        finalize_s: from the last item's outcome to the return (the finalize hooks, stopping
            the replicas, the node and the master).
        steady_s: the rest: items moving (the stages' start hooks among them).
        placement: the node each replica the run started ran on, by replica name.
        engine_bytes: the bytes the engine's process sent and received while items moved
            (calls, replies, leases): with the direct data plane, about the metadata's size.
        restarted: items run again from the first stage because the replica holding their
            payload was lost (its node died).
        made_nothing: every item died or was pruned, in this run or an earlier one into
            ``out``, and no output is anywhere: the run made nothing, and no finalize hook ran
            (recorded with the run, so a rerun that finds it complete says so too).
        remade: items that earlier runs had ended ok whose outputs were gone (deleted since):
            this run made them again (among ``ok``).
        ended: the job's items by how they ended (``ok``, ``pruned``, ``dead``), every run's,
            this one's among them: read from the master's book as the run ends (one that found
            the job complete: as the run that finished it recorded them); empty where the
            master is not the run's own (``cluster=``, ``master=``).
    """

    metrics: PipelineMetrics
    outcomes: dict[str, str]
    errors: dict[str, str]
    outputs: dict[str, Any] = field(default_factory=dict)
    finals: dict[str, dict[str, Any]] = field(default_factory=dict)
    scale_log: tuple[tuple[float, str, int, str], ...] = ()
    kept: int = 0
    already_complete: bool = False
    wall_s: float = 0.0
    startup_s: float = 0.0
    steady_s: float = 0.0
    finalize_s: float = 0.0
    placement: dict[str, str] = field(default_factory=dict)
    engine_bytes: int = 0
    restarted: int = 0
    made_nothing: bool = False
    remade: int = 0
    ended: dict[str, int] = field(default_factory=dict)

    def earlier_runs(self, recorded: int) -> str:
        """The closing line's words on earlier runs (empty when there were none): ``recorded``,
        the items the job's record had as ended when the run began."""
        recorded -= self.remade  # ended, but their outputs were gone: this run made them
        earlier = recorded + self.kept
        found = f", {self.kept} found committed" if self.kept else ""
        said = f"; {earlier} done by earlier runs ({recorded} recorded{found})" if earlier else ""
        return said + (f"; {self.remade} made again (their outputs were gone)" if self.remade else "")

    @property
    def startup_share(self) -> float:
        """The share of the wall time not spent running items: (start-up + finalisation) / wall."""
        return (self.startup_s + self.finalize_s) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def engine_bytes_per_item(self) -> float:
        """Bytes through the engine's process per item that ran."""
        ran = sum(1 for o in self.outcomes.values() if o != "kept")
        return self.engine_bytes / ran if ran else 0.0

    def counts(self) -> dict[str, int]:
        """How many items this run ended each way (``ok``, ``pruned``, ``dead``, ``kept``; every
        run of the job: ``ended``)."""
        out = {"ok": 0, "pruned": 0, "dead": 0, "kept": 0}
        for outcome in self.outcomes.values():
            out[outcome] = out.get(outcome, 0) + 1
        return out
