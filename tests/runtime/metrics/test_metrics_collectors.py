"""The node's and the master's collectors produce their metric families with the right labels
and values: the node's on fakes (worker handles, a runtime, supervision, a pipeline), the
master's on a real master over the in-memory transport, driven by fake clocks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from support.exposition import strict_families
from troupe.runtime.core.runtime import Runtime, RuntimeStats
from troupe.runtime.errors import AskTimeout, ConfigError
from troupe.runtime.metrics.families import reason_label
from troupe.runtime.metrics.master_metrics import JOB_STATES, MasterCollector
from troupe.runtime.metrics.node_metrics import WORKER_STATES, NodeCollector
from troupe.runtime.node.config import load_node_config
from troupe.runtime.node.worker_handles import HandleState
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.tasks.state import JobState
from troupe.runtime.transports.base import MemoryHub

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(registry: CollectorRegistry) -> Samples:
    """Every sample of a scrape, keyed by name and labels, parsed back from the text format."""
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in found, f"no sample {name}{labels}; have {sorted(k for k in found if k[0] == name)}"
    return found[key]


# -- the node, on fakes ---------------------------------------------------------------------------


class Handle:
    """A worker handle as the collector reads it."""

    def __init__(self, name: str, kind: str, state: str, restarts: int = 0, alive: bool = True) -> None:
        self.spec = SimpleNamespace(name=name, kind=kind)
        self.state = SimpleNamespace(value=state)
        self.process = object() if alive else None
        self.returncode = None if alive else -9
        self.pid = None  # no process to measure
        self.restarts = restarts
        self.endpoint = f"mem://{name}" if state == "running" else None


def worker_status(depth: int, handled: int, bad_frames: int = 0) -> dict[str, Any]:
    stats = RuntimeStats(
        "mem://w",
        {"a": {"kind": "A", "handled": handled, "failed": 1, "mailbox_depth": depth, "mailbox_capacity": 8}},
        0,
        bad_frames,
        0,
    )
    return dataclasses.asdict(stats)


class FakeRuntime:
    def __init__(self, replies: dict[str, Any]) -> None:
        self.replies = replies
        self.transport = SimpleNamespace(refused_counts={"tcp://10.0.0.9:7000": 4})

    def statistics(self) -> RuntimeStats:
        return RuntimeStats(
            "tcp://127.0.0.1:7470",
            {},
            2,
            7,
            1,
            3,
            5,
            throttled_peers=1,
            throttles=4,
            dropped_from_throttled=90,
        )

    async def control(self, endpoint: str, msg_type: str, payload: Any = None, timeout: float = 0) -> Any:
        assert msg_type == "status"
        reply = self.replies[endpoint]
        if reply is None:
            raise AskTimeout("hung")
        return reply


class FakeSupervision:
    starts = 2

    def __init__(self, restarts: dict[tuple[str, str], int] | None = None) -> None:
        self.worker_restarts = {("w-a", "cpu"): 2, ("w-g", "gpu"): 5} if restarts is None else restarts

    async def describe(self) -> dict[str, Any]:
        return {
            "supervisor": {
                "kills_by_reason": {"no_heartbeat": 3, "no_progress": 1},
                "beats_received": 120,
                "beats_dropped": 2,
                "ignored_beats": 1,
                "workers": {"w-a": {"last_beat_age_s": 0.25}},
            }
        }


PIPELINE = {
    "stages": [
        {"name": "plan", "items_in": 10, "items_out": 9, "failed": 1, "latency_s": 0.5, "concurrency": 2.0,
         "throughput": 4.0, "queue_depth": 3, "queue_bound": 16, "busy_fraction": 0.75, "replicas": 2},
        {"name": "render", "items_in": 9, "l_s": 1.0, "N_s": 1.0, "mu_s": 1.0},
    ],
    "elapsed_s": 12.0, "items_ok": 8, "items_pruned": 1, "items_dead": 0,
    "lambda_measured": 0.9, "lambda_succ": 0.8, "lambda_theory": 1.0, "efficiency": 0.9,
}  # fmt: skip


def fake_node(pipeline: Callable[[], Any] | None = None) -> SimpleNamespace:
    handles = {
        "w-a": Handle("w-a", "cpu", "running"),
        "w-b": Handle("w-b", "cpu", "running"),
        "w-g": Handle("w-g", "gpu", "exited", alive=False),
    }
    replies = {"mem://w-a": worker_status(depth=3, handled=40, bad_frames=6), "mem://w-b": None}
    return SimpleNamespace(
        name="host-a",
        uptime_s=12.5,
        workers=handles,
        runtime=FakeRuntime(replies),
        supervision=FakeSupervision(),
        status_extras={"pipeline": pipeline} if pipeline else {},
        worker_exit_listeners=[],
        config=SimpleNamespace(insecure=True),
    )


async def scraped_node(node: SimpleNamespace) -> tuple[NodeCollector, Samples]:
    collector = NodeCollector(node)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(collector)
    await collector.refresh()
    return collector, samples(registry)


async def test_node_workers_alive_by_kind_restarts_and_states() -> None:
    _, found = await scraped_node(fake_node())
    n = {"node": "host-a"}
    assert value(found, "troupe_workers_alive", **n, kind="cpu") == 2
    assert value(found, "troupe_workers_alive", **n, kind="gpu") == 0  # listed, at zero
    assert value(found, "troupe_workers", **n, kind="gpu", state="exited") == 1
    assert value(found, "troupe_worker_restarts_total", **n, worker="w-a", kind="cpu") == 2
    assert value(found, "troupe_worker_restarts_total", **n, worker="w-g", kind="gpu") == 5
    assert value(found, "troupe_worker_restarts_total", **n, worker="w-b", kind="cpu") == 0


async def test_node_lists_every_worker_state_of_each_kind_at_zero_too() -> None:
    """A state no worker is in reads 0 rather than vanishing (ob 8): an alert on a count of
    failed workers, or a panel of running ones, sees the 0."""
    _, found = await scraped_node(fake_node())
    n = {"node": "host-a"}
    for kind in ("cpu", "gpu"):
        for state in WORKER_STATES:
            assert ("troupe_workers", frozenset({**n, "kind": kind, "state": state}.items())) in found
    assert value(found, "troupe_workers", **n, kind="cpu", state="running") == 2
    assert value(found, "troupe_workers", **n, kind="cpu", state="failed") == 0
    assert value(found, "troupe_workers", **n, kind="gpu", state="running") == 0


def test_the_listed_states_are_the_runtime_s_own() -> None:
    """The collectors name the states (metrics imports neither node nor tasks): the same ones."""
    assert tuple(s.value for s in HandleState) == WORKER_STATES
    assert tuple(s.value for s in JobState) == JOB_STATES


async def test_node_worker_restarts_do_not_go_back_when_a_handle_is_replaced() -> None:
    """An undrain starts a drained worker under a fresh handle (its own count 0): the counter
    keeps the node's count, and a worker whose record is gone keeps its series."""
    node = fake_node()
    node.workers["w-a"].restarts = 0  # the fresh handle an undrain made
    node.supervision = FakeSupervision({("w-a", "cpu"): 1, ("w-old", "cpu"): 3})
    _, found = await scraped_node(node)
    n = {"node": "host-a"}
    assert value(found, "troupe_worker_restarts_total", **n, worker="w-a", kind="cpu") == 1
    assert value(found, "troupe_worker_restarts_total", **n, worker="w-old", kind="cpu") == 3


async def test_node_mailboxes_and_bad_input_per_process_a_hung_worker_marked() -> None:
    _, found = await scraped_node(fake_node())
    n = {"node": "host-a"}
    assert value(found, "troupe_mailbox_depth", **n, process="w-a", actor="a") == 3
    assert value(found, "troupe_mailbox_capacity", **n, process="w-a", actor="a") == 8
    assert value(found, "troupe_actor_messages_handled_total", **n, process="w-a", actor="a") == 40
    assert value(found, "troupe_bad_frames_total", **n, process="w-a") == 6
    assert value(found, "troupe_bad_frames_total", **n, process="node") == 7
    assert value(found, "troupe_error_replies_suppressed_total", **n, process="node") == 5
    assert value(found, "troupe_pending_asks", **n, process="node") == 2
    assert value(found, "troupe_refused_messages_total", **n, peer="tcp://10.0.0.9:7000") == 4
    assert value(found, "troupe_worker_answered", **n, worker="w-a") == 1
    assert value(found, "troupe_worker_answered", **n, worker="w-b") == 0  # hung: no mailbox figures
    assert not any(k[0] == "troupe_mailbox_depth" and ("process", "w-b") in k[1] for k in found)


async def test_node_throttled_peers_and_security() -> None:
    _, found = await scraped_node(fake_node())
    n = {"node": "host-a"}
    assert value(found, "troupe_throttled_peers", **n, process="node") == 1
    assert value(found, "troupe_peer_throttles_total", **n, process="node") == 4
    assert value(found, "troupe_throttled_messages_dropped_total", **n, process="node") == 90
    assert value(found, "troupe_curve_enabled", **n) == 0  # no keys installed in this process
    assert value(found, "troupe_insecure", **n) == 1  # as its config says, without keys
    assert value(found, "troupe_refused_peers_total", **n) >= 0


async def test_node_supervision_kills_by_reason_and_heartbeats() -> None:
    _, found = await scraped_node(fake_node())
    n = {"node": "host-a"}
    assert value(found, "troupe_supervisor_kills_total", **n, reason="no_heartbeat") == 3
    assert value(found, "troupe_supervisor_kills_total", **n, reason="no_progress") == 1
    assert value(found, "troupe_supervisor_starts_total", **n) == 2
    assert value(found, "troupe_supervisor_up", **n) == 1
    assert value(found, "troupe_heartbeats_received_total", **n) == 120
    assert value(found, "troupe_heartbeats_bad_total", **n) == 2
    assert value(found, "troupe_worker_heartbeat_age_seconds", **n, worker="w-a") == 0.25


async def test_node_exits_by_reason_from_the_exit_listener_not_stops_on_purpose() -> None:
    node = fake_node()
    collector = NodeCollector(node)  # type: ignore[arg-type]
    (listener,) = node.worker_exit_listeners
    listener(node.workers["w-a"], "no_heartbeat (killed by SIGKILL)")
    listener(node.workers["w-a"], "killed by SIGKILL")
    listener(node.workers["w-a"], "killed by SIGKILL")
    listener(node.workers["w-g"], "exit 3")
    stopped = Handle("w-s", "cpu", "stopped", alive=False)
    listener(stopped, "exit 0")
    registry = CollectorRegistry()
    registry.register(collector)
    found = samples(registry)
    n = {"node": "host-a"}
    assert (
        value(found, "troupe_worker_exits_total", **n, worker="w-a", kind="cpu", reason="no_heartbeat") == 1
    )
    assert value(found, "troupe_worker_exits_total", **n, worker="w-a", kind="cpu", reason="SIGKILL") == 2
    assert value(found, "troupe_worker_exits_total", **n, worker="w-g", kind="gpu", reason="exit_3") == 1
    assert not any(k[0] == "troupe_worker_exits_total" and ("worker", "w-s") in k[1] for k in found)


async def test_node_pipeline_stage_figures_and_lambdas() -> None:
    _, found = await scraped_node(fake_node(lambda: PIPELINE))
    n = {"node": "host-a"}
    assert value(found, "troupe_stage_items_in_total", **n, stage="plan") == 10
    assert value(found, "troupe_stage_items_out_total", **n, stage="plan") == 9
    assert value(found, "troupe_stage_latency_seconds", **n, stage="plan") == 0.5
    assert value(found, "troupe_stage_concurrency", **n, stage="plan") == 2.0
    assert value(found, "troupe_stage_throughput", **n, stage="plan") == 4.0
    assert value(found, "troupe_stage_queue_depth", **n, stage="plan") == 3
    assert value(found, "troupe_stage_busy_ratio", **n, stage="plan") == 0.75
    assert value(found, "troupe_stage_latency_seconds", **n, stage="render") == 1.0  # by its short name
    assert value(found, "troupe_pipeline_lambda", **n) == 0.9
    assert value(found, "troupe_pipeline_lambda_theory", **n) == 1.0
    assert value(found, "troupe_pipeline_lambda_succ", **n) == 0.8
    assert value(found, "troupe_pipeline_efficiency", **n) == 0.9
    assert value(found, "troupe_pipeline_items_total", **n, outcome="ok") == 8
    # a field the figures lack is left out, not shown as zero
    assert ("troupe_stage_queue_depth", frozenset({**n, "stage": "render"}.items())) not in found


async def test_a_pipeline_that_fails_to_report_costs_only_its_own_figures() -> None:
    def broken() -> Any:
        raise RuntimeError("between runs")

    _, found = await scraped_node(fake_node(broken))
    assert value(found, "troupe_workers_alive", node="host-a", kind="cpu") == 2
    assert not any(k[0].startswith("troupe_pipeline") for k in found)


def test_reason_labels_are_short_and_bounded() -> None:
    assert reason_label("no_progress (killed by SIGKILL)") == "no_progress"
    assert reason_label("chaos_kill (killed by SIGKILL)") == "chaos_kill"
    assert reason_label("killed by SIGTERM") == "SIGTERM"
    assert reason_label("killed by signal 77") == "signal_77"
    assert reason_label("exit 1") == "exit_1"
    assert reason_label("Some free text: with 'quotes'") == "other"
    assert reason_label("x" * 500) == "other"


# -- the master, real, in memory ------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_master_tasks_by_job_and_state_dispatches_expiries_nodes_and_workers(tmp_path: Path) -> None:
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    clock, wall = FakeClock(1000.0), FakeClock(1_700_000_000.0)
    master = Master(
        MasterConfig(tick_s=3600, node_timeout_s=10.0),  # ticks only when the test says
        journal,
        book,
        transport=hub.transport(name="master"),
        clock=clock,
        wall_clock=wall,
    )
    registry = CollectorRegistry()
    registry.register(MasterCollector(master))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(master.run)
            await master.ready.wait()
            async with Runtime("client", "client", hub.transport()) as client:

                async def call(msg_type: str, payload: Any) -> Any:
                    return await client.control("mem://master", msg_type, payload, timeout=5)

                await call("node_beat", {"node": "n1", "endpoint": "mem://n1", "resources": {}})
                await call("node_beat", {"node": "n2", "endpoint": "mem://n2", "resources": {}})
                await call("node_beat", {"node": "n3", "endpoint": "mem://n3", "resources": {}})
                await call("node_left", {"node": "n3"})  # stopped on purpose: left, never dead
                for w in ("n1/w0", "n1/w1"):
                    await call(
                        "register_worker",
                        {"worker_id": w, "node": "n1", "endpoint": "mem://w", "pid": 1, "slots": 2},
                    )
                job = {"job": {"name": "j", "kind": "k", "count": 5, "lease_s": 5}}
                await call("submit", {"job": job, "source": "test"})
                reply = await call("request_task", {"worker_id": "n1/w0", "free_slots": 2, "wait_s": 0})
                assert len(reply["leases"]) == 2
                clock.now += 11  # n2 beats no more: dead at the next tick, n1 beats again,
                await call("node_beat", {"node": "n1", "endpoint": "mem://n1", "resources": {}})
                wall.now -= 3600  # and both leases (5 s) run out, whatever the wall clock does
                await master.tick()
                found = samples(registry)
            master.stop()
    finally:
        journal.close()
    m = {"master": "master"}
    assert value(found, "troupe_tasks", **m, job="j", state="pending") == 5  # both copies requeued
    assert value(found, "troupe_dispatches_total", **m) == 2
    assert value(found, "troupe_lease_expiries_total", **m) == 2
    assert value(found, "troupe_leases_outstanding", **m) == 0
    assert value(found, "troupe_jobs", **m, state="running") == 1
    for state in ("done", "failed", "cancelled"):  # no job there: 0, not a vanished series (ob 8)
        assert value(found, "troupe_jobs", **m, state=state) == 0
    assert value(found, "troupe_nodes", **m, state="alive") == 1
    assert value(found, "troupe_nodes", **m, state="dead") == 1
    assert value(found, "troupe_nodes", **m, state="left") == 1
    assert value(found, "troupe_workers_registered", **m, node="n1") == 2
    assert value(found, "troupe_journal_size_bytes", **m) > 0
    assert value(found, "troupe_journal_records_total", **m) > 0


# -- one process, one scrape: each family once -----------------------------------------------------


SECURITY = ("troupe_curve_enabled", "troupe_insecure", "troupe_refused_peers_total")


def test_the_strict_reading_refuses_a_family_twice_or_split() -> None:
    """The check the scrapes below pass: it is not prometheus-client's parser, which takes both."""
    one = '# HELP a h\n# TYPE a gauge\na{n="1"} 1.0\n'
    other = "# HELP b h\n# TYPE b gauge\nb 2.0\n"
    assert set(strict_families(one + other)) == {"a", "b"}
    with pytest.raises(AssertionError, match="a second # HELP a"):
        strict_families(one + other + one.replace('"1"', '"2"'))
    with pytest.raises(AssertionError, match="family a again"):
        strict_families(one + other + 'a{n="2"} 1.0\n')
    with pytest.raises(AssertionError, match="twice"):
        strict_families(one + 'a{n="1"} 3.0\n')


async def test_with_master_the_node_and_the_master_give_each_family_once(tmp_path: Path) -> None:
    """``node start --with-master --metrics``: the master's collector joins the node's in one
    registry (tools/commands/node.py); the process's CURVE families came from both, each with
    its own HELP and TYPE, which strict parsers refuse whole (ob 1). Once now, the node's."""
    hub = MemoryHub()
    journal, book = open_journal(tmp_path / "journal.db", new=True)
    try:
        master = Master(MasterConfig(), journal, book, transport=hub.transport(name="master"))
        registry = CollectorRegistry()
        collector = NodeCollector(fake_node())  # type: ignore[arg-type]
        registry.register(collector)
        registry.register(MasterCollector(master, security=False))
        await collector.refresh()
        families = strict_families(generate_latest(registry).decode())
        alone = CollectorRegistry()
        alone.register(MasterCollector(master))
        master_alone = strict_families(generate_latest(alone).decode())
    finally:
        journal.close()
    for name in SECURITY:
        ((_, labels, _),) = families[name]
        assert labels == {"node": "host-a"}
        ((_, labels, _),) = master_alone[name]  # a master of its own says them, for its process
        assert labels == {"master": "master"}
    assert "troupe_jobs" in families and "troupe_workers" in families


# -- the options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("9464", "must be HOST:PORT"),
        ("127.0.0.1:http", "the port must be a number"),
        ("127.0.0.1:70000", "the port must be a number"),
        ("::1:9464", "IPv6 host in brackets"),
        ("0.0.0.0:9464", "'0.0.0.0:9464' is not on loopback"),
    ],
)
def test_a_bad_metrics_option_is_one_line_naming_it(given: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_node_config(None, metrics=given)
    text = str(caught.value)
    assert "metrics" in text and said in text and "\n" not in text


def test_metrics_off_loopback_with_insecure_and_the_master_rule_alike() -> None:
    assert load_node_config(None, metrics="0.0.0.0:9464", insecure=True).metrics == "0.0.0.0:9464"
    assert load_node_config(None, metrics="[::1]:9464").metrics == "[::1]:9464"
    assert load_node_config(None).metrics is None  # off by default: no port opened
    with pytest.raises(ConfigError, match=r"master metrics: .*'0\.0\.0\.0:9464' is not on loopback"):
        MasterConfig(metrics="0.0.0.0:9464")
    assert MasterConfig(metrics="0.0.0.0:9464", insecure=True).metrics == "0.0.0.0:9464"


def test_the_metrics_refusal_off_loopback_promises_no_protection() -> None:
    """Refused without keys, a metrics endpoint was told "pass --keys DIR ... to authenticate and
    encrypt"; with keys it served every metric to anyone on the LAN in plain HTTP (report ak 10).
    The refusal says what keys do not do for it."""
    for refuse in (
        lambda: load_node_config(None, metrics="0.0.0.0:9464"),
        lambda: MasterConfig(metrics="0.0.0.0:9464"),
    ):
        with pytest.raises(ConfigError) as caught:
            refuse()
        said = str(caught.value)
        assert "authenticate and encrypt" not in said, said
        assert "plain HTTP either way" in said and "firewall it to the scraper" in said, said
