"""``troupe run --metrics HOST:PORT`` (``run_pipeline(metrics=)``) serves the pipeline's metric
families (finding ob 2: docs/METRICS.md listed them, and nothing the CLI starts served them).

A one-host run's node serves its own families and the pipeline's, labelled ``node="local"``; a
run on a cluster's nodes, which never see its engine, serves the pipeline's from its own
process, labelled with the pipeline's name. Both are scraped while an item waits at a gate (a
file), so the figures are read mid-run, not raced; every scrape is read strictly (each family
once). The endpoint lives as long as the run. A port in use, or an address the run may not
serve at, is refused before anything starts, in one line, with exit status 2.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from support.chaos import TaskMaster
from support.cluster import ctl
from support.exposition import strict_families
from support.gated_pipeline import gated_config
from support.hook_stages import read_records
from support.run_resume_helpers import running
from support.tagged_nodes import tagged_nodes
from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.runner import run_pipeline
from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

WAIT_S = 180.0  # a bound on waiting for another process, not on its speed
STAGES = "support.direct_plane_stages"

GATED = """
[pipeline]
name = "gated"
items = 3

[[stages]]
name = "make"
actor = "{stages}:MakePayload"
kwargs = {{ nbytes = 1024, log = "{log}" }}

[[stages]]
name = "check"
actor = "{stages}:CheckPayload"
kwargs = {{ nbytes = 1024, log = "{log}", gate = "{gate}" }}
"""

Families = dict[str, list[tuple[str, dict[str, str], float]]]


def free_address(host: str = "127.0.0.1") -> str:
    """A HOST:PORT that was free a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


def scrape(address: str) -> Families:
    """GET /metrics, read strictly."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        assert answer.status == 200
        return strict_families(answer.read().decode())


def sample(families: Families, name: str, **labels: str) -> float:
    found = [v for n, ls, v in families.get(name, []) if ls == labels]
    assert len(found) == 1, f"no one {name}{labels}: {families.get(name)}"
    return found[0]


def waiting(log: Path) -> bool:
    return any(r["stage"] == "wait" for r in read_records(log))


def test_a_one_host_run_s_node_serves_its_families_and_the_pipeline_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, gate, metrics = tmp_path / "seen.jsonl", tmp_path / "gate", free_address()
    config = tmp_path / "gated.toml"
    config.write_text(GATED.format(stages=STAGES, log=log, gate=gate), encoding="utf-8")
    args = ["run", str(config), "--out", str(tmp_path / "out"), "--endpoint", free_endpoint(),
            "--master", free_endpoint(), "--metrics", metrics]  # fmt: skip
    monkeypatch.setenv("PYTHONPATH", import_path())  # the run's workers import the stages
    with running(args, tmp_path, "run") as run:
        run.wait_until("an item at the gate", lambda: waiting(log), WAIT_S)
        found = scrape(metrics)
        assert sample(found, "troupe_stage_items_in_total", node="local", stage="make") >= 1
        assert sample(found, "troupe_stage_queue_bound", node="local", stage="check") > 0
        assert sample(found, "troupe_pipeline_items_total", node="local", outcome="ok") == 0
        assert "troupe_pipeline_lambda_theory" in found
        assert sample(found, "troupe_workers", node="local", kind="check", state="running") >= 1
        assert "troupe_supervisor_up" in found  # the node's own families beside them
        gate.touch()
        assert run.wait(timeout=WAIT_S) == 0, run.text()[-3000:]
        assert not run.survivors(), "processes of the run left behind"
    with pytest.raises(urllib.error.URLError):  # the endpoint went with the run
        scrape(metrics)


@pytest.fixture
def one_node(tmp_path: Path, master: TaskMaster) -> Iterator[TaskMaster]:
    with tagged_nodes(master, tmp_path, {"na": ("127.0.0.2", "any")}, env={"PYTHONPATH": import_path()}):
        yield master


def test_a_run_on_a_cluster_serves_the_pipeline_s_families_from_its_own_process(
    tmp_path: Path, one_node: TaskMaster
) -> None:
    log, gate, metrics = tmp_path / "seen.jsonl", tmp_path / "gate", free_address()
    cfg = gated_config("onnodes", 3, log, gate)
    seen: list[Families] = []

    async def scraped_mid_run() -> Any:
        async with anyio.create_task_group() as tg:
            done: list[Any] = []

            async def run() -> None:
                done.append(
                    await run_pipeline(cfg, tmp_path / "out", cluster=one_node.endpoint, metrics=metrics)
                )

            tg.start_soon(run)
            with anyio.fail_after(WAIT_S):
                while not waiting(log):
                    await anyio.sleep(0.05)
            seen.append(await anyio.to_thread.run_sync(scrape, metrics))
            gate.touch()
        return done[0]

    result = anyio.run(scraped_mid_run)
    assert result.counts()["ok"] == 3, result.errors
    (found,) = seen
    assert sample(found, "troupe_stage_items_in_total", pipeline="onnodes", stage="make") >= 1
    assert sample(found, "troupe_stage_replicas", pipeline="onnodes", stage="check") >= 1
    assert "troupe_pipeline_lambda" in found
    assert "troupe_workers" not in found  # the nodes' own are theirs to serve
    with pytest.raises(urllib.error.URLError):
        scrape(metrics)


def test_run_pipeline_refuses_a_taken_port_before_it_starts_anything(tmp_path: Path) -> None:
    """On running nodes the run binds its endpoint before it makes anything in ``out``."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        cfg = gated_config("taken", 1, tmp_path / "seen.jsonl", tmp_path / "gate")
        with pytest.raises(ConfigError, match=f"metrics {address}: cannot listen there"):
            anyio.run(lambda: run_pipeline(cfg, tmp_path / "out", node=free_endpoint(), metrics=address))
    assert not (tmp_path / "out").exists()


def test_troupe_run_refuses_what_it_cannot_serve_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    monkeypatch.delenv("TROUPE_KEYS", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        endpoint = free_endpoint()
        shared = endpoint.removeprefix("tcp://")
        cases = {
            "in use": (["--metrics", address], f"metrics {address} is in use"),
            "off loopback": (["--metrics", "0.0.0.0:9464"], "--metrics 0.0.0.0:9464 is not on loopback"),
            "no address": (["--metrics", "9464"], "--metrics: '9464' must be HOST:PORT"),
            "the node's port": (["--endpoint", endpoint, "--metrics", shared], "are one port"),
            "a cluster without keys": (
                ["--cluster", free_endpoint(), "--metrics", "0.0.0.0:9464"],
                "the run has no CURVE keys",
            ),
        }
        for case, (extra, said) in cases.items():
            run = ctl("run", "--out", str(out), *extra, timeout=120)
            assert run.returncode == 2 and run.stdout == "", (case, run.stderr)
            assert said in " ".join(run.stderr.split()), (case, run.stderr)
    assert not out.exists()  # nothing started, nothing made
