"""A training run whose encoder worker its node restarted (SIGKILLed, say) asks it for its cache
figures where it listens now, as the run ends: the run had asked at the dead process's address,
waited out the ask's 20 s, and reported the live encoder as not answering, its figures dropped.
Without processes: a fake node that says where the restarted encoder listens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from support.fake_training import FakeTrainCluster, train_driver
from support.recording_node import RecordingNode
from troupe.runtime.core.directory import Directory
from troupe.runtime.errors import AskTimeout

HANG_GUARD_S = 60  # a bound on a hang, never on speed
NODE = "tcp://127.0.0.1:1"
ENCODER, WORKER = "train-encode-0", "w-train-encode-0"
FIRST, AGAIN = "tcp://127.0.0.1:7", "tcp://127.0.0.1:8"  # the encoder's endpoint, then after its restart
STATS = {"groups": 0, "encoded": 3, "cache": {"misses": 6, "disk_writes": 6}}


class RestartingNode(RecordingNode):
    """Spawns the workers, and says the encoder listens at ``AGAIN`` once asked (its restart)."""

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        await super().control(endpoint, kind, payload, timeout)
        if kind == "spawn_worker":
            actor = payload["actors"][0]["name"]
            return {"node": "n0", "actor_endpoints": {actor: FIRST}}
        if kind == "resolve" and payload == {"address": f"{WORKER}/{ENCODER}"}:
            return {"address": f"n0/{WORKER}/{ENCODER}", "endpoint": AGAIN}
        return {}


class Cluster(FakeTrainCluster):
    """Its ranks finish; its encoder answers ``stats`` only at the endpoint it listens at now."""

    def __init__(self) -> None:
        super().__init__({NODE: RestartingNode()})
        self.directory = Directory("")
        self.attempts = 2  # the ranks are done at their first start

    def ref(self, path: str) -> Any:
        cluster = self

        class Ref:
            async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
                if msg_type != "stats":
                    return await FakeTrainCluster.ref(cluster, path).ask(msg_type, payload, timeout)
                if cluster.directory.cached(path) != AGAIN:  # the process that listened there is gone
                    raise AskTimeout(f"ask 'stats' to {path}: no reply within {timeout} s")
                return STATS

        return Ref()


async def test_a_restarted_encoder_is_asked_for_its_figures_where_it_listens_now(tmp_path: Path) -> None:
    cluster = Cluster()
    driver = train_driver(cluster, tmp_path, None, ranks=1, encoders=1, max_restarts=0)
    driver.cfg.encoders.cache_dir = str(tmp_path / "latents")
    with anyio.fail_after(HANG_GUARD_S):
        result = await driver.main(False)
    cache = result.latent_cache
    assert cache is not None and cache["unanswered"] == [] and not cache["partial"], cache
    assert (cache["misses"], cache["disk_writes"], cache["groups_encoded"]) == (6, 6, 3)
