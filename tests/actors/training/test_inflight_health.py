"""Each rank's view of its encoder actors' health: a failed actor is passed over for a back-off
that doubles while it keeps failing, probed by one group at a time, and given its share back once
it answers; the healthy actors share its turns evenly. The clock is a fake one that the train
steps move, so the back-offs run in no real time."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import pytest
import torch

from troupe.actors.encoders.light import LightEncoder
from troupe.actors.training.inflight import (
    GroupFailed,
    InflightConfig,
    SampleGroup,
    encode_video,
    probe_wait_s,
    train_remote,
)
from troupe.actors.training.inflight_dispatch import Dispatch
from troupe.runtime import Unreachable

STEP_S = 0.25  # fake seconds each train step takes


def _batches(n: int, batch: int = 4) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    return [
        {"video": torch.randint(0, 256, (batch, 3, 2, 4, 4), generator=g, dtype=torch.uint8)}
        for _ in range(n)
    ]


class _Cluster:
    """Fake encoder actors on a fake clock: ``down(actor, now)`` says whether an actor fails an ask
    sent at ``now``; every ask is logged as ``(actor, time sent, ok)``."""

    def __init__(self, down: Any) -> None:
        self.now = 0.0
        self.down = down
        self.asks: list[tuple[int, float, bool]] = []
        self.module = LightEncoder(seed=3).eval()

    def clock(self) -> float:
        return self.now

    async def encode(self, actor: int, group: SampleGroup) -> torch.Tensor:
        sent = self.now
        failing = self.down(actor, sent)
        self.asks.append((actor, sent, not failing))
        await anyio.lowlevel.checkpoint()  # replies come back interleaved, as over the wire
        if failing:
            raise Unreachable(f"encoder {actor} is gone")
        return encode_video(self.module, group.video)

    def step(self, batch: dict[str, Any]) -> float:
        self.now += STEP_S
        return float(batch["latents"].sum())

    def sent_to(self, actor: int) -> list[tuple[float, bool]]:
        return [(t, ok) for a, t, ok in self.asks if a == actor]


def _spread(counts: list[int]) -> int:
    return max(counts) - min(counts)


async def test_a_dead_actor_gets_only_probes_spaced_by_its_doubling_back_off() -> None:
    cluster = _Cluster(lambda actor, _now: actor == 2)
    batches = _batches(40)
    config = InflightConfig(inflight=2, group_size=1, retry_after_s=1.0, retry_after_max_s=4.0)
    result = await train_remote(batches, cluster.step, cluster.encode, 4, config, clock=cluster.clock)

    # No hole: every batch trained, on its own latents.
    expected = [float(encode_video(cluster.module, b["video"]).sum()) for b in batches]
    assert result.losses == pytest.approx(expected)
    sends = [t for t, _ in cluster.sent_to(2)]
    first_failure = sends[0]
    # Asks sent before the first failure came back were in flight already; after it, only probes,
    # each one back-off after the previous (1, 2, then 4 s, the cap), never two in one period.
    probes = [t for t in sends if t > first_failure]
    assert len(probes) >= 3, sends
    gaps = [b - a for a, b in zip([first_failure, *probes], probes, strict=False)]
    backoffs = [min(1.0 * 2**i, 4.0) for i in range(len(gaps))]
    assert all(gap >= backoff for gap, backoff in zip(gaps, backoffs, strict=True)), (gaps, backoffs)
    assert result.requests[2] == len(sends) and result.retries == len(sends)
    assert result.skipped[2] > 0 and [result.skipped[a] for a in (0, 1, 3)] == [0, 0, 0]
    # The healthy three took the dead one's turns, evenly.
    assert _spread([result.requests[a] for a in (0, 1, 3)]) <= 1, result.requests


async def test_a_recovered_actor_gets_its_share_back() -> None:
    cluster = _Cluster(lambda actor, now: actor == 1 and now < 3.0)
    config = InflightConfig(inflight=2, group_size=1)
    result = await train_remote(_batches(60), cluster.step, cluster.encode, 4, config, clock=cluster.clock)

    assert len(result.losses) == 60
    recovered = next(i for i, (a, t, ok) in enumerate(cluster.asks) if a == 1 and ok)
    assert cluster.asks[recovered][1] >= 3.0
    after = Counter(a for a, _, _ in cluster.asks[recovered:])
    assert sorted(after) == [0, 1, 2, 3] and _spread(list(after.values())) <= 1, after
    # While it was down, the other three shared its turns evenly.
    before = Counter(a for a, _, _ in cluster.asks[:recovered] if a != 1)
    assert _spread(list(before.values())) <= 1, before
    assert result.skipped[1] > 0


async def test_without_failures_no_actor_is_skipped() -> None:
    cluster = _Cluster(lambda _actor, _now: False)
    result = await train_remote(
        _batches(6),
        cluster.step,
        cluster.encode,
        3,
        InflightConfig(group_size=1, rank=2),
        clock=cluster.clock,
    )
    assert result.requests == [8, 8, 8] and result.skipped == [0, 0, 0] and result.retries == 0


async def test_a_group_every_actor_fails_names_each_of_them() -> None:
    cluster = _Cluster(lambda _actor, _now: True)
    trained: list[int] = []
    with pytest.raises(GroupFailed, match=r"every encoder actor failed it \(3 tried\)") as failure:
        await train_remote(
            _batches(2),
            lambda _b: trained.append(1) or 0.0,
            cluster.encode,
            3,
            InflightConfig(group_size=2),
            clock=cluster.clock,
        )
    assert all(f"actor {a}: Unreachable: encoder {a} is gone" in str(failure.value) for a in range(3))
    assert trained == []


def test_with_every_actor_backed_off_a_group_goes_to_the_one_free_soonest() -> None:
    now = [0.0]
    skipped = [0, 0, 0]
    dispatch = Dispatch(3, InflightConfig(retry_after_s=1.0), lambda: now[0], skipped)
    assert [dispatch.pick()[0] for _ in range(3)] == [0, 1, 2]
    dispatch.failed(1, probe=False)  # backed off until 1.0
    now[0] = 0.5
    dispatch.failed(2, probe=False)  # until 1.5
    now[0] = 0.7
    dispatch.failed(0, probe=False)  # until 1.7
    # Nothing open: no failure, but the actor whose back-off ends first, as its probe.
    assert dispatch.pick() == (1, True)
    # Its probe is out, so the next group goes to the next one free soonest.
    assert dispatch.pick() == (2, True)
    dispatch.failed(1, probe=True)  # back-off doubled: 2 s from 0.7
    assert dispatch.health[1].until == pytest.approx(2.7)
    dispatch.succeeded(2)
    assert dispatch.pick() == (2, False)  # healthy again: the round robin passes over 0 and 1
    now[0] = 1.8  # 0's back-off is over: the next group probes it; 1's runs on
    assert dispatch.pick() == (0, True)
    assert dispatch.pick() == (2, False)
    assert skipped == [2, 2, 0]


class _GoneNode(_Cluster):
    """Actor 1's node died: its first ask fails as the connection ends (``PeerLost``'s case), and
    every later one waits, as an ask to an address where nobody listens does, until cancelled."""

    def __init__(self) -> None:
        super().__init__(lambda _actor, _now: False)
        self.unanswered = 0

    async def encode(self, actor: int, group: SampleGroup) -> torch.Tensor:
        if actor == 1 and any(a == 1 for a, _, _ in self.asks):
            self.asks.append((actor, self.now, False))
            try:
                await anyio.sleep_forever()
            finally:
                self.unanswered += 1  # the probe gave up on it
        return await super().encode(actor, group) if actor != 1 else self._gone(actor)

    def _gone(self, actor: int) -> torch.Tensor:
        self.asks.append((actor, self.now, False))
        raise Unreachable(f"encoder {actor}'s connection ended")


async def test_a_probe_of_an_actor_nobody_answers_gives_up_after_its_probe_wait_not_the_deadline() -> None:
    """A lost node's encoder stalled its rank a minute (``deadline_s``) at every probe: its asks
    wait where nobody listens, and no batch trains with a missing group. The probe now gives up
    after a few times the slowest recent answer (at least a second), and its group goes on."""
    cluster = _GoneNode()
    batches = _batches(16)
    config = InflightConfig(group_size=1, deadline_s=3600.0, retry_after_s=1.0, retry_after_max_s=1.0)
    with anyio.fail_after(600):  # a guard against a hang (the deadline is an hour), not a speed bound
        result = await train_remote(batches, cluster.step, cluster.encode, 3, config, clock=cluster.clock)
    expected = [float(encode_video(cluster.module, b["video"]).sum()) for b in batches]
    assert result.losses == pytest.approx(expected)
    probes = [t for t, ok in cluster.sent_to(1)][1:]
    assert probes and cluster.unanswered == len(probes)
    assert result.requests[1] == 1 + len(probes) and result.retries == 1 + len(probes)


def test_a_probes_wait_is_a_few_times_the_slowest_recent_answer_within_the_deadline() -> None:
    config = InflightConfig(deadline_s=60.0)
    assert probe_wait_s(config, []) == 60.0  # nothing answered yet: the deadline
    assert probe_wait_s(config, [0.1, 0.5, 0.2]) == pytest.approx(2.0)
    assert probe_wait_s(config, [0.01]) == 1.0  # at least a second
    assert probe_wait_s(config, [30.0]) == 60.0  # at most the deadline
    assert probe_wait_s(InflightConfig(deadline_s=60.0, probe_deadline_s=0.3), [5.0]) == 0.3
    assert probe_wait_s(InflightConfig(deadline_s=2.0, probe_deadline_s=9.0), []) == 2.0
    with pytest.raises(ValueError, match=r"probe_deadline_s=0: expected None or a positive time"):
        InflightConfig(probe_deadline_s=0)


async def test_back_off_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"InflightConfig\.retry_after_s=0"):
        InflightConfig(retry_after_s=0)
    with pytest.raises(ValueError, match=r"InflightConfig\.retry_after_max_s=0\.5: expected a time >= "):
        InflightConfig(retry_after_s=1.0, retry_after_max_s=0.5)
