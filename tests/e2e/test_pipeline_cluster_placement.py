"""A pipeline placed on a cluster's nodes (issue 14): two nodes joined to one master on loopback
(127.0.0.2, tagged ``store``; 127.0.0.3, tagged ``plain``), no namespaces.

``run_pipeline(cfg, cluster=MASTER, nodes=2)`` puts a stage's replicas on both nodes and a stage
that asks for the ``store`` tag only on the node that has it; the frames go from replica to
replica across the nodes, each arrives intact, and the engine sees only metadata; no replica
waits for the cluster's directory to hear of it. The CLI
refuses, with exit status 2 and a line naming the cause: a rerun of the job into another
``--out`` than it was made with, a stage whose tags no node offers,
``--nodes`` without ``--cluster``, and a ``--cluster`` that is no endpoint; too few nodes
alive is refused naming how many answered (``wait_for_nodes``, with a short wait).

The replicas import ``tests/support/direct_plane_stages.py`` (``tests/`` on the nodes'
``PYTHONPATH``). Every process is reaped by its pid, the nodes' workers too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster
from support.tagged_nodes import tagged_nodes
from troupe.runtime.core.client import connect
from troupe.runtime.errors import ConfigError, StageFailed
from troupe.runtime.pipeline.config import PipelineConfig
from troupe.runtime.pipeline.hosts import wait_for_nodes
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.tasks.journal_lock import JournalLock
from troupe.runtime.testing.plugin import import_path
from troupe.runtime.transports.loopback import free_endpoint

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STAGES = "support.direct_plane_stages"
NODES = {"na": ("127.0.0.2", "store"), "nb": ("127.0.0.3", "plain")}
ITEMS = 8
PAYLOAD = 1 << 20
RUN_TIMEOUT_S = 240
CLI_TIMEOUT_S = 240
METADATA_MOST = 64 << 10


@pytest.fixture
def two_nodes(tmp_path: Path, master: TaskMaster) -> Iterator[TaskMaster]:
    """The master with both nodes joined; the nodes and their workers reaped after the test."""
    with tagged_nodes(master, tmp_path, NODES, env={"PYTHONPATH": import_path()}):
        yield master


def _stages(store_tags: list[str]) -> list[dict[str, Any]]:
    return [
        {"name": "make", "actor": f"{STAGES}:MakePayload", "replicas": 2, "kwargs": {"nbytes": PAYLOAD}},
        {
            "name": "store",
            "actor": f"{STAGES}:CheckPayload",
            "replicas": 2,
            "resources": {"tags": store_tags},
            "kwargs": {"nbytes": PAYLOAD},
        },
    ]


def _replicas_of(placement: dict[str, str], stage: str) -> dict[str, str]:
    # A replica is named PIPELINE-STAGE-N (a stage's name holds no dash).
    return {replica: node for replica, node in placement.items() if replica.rsplit("-", 2)[-2] == stage}


def test_replicas_run_on_both_nodes_and_a_tagged_stage_only_where_its_tag_is(
    tmp_path: Path, two_nodes: TaskMaster
) -> None:
    """make's two replicas go one to each node; store's two (tag ``store``) both to na; every
    frame crosses to store intact, and the engine sees under 64 KiB per item."""
    cfg = PipelineConfig.model_validate(
        {"name": "placed", "items": ITEMS, "scale_interval_s": 0.1, "stages": _stages(["store"])}
    )

    async def run() -> Any:
        with anyio.fail_after(RUN_TIMEOUT_S):
            return await run_pipeline(cfg, tmp_path / "out", cluster=two_nodes.endpoint, nodes=2)

    result = anyio.run(run)

    assert result.counts() == {"ok": ITEMS, "pruned": 0, "dead": 0, "kept": 0}, result.errors
    assert all(out["intact"] for out in result.outputs.values()), result.outputs
    assert len(result.outputs) == ITEMS
    make, store = _replicas_of(result.placement, "make"), _replicas_of(result.placement, "store")
    assert set(make.values()) == {"na", "nb"}, result.placement  # one on each node
    assert store and set(store.values()) == {"na"}, result.placement
    assert set(result.placement.values()) == {"na", "nb"}
    assert 0 < result.engine_bytes_per_item < METADATA_MOST, result.engine_bytes_per_item
    # Nobody waited on the cluster's directory for a replica: it hears of a new worker with its
    # node's next beat, up to a second after the start (the engine and the pulls asked it and
    # were refused until then; a run's start-up on a warm cluster took a second for it).
    master_log = (tmp_path / "master" / "logs" / "master.jsonl").read_text(encoding="utf-8")
    refused = [line for line in master_log.splitlines() if '"resolve"' in line and "placed-" in line]
    assert not refused, refused[:3]


def _troupe(*args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": import_path(), "COLUMNS": "200"},
    )


def _pipeline_toml(path: Path, name: str, store_tags: list[str]) -> Path:
    lines = [f'[pipeline]\nname = "{name}"\nitems = {ITEMS}\nscale_interval_s = 0.1\n']
    for stage in _stages(store_tags):
        kwargs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in stage["kwargs"].items())
        lines.append(
            f'[[stages]]\nname = "{stage["name"]}"\nactor = "{stage["actor"]}"\n'
            f"replicas = {stage['replicas']}\nkwargs = {{ {kwargs} }}\n"
        )
        if "resources" in stage:
            lines.append(f"resources = {{ tags = {json.dumps(stage['resources']['tags'])} }}\n")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def test_cli_runs_on_the_cluster_and_refuses_tags_no_node_offers(
    tmp_path: Path, two_nodes: TaskMaster
) -> None:
    """``troupe run --cluster --nodes 2 --json`` reports where each replica ran and the bytes
    through the engine; a stage whose tags no node offers exits 2, naming the stage and the
    tags, before any item runs (neither refusal makes its --out); too few nodes is refused
    naming how many answered."""
    good = _pipeline_toml(tmp_path / "good.toml", "cli-placed", ["store"])
    done = _troupe("run", str(good), "--out", str(tmp_path / "out"), "--cluster", two_nodes.endpoint,
                   "--nodes", "2", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["placement"].values()) == {"na", "nb"}, report["placement"]
    assert set(_replicas_of(report["placement"], "store").values()) == {"na"}, report["placement"]
    assert 0 < report["engine_bytes_per_item"] < METADATA_MOST
    assert report["restarted"] == 0
    log = (tmp_path / "out" / "logs" / "local.jsonl").read_text(encoding="utf-8")
    assert "pipeline_job_finished" in log, log[-2000:]  # the run's log, held until the master took it

    # The job keeps its --out: run again into another, it would finish a second, partial dataset.
    elsewhere = _troupe("run", str(good), "--out", str(tmp_path / "out3"), "--cluster", two_nodes.endpoint)
    assert elsewhere.returncode == 2, (elsewhere.stdout, elsewhere.stderr)
    said = elsewhere.stdout + elsewhere.stderr
    assert f"writes to --out {tmp_path / 'out'} (8 of 8 tasks ended there)" in said, said
    assert "Traceback" not in said
    assert not (tmp_path / "out3").exists()  # refused: nothing made there (it had got a log)

    # Its --out records its pipeline: another one is refused before it makes a job, once the
    # folder holds outputs (it wrote its episodes into this one's store, and neither could
    # finalise the dataset again) ...
    (tmp_path / "out" / "data").mkdir()  # as a dataset's files: these stages write none (an
    (tmp_path / "out" / "data" / "file-000.parquet").write_bytes(b"PAR1")  # empty folder is none)
    other = _pipeline_toml(tmp_path / "other.toml", "cli-other", ["store"])
    mixed = _troupe("run", str(other), "--out", str(tmp_path / "out"), "--cluster", two_nodes.endpoint)
    assert mixed.returncode == 2, (mixed.stdout, mixed.stderr)
    assert f"--out {tmp_path / 'out'} was made with" in mixed.stderr, mixed.stderr
    assert "give another --out, or delete the folder" in mixed.stderr  # --fresh cannot, here
    # ... and one run at a time uses it (two at once wrote one dataset of both).
    held = JournalLock.acquire(tmp_path / "out" / ".troupe" / "run.json")
    try:
        again = _troupe("run", str(good), "--out", str(tmp_path / "out"), "--cluster", two_nodes.endpoint)
    finally:
        held.release()
    assert again.returncode == 2, (again.stdout, again.stderr)
    assert f"--out {tmp_path / 'out'} is in use by another troupe run (pid {os.getpid()})" in again.stderr

    nowhere = _pipeline_toml(tmp_path / "nowhere.toml", "cli-nowhere", ["gpu-box"])
    refused = _troupe("run", str(nowhere), "--out", str(tmp_path / "out2"), "--cluster", two_nodes.endpoint)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    said = refused.stdout + refused.stderr
    assert "stages.store" in said and "gpu-box" in said, said
    assert "Traceback" not in said
    assert not (tmp_path / "out2").exists()

    async def too_few() -> None:
        async with connect(two_nodes.endpoint) as rt:
            with pytest.raises(ConfigError, match=r"--nodes 5: 2 node\(s\) alive") as info:
                await wait_for_nodes(rt, two_nodes.endpoint, 5, timeout_s=0.5)
            assert "na" in str(info.value) and "nb" in str(info.value)
            assert str(info.value).endswith(f"`troupe node start --master {two_nodes.endpoint}`")  # no keys
            assert len(await wait_for_nodes(rt, two_nodes.endpoint, 2, timeout_s=0.5)) == 2
            # a run given --keys (not installed in its process) suggests them too (report i14 4)
            with pytest.raises(ConfigError) as keyed:
                await wait_for_nodes(rt, two_nodes.endpoint, 5, timeout_s=0.5, keyed=True)
            assert str(keyed.value).endswith(f"`troupe node start --master {two_nodes.endpoint} --keys DIR`")

    anyio.run(too_few)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--nodes", "2"], "--nodes"),
        (["--cluster", "notanendpoint"], "--cluster"),
    ],
)
def test_cli_refuses_cluster_options_given_wrong(tmp_path: Path, args: list[str], named: str) -> None:
    """``--nodes`` without ``--cluster``, or a ``--cluster`` that is no endpoint: exit 2 and one
    line naming the option, nothing started."""
    pipeline = _pipeline_toml(tmp_path / "p.toml", "cli-bad", ["store"])
    done = _troupe("run", str(pipeline), "--out", str(tmp_path / "out"), *args, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    said = (done.stdout + done.stderr).strip()
    assert named in said and "Traceback" not in said, said


def test_cli_refuses_a_cluster_with_no_master_and_makes_no_out(tmp_path: Path) -> None:
    """``--cluster`` at an endpoint where nothing listens (a typo): exit 1 at once, one line
    naming the endpoint, and --out is not made (it had got a logs folder)."""
    pipeline = _pipeline_toml(tmp_path / "p.toml", "cli-none", ["store"])
    nobody = free_endpoint()
    done = _troupe("run", str(pipeline), "--out", str(tmp_path / "out"), "--cluster", nobody, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    said = (done.stdout + done.stderr).strip()
    assert f"no master answers at {nobody}" in said and "Traceback" not in said, said
    assert not (tmp_path / "out").exists()


def test_a_misspelt_class_installed_here_is_refused_before_the_job_or_out_is_made(
    tmp_path: Path, two_nodes: TaskMaster
) -> None:
    """A class whose package is installed where the run starts is checked there first: a typo
    is one ConfigError naming the field, and neither the master's job nor --out exists (the job
    had been made, 0 of N, and the run failed only once a node tried the class)."""
    cfg = PipelineConfig.model_validate(
        {
            "name": "misspelt",
            "items": 2,
            "stages": [{"name": "load", "actor": "troupe.actors.datagen.lifecycle:SceneLoadr"}],
        }
    )

    async def run() -> list[str]:
        with anyio.fail_after(RUN_TIMEOUT_S):
            with pytest.raises(ConfigError) as refused:
                await run_pipeline(cfg, tmp_path / "out", cluster=two_nodes.endpoint, nodes=2)
            said = str(refused.value)
            assert "stages.load.actor" in said and "has no 'SceneLoadr'" in said, said
            return [j["job_id"] for j in await two_nodes.call("jobs")]

    assert "misspelt" not in anyio.run(run)
    assert not (tmp_path / "out").exists()

    # The command: its template, started at its entry, checks the class (exit 2, one line).
    toml = tmp_path / "misspelt.toml"
    toml.write_text(
        '[pipeline]\nname = "misspelt"\nitems = 2\n\n[[stages]]\nname = "load"\n'
        'actor = "troupe.actors.datagen.lifecycle:SceneLoadr"\n',
        encoding="utf-8",
    )
    entry = [sys.executable, "-c", "from troupe.cli.entry import main; main()"]
    done = subprocess.run(
        [*entry, "run", str(toml), "--out", str(tmp_path / "out"), "--cluster", two_nodes.endpoint],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": import_path(), "COLUMNS": "200"},
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "stages.load.actor" in done.stderr and "has no 'SceneLoadr'" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    assert "misspelt" not in [j["job_id"] for j in anyio.run(lambda: two_nodes.call("jobs"))]


def test_a_stage_no_node_can_import_fails_naming_the_node(tmp_path: Path, two_nodes: TaskMaster) -> None:
    """The nodes import the stage classes themselves: one they cannot import fails the run at
    once, naming the node that tried and where it looked."""
    cfg = PipelineConfig.model_validate(
        {
            "name": "unimportable",
            "items": 2,
            "stages": [
                {
                    "name": "only",
                    "actor": "troupe_absent_stage_module:Stage",
                    "resources": {"tags": ["store"]},
                }
            ],
        }
    )

    async def run() -> Any:
        with anyio.fail_after(RUN_TIMEOUT_S):
            return await run_pipeline(cfg, tmp_path / "out", cluster=two_nodes.endpoint, nodes=2)

    with pytest.raises(StageFailed) as failed:
        anyio.run(run)
    said = str(failed.value)
    assert "stage only: replica unimportable-only-0 on node na could not start" in said, said
    assert "No module named 'troupe_absent_stage_module'" in said and "current folder" in said, said

    # The failed run made nothing: its --out's record binds nothing, and the same pipeline with
    # its class put right runs there (it was refused as made with the misspelt class).
    only = {"name": "only", "actor": f"{STAGES}:MakePayload", "kwargs": {"nbytes": 16}}
    fixed = PipelineConfig.model_validate({"name": "unimportable", "items": 2, "stages": [only]})
    result = anyio.run(lambda: run_pipeline(fixed, tmp_path / "out", cluster=two_nodes.endpoint, nodes=2))
    assert result.counts()["ok"] == 2, result.errors
