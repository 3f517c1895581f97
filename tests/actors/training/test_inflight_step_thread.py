"""Where a rank's train steps run: one thread of their own, the same for every step, never the
event loop's; a step is never cut short, even when the run is cancelled."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import torch

from troupe.actors.encoders.light import LightEncoder
from troupe.actors.training.inflight import InflightConfig, SampleGroup, encode_video, train_remote


def _batches(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {"video": torch.randint(0, 256, (4, 3, 4, 8, 8), generator=g, dtype=torch.uint8)} for _ in range(n)
    ]


def _encode() -> Any:
    module = LightEncoder(seed=3).eval()

    async def encode(index: int, group: SampleGroup) -> torch.Tensor:
        await anyio.lowlevel.checkpoint()
        return encode_video(module, group.video)

    return encode


async def test_every_step_runs_on_one_thread_of_its_own() -> None:
    threads: list[threading.Thread] = []

    def step(batch: dict[str, Any]) -> float:
        threads.append(threading.current_thread())
        return float(batch["latents"].mean())

    loop_thread = threading.current_thread()
    config = InflightConfig(inflight=2, group_size=2)
    result = await train_remote(_batches(6), step, _encode(), 2, config)
    assert len(result.losses) == 6 and len(threads) == 6
    assert len(set(threads)) == 1 and threads[0] is not loop_thread
    assert not threads[0].is_alive()  # the run's thread ends with the run


async def test_a_cancelled_run_waits_for_the_step_in_progress() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[int] = []

    def step(batch: dict[str, Any]) -> float:
        started.set()
        release.wait(timeout=30)
        finished.append(1)
        return 0.0

    async with anyio.create_task_group() as tg:
        tg.start_soon(train_remote, _batches(3), step, _encode(), 1, InflightConfig(inflight=1))
        with anyio.fail_after(30):
            await anyio.to_thread.run_sync(started.wait, 30)
        tg.cancel_scope.cancel()
        release.set()
    # The run returned only after its step had ended: no step left running behind it.
    assert finished == [1]
