"""A training run whose encoder actors compute different functions (a user's factory that builds
other weights in each process: unseeded) is refused as they start, in one line naming their
fingerprints: it had trained on silently, a batch's latents depending on which actor encoded
which group. Where the encoders' nodes run other troupe code (a cluster between the steps of an
upgrade: the fingerprint covers troupe's encoder code), the line says that, not the seeding
(report mv 1). Without processes: fake nodes whose encoders answer ``stats`` with a
fingerprint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from support.fake_training import FakeTrainCluster, train_driver
from support.recording_node import RecordingNode
from troupe.actors.training.train_result import TrainingFailed
from troupe.runtime.errors import leaf_errors

HANG_GUARD_S = 60  # a bound on a hang, never on speed


class Cluster(FakeTrainCluster):
    """Its ranks finish at their first start; its encoders have the fingerprints given."""

    def __init__(self, fingerprints: dict[str, str], codes: dict[str, str] | None = None) -> None:
        endpoints = ["tcp://127.0.0.1:1"] if codes is None else list(codes)
        nodes = {e: RecordingNode() for e in endpoints}
        super().__init__(nodes, codes=codes, master_code="0.1.0+f1e0f934")
        self.fingerprints = fingerprints
        self.attempts = 2

    def ref(self, path: str) -> Any:
        cluster = self

        class Ref:
            async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
                if msg_type == "stats":
                    return {"fingerprint": cluster.fingerprints[path], "groups": 0}
                return await FakeTrainCluster.ref(cluster, path).ask(msg_type, payload, timeout)

        return Ref()


def _driver(cluster: Cluster, out: Path, master: str | None = None) -> Any:
    driver = train_driver(cluster, out, master, ranks=1, encoders=2, max_restarts=0)
    driver.cfg.encoders.cache_dir = str(out / "latents")
    return driver


async def test_encoders_of_different_fingerprints_are_refused_before_the_ranks_start(tmp_path: Path) -> None:
    cluster = Cluster({"train-encode-0": "a" * 64, "train-encode-1": "b" * 64})
    driver = _driver(cluster, tmp_path)
    with anyio.fail_after(HANG_GUARD_S), pytest.raises(BaseExceptionGroup) as raised:
        await driver.main(False)  # the CLI says its one TrainingFailed
    (failed,) = leaf_errors(raised.value)
    message = str(failed)
    assert isinstance(failed, TrainingFailed)
    assert "the encoder actors compute different functions" in message and "\n" not in message
    assert f"train-encode-0 {'a' * 12}, train-encode-1 {'b' * 12}" in message and "'m:E'" in message
    spawned = [s["name"] for s in cluster.nodes["tcp://127.0.0.1:1"].spawns]
    assert spawned == ["w-train-encode-0", "w-train-encode-1"]  # no rank started


async def test_encoders_of_one_fingerprint_train(tmp_path: Path) -> None:
    cluster = Cluster({"train-encode-0": "a" * 64, "train-encode-1": "a" * 64})
    with anyio.fail_after(HANG_GUARD_S):
        result = await _driver(cluster, tmp_path).main(False)
    assert result.steps == 1 and result.latent_cache is not None and not result.latent_cache["unanswered"]


@pytest.mark.parametrize("older_said", ["0.1.0+8415e640", None])
async def test_encoders_on_nodes_of_other_code_are_refused_naming_the_codes(
    tmp_path: Path, older_said: str | None
) -> None:
    codes = {"tcp://127.0.0.1:1": "0.1.0+f1e0f934", "tcp://127.0.0.1:2": older_said}
    cluster = Cluster({"train-encode-0": "a" * 64, "train-encode-1": "b" * 64}, codes)  # type: ignore[arg-type]
    driver = _driver(cluster, tmp_path, master="tcp://127.0.0.1:3")
    with anyio.fail_after(HANG_GUARD_S), pytest.raises(BaseExceptionGroup) as raised:
        await driver.main(False)
    (failed,) = leaf_errors(raised.value)
    message = str(failed)
    assert isinstance(failed, TrainingFailed) and "\n" not in message
    older = older_said or "unknown (older troupe)"
    assert f"run on nodes of different troupe code (n0 0.1.0+f1e0f934, n1 {older})" in message
    assert "Upgrading a cluster" in message and "seed them" not in message


async def test_encoders_of_one_code_that_differ_are_still_said_to_differ(tmp_path: Path) -> None:
    codes = {"tcp://127.0.0.1:1": "0.1.0+f1e0f934", "tcp://127.0.0.1:2": "0.1.0+f1e0f934"}
    cluster = Cluster({"train-encode-0": "a" * 64, "train-encode-1": "b" * 64}, codes)
    driver = _driver(cluster, tmp_path, master="tcp://127.0.0.1:3")
    with anyio.fail_after(HANG_GUARD_S), pytest.raises(BaseExceptionGroup) as raised:
        await driver.main(False)
    (failed,) = leaf_errors(raised.value)
    assert "the encoder actors compute different functions" in str(failed)
