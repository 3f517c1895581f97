"""The public Python API ``run_pipeline_sync`` / ``run_pipeline`` with real processes.

A pipeline TOML (written to ``tmp_path``) of the test stages in ``tests/support/hook_stages.py``;
the replicas import them through ``PYTHONPATH``. What a user relies on: the counts and outputs
of a run into ``out``; a rerun that answers at once, starting nothing; a rerun after a failed
``finalize`` that finalizes without running items again; a changed pipeline, a missing ``out``
or a stage class that does not import refused with an error naming the cause, before anything
starts; ``fresh=True``; ``node=`` running the replicas on that node, stopping them after,
refusing a class installed here as ``troupe run`` does, and failing by stage when the node
cannot run one only it imports; the pytest plugin's ``cluster.run_pipeline``.
The suite's conftest fails a test that leaves a process behind.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import psutil
import pytest

from support.hook_stages import read_records
from troupe.runtime.errors import ConfigError, StageFailed
from troupe.runtime.pipeline.runner import RunStart, run_pipeline_sync
from troupe.runtime.testing.cluster import Cluster
from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = pytest.mark.e2e

PIPELINE = """\
[pipeline]
name = "api"
items = 10
seed_start = 0

[[stages]]
name = "a"
actor = "support.hook_stages:RecordingStage"
kwargs = {{ log = "{log}", label = "a", prune_every = 4 }}

[[stages]]
name = "b"
actor = "{b_actor}"
kwargs = {{ log = "{log}", label = "b" }}
"""
RECORDING = "support.hook_stages:RecordingStage"


@pytest.fixture(autouse=True)
def workers_import_the_test_stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The replicas (and the class check's child) import what this process imports."""
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


def _toml(tmp_path: Path, log: str = "{out}/records.jsonl", b_actor: str = RECORDING) -> Path:
    path = tmp_path / "api.toml"
    path.write_text(PIPELINE.format(log=log, b_actor=b_actor), encoding="utf-8")
    return path


def _task_id(i: int) -> str:
    return f"api-{i:06d}"


def _starts() -> tuple[list[RunStart], Callable[[RunStart], None]]:
    seen: list[RunStart] = []
    return seen, seen.append


def test_a_toml_run_into_out_then_a_rerun_is_complete_and_other_items_are_refused(tmp_path: Path) -> None:
    """A TOML path with ``out`` and ``items``: counts and the last stage's outputs are right and
    the stages were told the run. Run again into that ``out``: ``already_complete``, with the
    first run's finals, and nothing started. Other items into that ``out``: ConfigError naming
    ``items``, and nothing changed."""
    toml, out = _toml(tmp_path), tmp_path / "out"
    seen, on_start = _starts()
    result = run_pipeline_sync(toml, out=out, items=6, on_start=on_start)

    assert result.counts() == {"ok": 4, "pruned": 2, "dead": 0, "kept": 0}  # seeds 0 and 4 pruned
    assert result.outputs == {_task_id(i): {"task_id": _task_id(i), "seed": i} for i in (1, 2, 3, 5)}
    assert not result.already_complete
    assert set(result.finals) == {"a", "b"}
    assert [(s.items, s.before, s.stages, s.out) for s in seen] == [(6, 0, 2, out.resolve())]
    log = out / "records.jsonl"
    records = read_records(log)
    starts = [r for r in records if r["hook"] == "start"]
    assert {r["stage"]: (r["items"], r["out"], r["fresh"]) for r in starts} == {
        "a": (6, str(out.resolve()), False),
        "b": (6, str(out.resolve()), False),
    }

    seen.clear()
    again = run_pipeline_sync(toml, out=out, items=6, on_start=on_start)
    assert again.already_complete
    assert again.finals == result.finals
    assert again.outcomes == {} and again.counts()["ok"] == 0
    assert seen == [], "a complete run started a cluster"
    assert read_records(log) == records, "a stage ran again"

    with pytest.raises(ConfigError) as refused:
        run_pipeline_sync(toml, out=out, items=8, on_start=on_start)
    assert "items=6" in str(refused.value) and "items=8" in str(refused.value), str(refused.value)
    assert seen == [] and read_records(log) == records


def test_fresh_starts_anew_in_the_same_out(tmp_path: Path) -> None:
    """``fresh=True`` into a finished ``out`` runs every item again (none kept), telling the
    stages' ``start`` it is fresh."""
    toml, out = _toml(tmp_path), tmp_path / "out"
    run_pipeline_sync(toml, out=out, items=4)
    log = out / "records.jsonl"
    first = read_records(log)
    log.unlink()  # --fresh leaves a stage's own files; this test reads only the new run's records

    result = run_pipeline_sync(toml, out=out, items=4, fresh=True)
    assert not result.already_complete
    assert result.counts() == {"ok": 3, "pruned": 1, "dead": 0, "kept": 0}
    records = read_records(log)
    assert {r["stage"]: r["fresh"] for r in records if r["hook"] == "start"} == {"a": True, "b": True}
    assert len([r for r in records if r["hook"] == "process" and r["stage"] == "a"]) == 4
    assert len([r for r in first if r["hook"] == "process" and r["stage"] == "a"]) == 4


def test_a_rerun_after_a_failed_finalize_runs_no_item_again_and_finalizes(tmp_path: Path) -> None:
    """A finalize that failed leaves the run unfinished: the rerun into that ``out`` processes
    no item again (they all ended), runs ``finalize`` again, and then the run is complete."""
    broken = tmp_path / "finalize-is-broken"
    broken.touch()
    log = tmp_path / "records.jsonl"
    toml = tmp_path / "failing.toml"
    toml.write_text(
        PIPELINE.format(log=log, b_actor="support.hook_stages:FailingFinalizeStage").replace(
            'label = "b" }', f'label = "b", fail_while = "{broken}" }}'
        ),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    with pytest.raises(StageFailed, match="stage b"):
        run_pipeline_sync(toml, out=out, items=4)
    first = read_records(log)
    assert len([r for r in first if r["hook"] == "process"]) == 4 + 3  # seed 0 pruned by a
    broken.unlink()

    seen, on_start = _starts()
    result = run_pipeline_sync(toml, out=out, items=4, on_start=on_start)
    assert not result.already_complete
    assert [s.before for s in seen] == [4]
    records = read_records(log)[len(first) :]
    assert [r["hook"] for r in records if r["hook"] != "start"] == ["finalize", "finalize"]
    assert result.finals["b"]["summary"] == "b finalised 4 items"

    assert run_pipeline_sync(toml, out=out, items=4).already_complete


def test_out_in_kwargs_without_out_is_refused_naming_the_kwarg(tmp_path: Path) -> None:
    """A stage kwarg using ``{out}`` with no ``out`` given: ConfigError naming the kwarg and
    saying to pass ``out``; nothing starts."""
    seen, on_start = _starts()
    with pytest.raises(ConfigError) as refused:
        run_pipeline_sync(_toml(tmp_path), items=2, on_start=on_start)
    message = str(refused.value)
    assert "stages.a.kwargs.log" in message and "out=" in message, message
    assert seen == []


def test_a_stage_class_that_does_not_import_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """``stages.b.actor`` names a module that does not exist: ConfigError naming the field and
    the module, at once, with no cluster started and nothing written to ``out``."""
    toml = _toml(tmp_path, log=str(tmp_path / "records.jsonl"), b_actor="support.no_such_stages:Stage")
    out = tmp_path / "out"
    seen, on_start = _starts()
    with pytest.raises(ConfigError) as refused:
        run_pipeline_sync(toml, out=out, items=2, on_start=on_start)
    message = str(refused.value)
    assert "stages.b.actor" in message and "no_such_stages" in message, message
    assert str(toml) in message
    assert seen == [] and not out.exists()
    assert read_records(tmp_path / "records.jsonl") == []


def test_a_running_node_hosts_the_replicas(tmp_path: Path, troupe_cluster: Callable[..., Cluster]) -> None:
    """``node=`` a running node with no workers of its own: the replicas are its workers
    (children of its process), and they are stopped when the run ends."""
    cluster = troupe_cluster("[node]\n", name="host")
    log = tmp_path / "records.jsonl"
    result = run_pipeline_sync(_toml(tmp_path, log=str(log)), items=4, node=cluster.endpoint)

    assert result.counts() == {"ok": 3, "pruned": 1, "dead": 0, "kept": 0}
    records = read_records(log)
    assert records and {r["ppid"] for r in records} == {cluster.proc.pid}
    pids = {r["pid"] for r in records}
    deadline = time.monotonic() + 30  # bounded poll: the node stops them on its own schedule
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(pid) for pid in pids), "the run left its replicas running"


BAD_STAGES = [
    pytest.param("support.no_such_stages:Stage", "no_such_stages", id="module-missing"),
    pytest.param("nodeonly_stages:NotAStage", "not a StageActor", id="not-a-stage"),
]


def _node_only(tmp_path: Path) -> dict[str, str]:
    """A module of stage classes that only the node imports (on its PYTHONPATH, not this
    process's): the run leaves its check to the node, as for a class installed on its host only."""
    folder = tmp_path / "nodeonly"
    folder.mkdir()
    (folder / "nodeonly_stages.py").write_text("from support.hook_stages import NotAStage  # noqa: F401\n")
    return {"PYTHONPATH": str(folder)}


@pytest.mark.parametrize(("actor", "why"), BAD_STAGES)
def test_a_running_node_that_cannot_run_a_stage_class_fails_the_run_naming_the_stage(
    tmp_path: Path, troupe_cluster: Callable[..., Cluster], actor: str, why: str
) -> None:
    """``node=`` checks only the classes installed here (the node's import path is its own);
    a stage class the node's workers cannot run ends the run with StageFailed naming the stage
    and why, not with a timeout, before any item is processed."""
    cluster = troupe_cluster("[node]\n", name="host", env=_node_only(tmp_path))
    log = tmp_path / "records.jsonl"
    with pytest.raises(StageFailed) as failed:
        run_pipeline_sync(_toml(tmp_path, log=str(log), b_actor=actor), items=2, node=cluster.endpoint)
    message = str(failed.value)
    assert "stage b" in message and why in message, message
    assert not [r for r in read_records(log) if r["hook"] == "process"]


@pytest.mark.parametrize(
    "actor",
    [
        pytest.param("support.no_such_stages:Stage", id="module-missing"),
        pytest.param("nodeonly_stages:NotAStage", id="not-a-stage"),
    ],
)
def test_a_failed_run_on_a_running_node_leaves_none_of_its_workers_running(
    tmp_path: Path, troupe_cluster: Callable[..., Cluster], actor: str
) -> None:
    """Whatever ended the run, the replicas it started on someone else's node are stopped."""
    cluster = troupe_cluster("[node]\n", name="host", env=_node_only(tmp_path))
    with pytest.raises(StageFailed):
        run_pipeline_sync(
            _toml(tmp_path, log=str(tmp_path / "records.jsonl"), b_actor=actor),
            items=2,
            node=cluster.endpoint,
        )
    workers = anyio.run(cluster.status)["workers"]
    assert [w["name"] for w in workers if w["state"] == "running"] == [], workers


async def test_the_plugin_cluster_runs_a_pipeline_with_its_node_and_master(
    tmp_path: Path, troupe_cluster: Callable[..., Cluster]
) -> None:
    """The pytest plugin's way (README "Your own pipeline"): ``cluster.run_pipeline`` on a
    cluster with a master runs the items as the master's job, the replicas on its node."""
    cluster = troupe_cluster("[node]\n", name="host", master=True)
    log = tmp_path / "records.jsonl"
    result = await cluster.run_pipeline(_toml(tmp_path, log=str(log)), items=5)

    assert result.counts() == {"ok": 3, "pruned": 2, "dead": 0, "kept": 0}  # seeds 0 and 4
    assert set(result.outputs) == {_task_id(i) for i in (1, 2, 3)}
    assert {r["ppid"] for r in read_records(log)} == {cluster.proc.pid}
    jobs = await cluster.master_control("jobs")
    assert [j["job_id"] for j in jobs] == ["api"], jobs


def _held(endpoint: str) -> socket.socket:
    """A listening socket on ``endpoint``'s port: another process's, as far as troupe can tell."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
    sock.listen()
    return sock


def test_default_endpoints_taken_as_the_run_starts_give_way_to_free_ports(tmp_path: Path) -> None:
    """`troupe run` finds its default ports free, then imports for a second or two before it
    binds them: a second run started at once took them meanwhile and failed ("Address already
    in use"). Defaults that may move bind a free port instead, and say so; given ones do not."""
    node, master = free_endpoint(), free_endpoint()
    told: list[str] = []
    with _held(node), _held(master):
        result = run_pipeline_sync(
            _toml(tmp_path),
            out=tmp_path / "out",
            node_endpoint=node,
            master_endpoint=master,
            endpoints_may_move=True,
            on_event=told.append,
        )
        assert result.counts()["ok"] + result.counts()["pruned"] == 10
        both = f"{node} and {master} were taken as the run started"
        said = [line for line in told if line.startswith(both)]
        assert said and ", its master on tcp://127.0.0.1:" in said[0], told
        with pytest.raises(ConfigError, match=r"is another (master|node)"):  # given: refused, not moved
            run_pipeline_sync(
                _toml(tmp_path), out=tmp_path / "given", node_endpoint=node, master_endpoint=master
            )


def _said_master_moved(tmp_path: Path, node: str, master: str, **may_move: bool) -> str:
    """What a run on ``node`` says of its master's ``master``, taken as the run started."""
    told: list[str] = []
    with _held(master):
        run_pipeline_sync(
            _toml(tmp_path),
            out=tmp_path / "out",
            node_endpoint=node,
            master_endpoint=master,
            on_event=told.append,
            **may_move,
        )
    said = [line for line in told if line.startswith(f"{master} was taken as the run started")]
    assert said, told
    return said[0]


def test_a_run_whose_master_alone_lost_the_race_says_where_its_master_went(tmp_path: Path) -> None:
    """Report sh 9: the master's default taken as the run started moved it, and the run said
    nothing (only a moved node was said): its `ctl jobs --master` could not be found."""
    node, master = free_endpoint(), free_endpoint()
    said = _said_master_moved(tmp_path, node, master, endpoints_may_move=True)
    assert f"this run's node listens on {node}, its master on tcp://127.0.0.1:" in said, said


def test_a_given_node_endpoint_stays_while_the_master_s_default_taken_meanwhile_moves(tmp_path: Path) -> None:
    """`troupe run --endpoint X` (its master on the default): two such runs at once (two tests, -n 2)
    both found the master's default free, and the second failed to bind it ("cannot bind a mailbox
    at tcp://127.0.0.1:7478: Address already in use"), since only a run given neither endpoint
    could move. The master's default moves alone now; the given node endpoint is kept."""
    node, master = free_endpoint(), free_endpoint()
    said = _said_master_moved(tmp_path, node, master, master_may_move=True)
    assert f"this run's node listens on {node}, its master on tcp://127.0.0.1:" in said, said
    with _held(node), pytest.raises(ConfigError, match=r"is another (master|node)"):  # given: refused
        run_pipeline_sync(
            _toml(tmp_path),
            out=tmp_path / "given",
            node_endpoint=node,
            master_endpoint=master,
            master_may_move=True,
        )
