"""The pipeline engine with real worker processes: pruning, retries, backpressure, scaling, datagen.

Each test runs a node inside the test process (its workers are the test's children); the node
is stopped however the test ends, and a fixture checks that no child process is left behind.
Synthetic stages cost 5-50 ms per item so the whole file stays well under a minute and a half.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import av
import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.cluster import free_endpoint
from troupe.actors.datagen.config import DEFAULT_PIPELINE
from troupe.actors.lerobot.flaky_writer import PARTIAL_FILE
from troupe.actors.lerobot.format import VIDEO_KEYS
from troupe.runtime.core.client import connect
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.node.node import Node
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.engine import PipelineEngine
from troupe.runtime.pipeline.result import PipelineMetrics, PipelineResult
from troupe.runtime.tasks.output_store import COMMIT_MARKER, OutputStore

pytestmark = pytest.mark.e2e

COST = "troupe.actors.bench.synthetic:CostStage"
TASK_TEXT = "navigate to the goal"
RUN_TIMEOUT_S = 60


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Every process a test starts is gone when it ends; leftovers are killed and fail the test."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    leaked = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(leaked, timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive, f"processes left running after the test: {alive}"


@asynccontextmanager
async def pipeline_node(log_dir: Path) -> AsyncIterator[tuple[Runtime, str]]:
    """A node in this process and a client runtime connected to it; the node stops on exit.

    Like ``troupe.cli.local_node.start_local_node``, but it also knows when the node has finished
    stopping its workers, so a failing test still waits for them (shielded, bounded).
    """
    endpoint = free_endpoint()
    node = Node(NodeConfig(name="pipe", endpoint=endpoint, log_dir=log_dir, stop_grace_s=5))
    stopped = anyio.Event()

    async def serve() -> None:
        try:
            await node.run()
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        try:
            with anyio.fail_after(60):
                await node.ready.wait()
            async with connect(endpoint, "pipe") as rt:
                yield rt, endpoint
        finally:
            node.stopping.set()
            with anyio.CancelScope(shield=True), anyio.move_on_after(60):
                await stopped.wait()


def _cost_stage(name: str, **kwargs: Any) -> dict[str, Any]:
    fields = {
        k: kwargs.pop(k)
        for k in ("replicas", "min_replicas", "max_replicas", "queue", "batch")
        if k in kwargs
    }
    return {"name": name, "actor": COST, **fields, "kwargs": kwargs}


def _pipeline(items: int, *stages: dict[str, Any], **fields: Any) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {"name": "t", "items": items, "scale_interval_s": 0.1, **fields, "stages": list(stages)}
    )


async def _run(
    cfg: PipelineConfig, log_dir: Path, samples: list[PipelineMetrics] | None = None, out: Path | None = None
) -> tuple[PipelineResult, PipelineEngine]:
    async with pipeline_node(log_dir) as (rt, endpoint):
        engine = PipelineEngine(
            cfg,
            rt,
            endpoint,
            on_change=samples.append if samples is not None else None,
            on_change_every_s=0.0,  # every change: the tests look at each queue depth
            out=None if out is None else str(out),
        )
        with anyio.fail_after(RUN_TIMEOUT_S):
            result = await engine.run()
    return result, engine


def _stages(m: PipelineMetrics) -> dict[str, Any]:
    return {s.name: s for s in m.stages}


def _task_seed(task_id: str) -> int:
    return int(task_id.rsplit("-", 1)[1])


# -- the engine with synthetic stages ----------------------------------------------------------


async def test_pruned_items_never_reach_the_next_stage(tmp_path: Path) -> None:
    """Items a stage prunes are counted as failed there, end "pruned", and the next stage sees only the
    survivors."""
    cfg = _pipeline(20, _cost_stage("a", cost_s=0.005, prune_every=4), _cost_stage("b", cost_s=0.005))
    result, _ = await _run(cfg, tmp_path / "logs")
    a, b = _stages(result.metrics)["a"], _stages(result.metrics)["b"]
    pruned = {tid for tid in result.outcomes if _task_seed(tid) % 4 == 0}
    assert len(result.outcomes) == 20
    assert {tid for tid, o in result.outcomes.items() if o == "pruned"} == pruned
    assert all(o == "ok" for tid, o in result.outcomes.items() if tid not in pruned)
    assert all("pruned by configuration" in result.errors[tid] for tid in pruned)
    assert (a.items_in, a.items_out, a.failed, a.errors) == (20, 15, 5, 0)
    assert (b.items_in, b.items_out, b.failed) == (15, 15, 0)
    m = result.metrics
    assert (m.items_ok, m.items_pruned, m.items_dead) == (15, 5, 0)
    assert m.lambda_succ == pytest.approx(m.lambda_measured * 15 / 20)


@pytest.mark.parametrize("max_attempts", [3, 1])
async def test_erring_item_is_retried_or_dead(tmp_path: Path, max_attempts: int) -> None:
    """An item whose stage errs on its first attempt is retried to "ok" exactly once; with one attempt it ends
    "dead" with its error."""
    cfg = _pipeline(
        15,
        _cost_stage("a", cost_s=0.005),
        _cost_stage("b", cost_s=0.005, fail_first=3),
        max_attempts=max_attempts,
    )
    result, _ = await _run(cfg, tmp_path / "logs")
    faulty = {tid for tid in result.outcomes if _task_seed(tid) % 3 == 0}
    b = _stages(result.metrics)["b"]
    assert len(result.outcomes) == 15 and len(faulty) == 5
    assert b.errors == 5  # each faulty item erred once
    if max_attempts > 1:
        assert set(result.outcomes.values()) == {"ok"}
        assert b.items_out == 15  # passed on once each, retries included
        assert result.metrics.items_ok == 15
    else:
        assert {tid for tid, o in result.outcomes.items() if o == "dead"} == faulty
        assert all(result.outcomes[tid] == "ok" for tid in set(result.outcomes) - faulty)
        assert all("simulated disk full" in result.errors[tid] for tid in faulty)
        assert b.items_out == 10 and result.metrics.items_dead == 5


async def test_slow_last_stage_bounds_every_queue(tmp_path: Path) -> None:
    """Behind a slow last stage, no queue ever exceeds its bound and the items inside the pipeline stay
    bounded."""
    bound = 3
    cfg = _pipeline(
        20,
        _cost_stage("a", cost_s=0.005, queue=bound),
        _cost_stage("b", cost_s=0.005, queue=bound),
        _cost_stage("c", cost_s=0.05, queue=bound),
    )
    samples: list[PipelineMetrics] = []
    result, _ = await _run(cfg, tmp_path / "logs", samples)
    assert set(result.outcomes.values()) == {"ok"} and len(result.outcomes) == 20
    samples.append(result.metrics)
    # Whatever sits in a queue or in a call: bounds plus one item per replica per stage.
    most_inside = sum(s.queue for s in cfg.stages) + sum(s.most * s.batch for s in cfg.stages)
    for m in samples:
        for s in m.stages:
            assert s.queue_depth <= s.queue_bound and s.queue_max <= s.queue_bound, s
        st = _stages(m)
        assert st["a"].items_in - st["c"].items_out <= most_inside
    final = _stages(result.metrics)
    assert final["c"].queue_max == bound  # the slow stage was kept saturated, not starved
    assert final["c"].busy_fraction > 0.5
    assert result.metrics.bottleneck == "c"


async def test_drained_stage_slots_go_to_the_bottleneck(tmp_path: Path) -> None:
    """Once the fast first stage drains, its replicas are retired and the slow stage grows into their
    slots."""
    cfg = _pipeline(
        40,
        _cost_stage("fast", cost_s=0.005, replicas=2, max_replicas=2),
        _cost_stage("slow", cost_s=0.05, replicas=1, max_replicas=3, queue=40),
        slots=3,  # every slot is taken at the start: "slow" can only grow into freed ones
    )
    samples: list[PipelineMetrics] = []
    result, engine = await _run(cfg, tmp_path / "logs", samples)
    assert set(result.outcomes.values()) == {"ok"} and len(result.outcomes) == 40
    log = engine.scale_log
    assert all(len(entry) == 4 and entry[3] in ("started", "retired") for entry in log)
    fast = [(i, e) for i, e in enumerate(log) if e[1] == "fast"]
    slow = [(i, e) for i, e in enumerate(log) if e[1] == "slow"]
    fast_retired = [i for i, e in fast if e[3] == "retired"]
    assert fast_retired, f"the fast stage's replicas were never retired: {log}"
    assert fast[-1][1][2] == 0, f"the fast stage kept replicas: {log}"
    grown = [(i, e) for i, e in slow if e[3] == "started" and e[2] >= 2]
    assert grown, f"the slow stage never grew: {log}"
    assert all(i > fast_retired[0] for i, _ in grown), f"the slow stage grew before a slot was freed: {log}"
    assert max(e[2] for _, e in slow) <= 3
    for m in samples:  # never more replicas than the budget, never past a stage's maximum
        assert sum(s.replicas for s in m.stages) <= cfg.slot_budget
        assert _stages(m)["slow"].replicas <= 3


async def test_scale_log_times_never_go_backwards(tmp_path: Path) -> None:
    """engine.scale_log is in time order: t never decreases from one entry to the next."""
    # "b" works ~1 s after "a" drains: ten of the scaler's looks (0.1 s apart) to retire "a".
    cfg = _pipeline(10, _cost_stage("a", cost_s=0.005), _cost_stage("b", cost_s=0.1))
    _, engine = await _run(cfg, tmp_path / "logs")
    kinds = [(stage, what) for _, stage, _, what in engine.scale_log]
    assert ("a", "retired") in kinds, engine.scale_log  # "a" drains while "b" still works
    times = [t for t, *_ in engine.scale_log]
    assert times == sorted(times), engine.scale_log


# -- the data generation pipeline --------------------------------------------------------------


def _small_datagen_toml() -> str:
    text = (Path(__file__).resolve().parents[2] / "configs" / "datagen.toml").read_text(encoding="utf-8")
    small = text.replace("width = 96, height = 72", "width = 48, height = 36").replace(
        "max_frames = 60", "max_frames = 20"
    )
    assert "width = 48, height = 36" in small and "max_frames = 20" in small, (
        "configs/datagen.toml changed shape"
    )
    return small


def _read_dataset(root: Path) -> dict[str, Any]:
    """Read a LeRobot v3.0 dataset back with pyarrow, pandas and PyAV, checking its invariants."""
    info = json.loads((root / "meta" / "info.json").read_text(encoding="utf-8"))
    assert info["codebase_version"] == "v3.0"
    total_frames, total_episodes = info["total_frames"], info["total_episodes"]

    data = pa.concat_tables(pq.read_table(p) for p in sorted((root / "data").rglob("*.parquet")))
    for key, width in (("action", 59), ("action_mask", 59), ("observation.state", 9)):
        kind = data.schema.field(key).type
        assert pa.types.is_fixed_size_list(kind) and kind.list_size == width, (key, kind)
    assert data.schema.field("action").type.value_type == pa.float32()
    assert data.num_rows == total_frames
    assert np.array_equal(data.column("index").to_numpy(), np.arange(total_frames))
    mask = np.stack(data.column("action_mask").to_numpy(zero_copy_only=False))
    assert mask.shape == (total_frames, 59) and mask[:, :9].all() and not mask[:, 9:].any()

    episodes = pa.concat_tables(
        pq.read_table(p) for p in sorted((root / "meta" / "episodes").rglob("*.parquet"))
    ).to_pandas()
    assert len(episodes) == total_episodes
    assert list(episodes["episode_index"]) == list(range(total_episodes))
    assert int(episodes["length"].sum()) == total_frames
    assert list(episodes["dataset_from_index"][1:]) == list(episodes["dataset_to_index"][:-1])
    per_episode = data.column("episode_index").to_numpy()
    assert list(np.bincount(per_episode, minlength=total_episodes)) == list(episodes["length"])

    tasks = pd.read_parquet(root / "meta" / "tasks.parquet")
    assert TASK_TEXT in tasks.index and info["total_tasks"] == len(tasks)

    for key in VIDEO_KEYS:
        files = sorted((root / "videos" / key).rglob("*.mp4"))
        assert files, f"no video for {key}"
        decoded = 0
        for path in files:
            with av.open(str(path)) as container:
                decoded += sum(1 for _ in container.decode(video=0))
        assert decoded >= total_frames, (key, decoded, total_frames)
    return {"info": info, "episodes": episodes}


def test_troupe_run_writes_a_readable_lerobot_dataset(tmp_path: Path) -> None:
    """`troupe run CONFIG --scenes 6 --out DIR` exits 0 and leaves a LeRobot v3.0 dataset that reads back
    whole."""
    config = tmp_path / "datagen-small.toml"
    config.write_text(_small_datagen_toml(), encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "troupe.cli.main",
            "run",
            str(config),
            "--scenes",
            "6",
            "--out",
            str(out),
            "--endpoint",
            free_endpoint(),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = re.search(r"(\d+)\s+ok,\s+(\d+)\s+pruned,\s+(\d+)\s+dead", " ".join(proc.stdout.split()))
    assert counts, proc.stdout[-3000:]
    ok, pruned, dead = map(int, counts.groups())
    assert ok + pruned + dead == 6 and dead == 0 and ok >= 1

    dataset = _read_dataset(out)
    info = dataset["info"]
    assert info["total_episodes"] == ok
    assert info["fps"] == 10
    store = OutputStore(out / ".troupe" / "episodes")
    assert len(store.committed()) == ok
    assert list(dataset["episodes"]["troupe/task_id"]) == store.committed()
    assert all(int(n) <= 20 for n in dataset["episodes"]["length"])
    for key in VIDEO_KEYS:
        feature = info["features"][key]
        assert feature["dtype"] == "video" and list(feature["shape"])[:2] == [36, 48], feature


async def test_writer_disk_failure_is_retried_without_partial_episodes(tmp_path: Path) -> None:
    """A writer whose disk write fails on the first try at every third seed retries it; each episode is stored
    once, nothing partial."""
    out = tmp_path / "out"
    data = {**DEFAULT_PIPELINE, "items": 6, "scale_interval_s": 0.1}
    stages = [dict(s) for s in DEFAULT_PIPELINE["stages"]]
    stages[0]["kwargs"] = {"width": 48, "height": 36}
    stages[1]["kwargs"] = {"fps": 10, "max_frames": 20}
    stages[3] = {
        **stages[3],
        "actor": "troupe.actors.lerobot.flaky_writer:FlakyLeRobotWriter",
        "kwargs": {"store": "{out}/.troupe/episodes", "fault_dir": "{out}/.troupe/faults"},
    }
    cfg = PipelineConfig.model_validate({**data, "stages": stages}).with_out(out)
    result, _ = await _run(cfg, tmp_path / "logs", out=out)

    ok = sorted(tid for tid, o in result.outcomes.items() if o == "ok")
    assert len(result.outcomes) == 6 and "dead" not in result.outcomes.values()
    faulted = sorted(p.name for p in (out / ".troupe" / "faults").iterdir())
    assert faulted == [tid for tid in ok if _task_seed(tid) % 3 == 0] and faulted
    store_stage = _stages(result.metrics)["store"]
    assert store_stage.errors == len(faulted)
    assert store_stage.items_out == len(ok)

    store = OutputStore(out / ".troupe" / "episodes")
    assert store.committed() == ok
    assert list(store.staging_dir.iterdir()) == [], "a failed write left its staging directory"
    for tid in ok:
        files = {p.name for p in store.committed_path(tid).iterdir()}
        assert COMMIT_MARKER in files and "episode.json" in files and PARTIAL_FILE not in files

    assert result.finals["store"]["episodes"] == len(ok)  # the writer's finalize hook wrote it
    dataset = _read_dataset(out)
    assert dataset["info"]["total_episodes"] == len(ok)
    assert list(dataset["episodes"]["troupe/task_id"]) == ok
