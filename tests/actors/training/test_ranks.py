"""Trainer ranks with torch.distributed (gloo on loopback): rendezvous from torchrun's variables,
a checkpoint saved by 2 ranks loaded by 1, and one the ranks save to folders that are not one.

Run as a script (``python test_ranks.py DIR``, with torchrun's variables set) it is one rank: it
trains 2 DDP steps, checkpoints step 2, and writes its state to ``DIR/rank<r>.pt``. With
``unshared`` after DIR, each rank checkpoints into ``DIR/host<r>`` (hosts that do not share the
folder) and writes the error its last save ends on, if any, to ``DIR/rank<r>.error``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
import torch

from support.rank_processes import run_ranks
from troupe.actors.training import checkpoint
from troupe.actors.training.checkpoint import (
    Checkpointer,
    CheckpointSaveFailed,
    checkpoint_path,
    latest,
    load,
)
from troupe.actors.training.ranks import Rendezvous, close_ranks, init_ranks, rendezvous_from
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.testing.plugin import free_endpoint
from troupe.runtime.transports.base import MemoryHub

CHILD_TIMEOUT_S = 90  # under pytest-timeout's 120 s, so the ranks' logs are reported


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_rendezvous_from_torchrun_variables() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2"}
    assert Rendezvous.from_env(env) == Rendezvous("127.0.0.1", 29500, 1, 2, 0)
    with pytest.raises(ValueError, match="RANK='x'"):
        Rendezvous.from_env({**env, "RANK": "x"})
    with pytest.raises(ValueError, match="WORLD_SIZE is not set"):
        Rendezvous.from_env({k: v for k, v in env.items() if k != "WORLD_SIZE"})
    with pytest.raises(ValueError, match="rank=2"):
        Rendezvous("127.0.0.1", 29500, 2, 2)


def test_single_rank_group_joins_and_leaves() -> None:
    port = urlsplit(free_endpoint()).port
    assert port is not None
    init_ranks(Rendezvous("127.0.0.1", port, 0, 1), timeout_s=60)
    try:
        assert torch.distributed.get_world_size() == 1
        with pytest.raises(RuntimeError, match="already initialised"):
            init_ranks(Rendezvous("127.0.0.1", port, 0, 1))
    finally:
        close_ranks()
    assert not torch.distributed.is_initialized()


class _NotedAsks:
    """``runtime.ref`` whose refs note the task of each ask that failed (rank 0 not published)."""

    def __init__(self, runtime: Runtime) -> None:
        self.ref = runtime.ref
        self.failed_in: set[int] = set()

    def __call__(self, name: str) -> Any:
        ref, failed_in = self.ref(name), self.failed_in

        class Noted:
            async def ask(self, *args: Any, **kwargs: Any) -> Any:
                try:
                    return await ref.ask(*args, **kwargs)
                except Exception:
                    failed_in.add(anyio.get_current_task().id)
                    raise

        return Noted()


async def test_ranks_find_rank_0_through_the_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    hub = MemoryHub()
    found: dict[int, Rendezvous] = {}
    async with Runtime("node", "trainer", hub.transport()) as runtime:
        noted = _NotedAsks(runtime)
        monkeypatch.setattr(runtime, "ref", noted)

        async def join(rank: int) -> None:
            found[rank] = await rendezvous_from(runtime, "train-rdv", rank, 3, timeout_s=60, poll_s=0.01)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(join, 2)  # they ask before rank 0 has published: they ask again
                tg.start_soon(join, 1)
                while len(noted.failed_in) < 2:  # a bounded poll: each has been told "not yet"
                    await anyio.sleep(0.01)
                tg.start_soon(join, 0)
        monkeypatch.undo()
        with pytest.raises(ValueError, match="world_size=4"):
            await rendezvous_from(runtime, "train-rdv", 1, 4, timeout_s=60)
        with pytest.raises(TimeoutError, match="absent-rdv"):
            await rendezvous_from(runtime, "absent-rdv", 1, 2, timeout_s=0.05, poll_s=0.01)
    assert {r: (v.addr, v.port, v.rank, v.world_size) for r, v in found.items()} == {
        r: ("127.0.0.1", found[0].port, r, 3) for r in range(3)
    }


async def test_a_group_starts_from_the_published_rendezvous() -> None:
    async with Runtime("node", "trainer", MemoryHub().transport()) as runtime:
        rdv = await rendezvous_from(runtime, "solo-rdv", 0, 1)
    init_ranks(rdv, timeout_s=60)
    try:
        assert torch.distributed.get_rank() == 0 and torch.distributed.get_world_size() == 1
    finally:
        close_ranks()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_checkpoint_of_two_ranks_loads_on_one(tmp_path: Path) -> None:
    port = urlsplit(free_endpoint()).port
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    base["OMP_NUM_THREADS"] = "1"
    tests = Path(__file__).resolve().parents[2]  # the ranks run this file, which imports support
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tests), base.get("PYTHONPATH")]))
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    codes = run_ranks([sys.executable, __file__, str(tmp_path)], base, logs, CHILD_TIMEOUT_S)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    assert latest(tmp_path) == checkpoint_path(tmp_path, 2)

    model, optimizer = make_model()
    restored = load(checkpoint_path(tmp_path, 2), model, optimizer)
    assert restored.progress == {"step": 2, "epoch": 0, "offset": 4}
    saved = torch.load(tmp_path / "rank0.pt", weights_only=False)
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved["model"][name]), name
    state = optimizer.state_dict()["state"]
    for index, param_state in saved["optim"].items():
        for key, value in param_state.items():
            assert torch.equal(torch.as_tensor(state[index][key]), torch.as_tensor(value)), (index, key)
    assert torch.equal(torch.get_rng_state(), saved["rng"])  # rank 0's RNG goes to rank 0


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_checkpoint_whose_folder_the_ranks_do_not_share_is_not_committed(tmp_path: Path) -> None:
    """Report dt 4: each rank's host wrote its part into its own disk's folder, and rank 0
    committed what it saw (its own part): every resume failed on rank 1's missing file, and
    "move it away to resume from the one before" could not help, as every checkpoint lacked it."""
    port = urlsplit(free_endpoint()).port
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    base["OMP_NUM_THREADS"] = "1"
    tests = Path(__file__).resolve().parents[2]
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tests), base.get("PYTHONPATH")]))
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    codes = run_ranks([sys.executable, __file__, str(tmp_path), "unshared"], base, logs, CHILD_TIMEOUT_S)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    said = (tmp_path / "rank0.error").read_text()
    assert said == (
        "final: checkpoint save failed: step-000000002 is not committed: rank 1's part "
        f"(__1_0.distcp) is not in {tmp_path / 'host0'} on rank 0's host (looked for 1 s); "
        "train.checkpoint_dir must be one folder every rank's host sees (a shared file system, at "
        "the same path on each host): give it one, then run again"
    )
    assert latest(tmp_path / "host0") is None and latest(tmp_path / "host1") is None
    assert not (tmp_path / "rank1.error").exists()  # only rank 0 commits, and so finds it


def _rank_main(folder: Path, unshared: bool = False) -> None:
    if unshared:  # the part never shows: 1 s of looking again says so as 60 s would
        checkpoint.PART_WAIT_S = 1.0
    rdv = init_ranks(timeout_s=CHILD_TIMEOUT_S)
    try:
        model, optimizer = make_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        saver = Checkpointer(folder / f"host{rdv.rank}" if unshared else folder, every=2)
        g = torch.Generator().manual_seed(rdv.rank)  # each rank its own data
        state: dict[str, object] = {}
        for step in (1, 2, 3):  # step 3's all-reduce runs while step 2's checkpoint is written
            loss = ddp(torch.randn(4, 6, generator=g)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if saver.maybe_save(step, ddp, optimizer, progress={"epoch": 0, "offset": 2 * step}):
                optim_state = optimizer.state_dict()["state"]
                state = {
                    "model": {k: v.clone() for k, v in model.state_dict().items()},
                    "optim": {
                        i: {k: torch.as_tensor(v).clone() for k, v in st.items()}
                        for i, st in optim_state.items()
                    },
                    "rng": torch.get_rng_state(),
                }
        try:
            saver.close()
        except CheckpointSaveFailed as exc:
            if not unshared:
                raise
            (folder / f"rank{rdv.rank}.error").write_text(f"{'final' if exc.final else 'may pass'}: {exc}")
        torch.save(state, folder / f"rank{rdv.rank}.pt")
    finally:
        close_ranks()


if __name__ == "__main__":
    _rank_main(Path(sys.argv[1]), unshared=sys.argv[2:] == ["unshared"])
