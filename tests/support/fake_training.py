"""A training run's driver on fake nodes (``RecordingNode``s, by endpoint), whose two ranks fail
once and then finish: the driver stops both ranks' workers and spawns them again once (its
restart), so a test sees what the run's spawns and stops ask of each node. Without processes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from support.recording_node import RecordingNode
from troupe.actors.training.train_driver import TrainDriver
from troupe.runtime.placement import Host

__all__ = ["FakeTrainCluster", "train_driver", "two_rank_driver"]


class FakeTrainCluster:
    """The runtime of a training run: controls go to the node at their endpoint, a beat to the
    master is taken, the master's ``status`` lists the nodes (``n0``, ``n1``... in order; those
    of ``alive`` alive, default all, each saying its ``codes``), and every actor answers as a
    rank: rank 0 fails in the first attempt (a peer rank was lost), and every rank is done in the next."""

    address = "tcp://127.0.0.1:9"  # the run's own endpoint

    def __init__(
        self,
        nodes: dict[str, RecordingNode],
        alive: set[str] | None = None,
        codes: dict[str, str] | None = None,
        master_code: str | None = None,
    ) -> None:
        self.nodes = nodes
        self.alive = set(nodes) if alive is None else alive
        self.codes = codes or {}  # the troupe code a node says it runs, by endpoint (none said: older)
        self.master_code = master_code  # and the master (None: older than the field)
        self.beats: list[Any] = []
        self.attempts = 0  # the ranks' starts, counted at rank 0

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        if kind == "owner_beat":
            self.beats.append(payload)
            return {}
        if kind == "ping" and endpoint not in self.nodes:  # the master's: the run watches it
            return {}
        if kind == "status" and endpoint not in self.nodes:  # the master's
            nodes = [
                {"node": f"n{i}", "alive": e in self.alive, "endpoint": e, "code": self.codes.get(e)}
                for i, e in enumerate(self.nodes)
            ]
            return {"master": "master", "nodes": nodes, "code": self.master_code}
        return await self.nodes[endpoint].control(endpoint, kind, payload, timeout)

    def ref(self, path: str) -> _FakeRank:
        return _FakeRank(self, path)


class _FakeRank:
    def __init__(self, cluster: FakeTrainCluster, actor: str) -> None:
        self.cluster = cluster
        self.actor = actor

    async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        if msg_type == "start" and self.actor == "train-rank-0":
            self.cluster.attempts += 1
        if msg_type != "progress":
            return {}
        if self.cluster.attempts < 2:
            return {"state": "failed", "error": "a peer rank was lost"}
        return {"state": "done", "step": 1, "steps": 1, "result": {"losses": [0.5]}}


_UNSET = dict.fromkeys(("weights", "memory_mb", "disk_mb", "cache_dir", "threads", "inline_below_ms"))


def two_rank_driver(cluster: FakeTrainCluster, out: Path, master: str | None = None) -> TrainDriver:
    """A driver of two ranks (no encoder actors: they encode themselves) over ``cluster``'s nodes,
    one rank a node, that restarts them once."""
    return train_driver(cluster, out, master, ranks=2, encoders=0, max_restarts=1)


def train_driver(
    cluster: Any,
    out: Path,
    master: str | None,
    ranks: int,
    encoders: int,
    max_restarts: int,
    encoder_gpus: int = 0,
    host_gpus: tuple[int, ...] = (),
) -> TrainDriver:
    """A driver of ``ranks`` ranks and ``encoders`` encoder actors (none: the ranks encode
    themselves) over ``cluster``'s nodes (``n0``, ``n1``... with ``host_gpus`` GPUs each, 0 where
    not given), placed round-robin."""
    cfg = SimpleNamespace(
        encoders=SimpleNamespace(
            count=encoders, tags=(), gpus=encoder_gpus, encoder="m:E", encoder_kwargs={}, **_UNSET
        ),
        trainers=SimpleNamespace(ranks=ranks, tags=(), gpus=0, threads=None),
        train=SimpleNamespace(
            local_encoding=encoders == 0,
            max_restarts=max_restarts,
            checkpoint_dir=str(out / "ck"),
            steps=1,
        ),
        datagen=None,
        to_data=dict,
    )
    gpus = dict(enumerate(host_gpus))
    hosts = [Host.anything(f"n{i}", endpoint, gpus.get(i, 0)) for i, endpoint in enumerate(cluster.nodes)]
    more = {} if master is None else {"master": master}
    return TrainDriver(cluster, cfg, out, hosts, lambda _line: None, None, **more)  # type: ignore[arg-type]
