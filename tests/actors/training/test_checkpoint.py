"""Asynchronous DCP checkpoints: resume equals an uninterrupted run; uncommitted ones are ignored.

Run as a script (``python test_checkpoint.py DIR STEPS EVERY HANG_AFTER THREADS``) it is the trainer
the SIGKILL test starts: it trains, prints each step, and hangs after ``HANG_AFTER`` steps.
"""

from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from troupe.actors.training import checkpoint
from troupe.actors.training.checkpoint import (
    COMMITTED,
    Checkpointer,
    CheckpointSaveFailed,
    CheckpointUnreadable,
    checkpoint_path,
    latest,
    load,
    verify,
)
from troupe.models.world_model import FlowBatch, WorldModel, WorldModelConfig

# One process without a process group: DCP says it assumes that, on every save and load.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

CONFIG = WorldModelConfig(latent_channels=2, patch_size=1, d_model=16, layers=1, heads=2)


def make_batch(step: int) -> FlowBatch:
    """The batch of ``step``: the sampler's position alone decides it."""
    g = torch.Generator().manual_seed(1000 + step)
    b, tl, ta = 2, 2, 4
    cond = torch.tensor([True, False]).expand(b, tl)
    act_cond = torch.tensor([True, True, False, False]).expand(b, ta)
    return FlowBatch(
        latents=torch.randn(b, 2, tl, 2, 2, generator=g),
        latent_condition=cond,
        latent_target=~cond,
        actions=torch.randn(b, ta, 59, generator=g),
        action_valid=torch.rand(b, ta, 59, generator=g) > 0.3,
        action_condition=act_cond,
        action_target=~act_cond,
    )


def make_trainer(seed: int) -> tuple[WorldModel, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = WorldModel(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def train(
    directory: Path | None,
    steps: int,
    every: int = 2,
    stop_after: int | None = None,
    resume: bool = False,
    on_step: Any = None,
) -> tuple[WorldModel, dict[str, Any] | None]:
    """Train ``steps`` steps (noise, and a python/numpy-drawn jitter, from the global RNGs)."""
    model, optimizer, scheduler = make_trainer(0)
    seed_all(1)
    start, progress = 1, None
    if resume:
        assert directory is not None
        found = latest(directory)
        assert found is not None
        restored = load(found, model, optimizer, scheduler)
        assert restored.rng_restored
        progress = restored.progress
        start = progress["step"] + 1
    saver = Checkpointer(directory, every) if directory is not None else None
    try:
        for step in range(start, steps + 1):
            jitter = random.random() + float(np.random.rand())  # python and numpy RNGs matter
            loss = model.loss(make_batch(step)).loss * (1 + jitter)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if saver is not None:
                saver.maybe_save(step, model, optimizer, scheduler, {"epoch": 0, "offset": step})
            if on_step is not None:
                on_step(step)
            if step == stop_after:
                break
    finally:
        if saver is not None:
            saver.close()
    return model, progress


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def test_resume_after_stop_equals_uninterrupted(tmp_path: Path) -> None:
    reference, _ = train(None, steps=7)
    train(tmp_path, steps=7, every=2, stop_after=5)
    assert latest(tmp_path) == checkpoint_path(tmp_path, 4)
    resumed, progress = train(tmp_path, steps=7, every=2, resume=True)
    assert progress == {"step": 4, "epoch": 0, "offset": 4}
    assert_same_weights(resumed, reference)


CHILD_STEPS_WITHIN_S = 180.0  # a bound on the child's start and four steps, not on speed


@pytest.mark.timeout(300)  # three trainings and a child importing torch, on a loaded machine
def test_resume_after_sigkill_equals_uninterrupted(tmp_path: Path) -> None:
    """The kill lands anywhere in step 4's save: before its write, during it, or after DCP's
    .metadata and before the commit (see the test below: the resumed run saves step 4 again)."""
    reference, _ = train(None, steps=6)
    # The child computes with this process's torch threads: a float sum split over another
    # number of threads rounds differently, and an earlier test may have changed ours.
    cmd = [sys.executable, __file__, str(tmp_path), "6", "1", "4", str(torch.get_num_threads())]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout or []), daemon=True)
    reader.start()
    try:
        # bounded poll of the child's progress: it hangs after step 4 until killed (it imports
        # torch first: most of a minute on a loaded machine)
        deadline = time.monotonic() + CHILD_STEPS_WITHIN_S
        while "step 4\n" not in lines and child.poll() is None and time.monotonic() < deadline:
            threading.Event().wait(0.1)
        assert "step 4\n" in lines, f"child printed {lines!r}, exit {child.poll()}"
    finally:
        child.kill()
        child.wait(timeout=60)
        reader.join(timeout=60)
        if child.stdout is not None:
            child.stdout.close()
    assert latest(tmp_path) is not None  # at least one save committed before the kill
    resumed, progress = train(tmp_path, steps=6, every=1, resume=True)
    assert progress is not None and 1 <= progress["step"] <= 4
    assert_same_weights(resumed, reference)


def test_a_step_whose_write_was_cut_before_its_commit_is_saved_again(tmp_path: Path) -> None:
    """A run killed after DCP wrote step 4's .metadata, before the commit: the resumed run saves
    step 4 again over that folder. DCP warned that it overwrote a checkpoint there (an error in
    a run whose warnings are errors, as this suite's; a refusal once torch's ``overwrite``
    defaults to False), so the SIGKILL test above failed when its kill landed in that window."""
    reference, _ = train(None, steps=6)
    train(tmp_path, steps=4, every=1)
    cut = checkpoint_path(tmp_path, 4)
    (cut / COMMITTED).unlink()
    stale = cut / "__1_0.distcp"  # what another rank of the killed run wrote
    stale.write_bytes(b"from the killed run")
    assert (cut / ".metadata").is_file() and latest(tmp_path) == checkpoint_path(tmp_path, 3)
    resumed, progress = train(tmp_path, steps=6, every=1, resume=True)
    assert progress is not None and progress["step"] == 3
    assert_same_weights(resumed, reference)
    assert not stale.exists() and latest(tmp_path) == checkpoint_path(tmp_path, 6)
    verify(cut)


def test_uncommitted_checkpoint_is_ignored(tmp_path: Path) -> None:
    train(tmp_path, steps=2, every=2)
    half = checkpoint_path(tmp_path, 3)
    half.mkdir()
    (half / "__0_0.distcp").write_bytes(b"half-written")
    assert latest(tmp_path) == checkpoint_path(tmp_path, 2)
    assert (checkpoint_path(tmp_path, 2) / COMMITTED).is_file()
    model, optimizer, scheduler = make_trainer(0)
    with pytest.raises(FileNotFoundError, match="step-000000003"):
        load(half, model, optimizer, scheduler)
    assert latest(tmp_path / "absent") is None


def test_save_snapshots_the_state_before_it_returns(tmp_path: Path) -> None:
    model, optimizer, scheduler = make_trainer(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saver = Checkpointer(tmp_path, every=1)
    saver.save(1, model, optimizer, scheduler)
    with torch.no_grad():  # training goes on while the checkpoint is written
        for p in model.parameters():
            p.fill_(7.0)
    saver.close()
    assert saver.committed == [1]
    fresh, fresh_optimizer, fresh_scheduler = make_trainer(5)
    load(checkpoint_path(tmp_path, 1), fresh, fresh_optimizer, fresh_scheduler)
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_save_that_failed_on_a_nearly_full_disk_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrapped: bool
) -> None:
    """torch's writer says a full disk as ``unexpected pos 704 vs 598`` with C++ frames under
    it, inside DCP's CheckpointException, a BaseException that went past the rank's handling
    and killed its worker: the error is the cause's first line, and the disk's free space
    where it is low."""
    torch_said = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
    cause = RuntimeError(f"{torch_said}\nframe #0: c10::")
    error: BaseException = CheckpointException("ranks: [0]", {0: (cause, None)}) if wrapped else cause
    future: Future[None] = Future()
    future.set_exception(error)
    saver = Checkpointer(tmp_path, every=1)
    monkeypatch.setattr(checkpoint, "async_save", lambda *a, **k: future)
    saver.save(1, *make_trainer(0))
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda _: SimpleNamespace(free=3 << 20))
    partial = checkpoint_path(tmp_path, 1)
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "__0_0.distcp").write_bytes(b"cut short")  # what the failed write left
    with pytest.raises(CheckpointSaveFailed) as info:
        saver.wait()
    said = str(info.value)
    assert said.startswith(f"checkpoint save failed: {torch_said} (")
    assert f"the disk holding {tmp_path} is full, 3.0 MiB free" in said and "\n" not in said
    # Every restart would train to this save and fail again: final, and the partial write that
    # took what space there was is gone (it stayed, and each restart left another).
    assert info.value.final and "its uncommitted step-000000001 removed" in said
    assert not partial.exists()


def test_a_save_that_failed_with_room_left_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the disk: it may pass (an I/O error), so the run restarts it, the step folder kept."""
    future: Future[None] = Future()
    future.set_exception(RuntimeError("a write error"))
    saver = Checkpointer(tmp_path, every=1)
    monkeypatch.setattr(checkpoint, "async_save", lambda *a, **k: future)
    saver.save(1, *make_trainer(0))
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda _: SimpleNamespace(free=1 << 30))
    with pytest.raises(CheckpointSaveFailed) as info:
        saver.wait()
    assert str(info.value) == "checkpoint save failed: a write error" and not info.value.final


def after_write(monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None]) -> None:
    """Every save's folder is changed by ``change`` once DCP has written it, before rank 0 looks
    at it (as another host's file would look from rank 0's: not there yet, half-flushed)."""
    write = checkpoint.async_save

    def changed_after_write(state: Any, *, checkpoint_id: str, **kwargs: Any) -> Future[None]:
        written = write(state, checkpoint_id=checkpoint_id, **kwargs)
        seen: Future[None] = Future()

        def change_then_done(f: Future[Any]) -> None:
            change(Path(checkpoint_id))
            seen.set_result(f.result())

        written.add_done_callback(change_then_done)
        return seen

    monkeypatch.setattr(checkpoint, "async_save", changed_after_write)


def looks_on_a_fake_clock(
    monkeypatch: pytest.MonkeyPatch, each_pause: Callable[[int], None] = lambda looks: None
) -> list[float]:
    """Rank 0's pauses between its looks for the ranks' parts, each moving a fake clock at once
    (no time passes) and then calling ``each_pause`` with how many there were; returns them."""
    from support.fake_clock import Clock  # here: as the SIGKILL test's trainer, tests/ is not on the path

    clock = Clock()
    pauses: list[float] = []
    check = checkpoint._check_every_part

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        clock.now += seconds
        each_pause(len(pauses))

    monkeypatch.setattr(checkpoint, "_check_every_part", lambda path: check(path, clock=clock, sleep=pause))
    return pauses


def test_a_part_rank_0_finds_cut_short_is_not_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 commits only the files DCP's ``.metadata`` names, each whole as it sees them (a
    rank's part written where rank 0 does not see it: tests/actors/training/test_ranks.py); it
    had hashed whatever the folder held and committed that."""

    def cut(folder: Path) -> None:
        part = folder / "__0_0.distcp"
        with part.open("r+b") as file:
            file.truncate(part.stat().st_size // 2)

    after_write(monkeypatch, cut)
    pauses = looks_on_a_fake_clock(monkeypatch)
    saver = Checkpointer(tmp_path, every=1)
    saver.save(1, *make_trainer(0))
    with pytest.raises(CheckpointSaveFailed) as info:
        saver.wait()
    assert str(info.value).startswith(
        f"checkpoint save failed: step-000000001 is not committed: rank 0's part (__0_0.distcp) is "
        f"cut short in {tmp_path} on rank 0's host (looked for 60 s); train.checkpoint_dir must be "
        "one folder every rank's host sees"
    )
    assert info.value.final  # every save would miss it the same way: the run ends on it
    assert latest(tmp_path) is None and saver.committed == []
    assert sum(pauses) == pytest.approx(checkpoint.PART_WAIT_S) and max(pauses) <= 0.2


def test_a_part_that_shows_late_is_waited_for_and_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a network file system another host's part may show in rank 0's listing seconds after
    it was written (NFS caches a folder, a name it did not find too, up to 60 s): rank 0 looked
    once and refused a healthy save, ending the run. It looks again, and commits once it is there."""
    hidden = tmp_path / "elsewhere"

    def hide(folder: Path) -> None:  # a part not yet in rank 0's view of the folder
        (folder / "__0_0.distcp").rename(hidden)

    def show_on_third(looks: int) -> None:
        if looks == 3:
            hidden.rename(checkpoint_path(tmp_path, 1) / "__0_0.distcp")

    after_write(monkeypatch, hide)
    pauses = looks_on_a_fake_clock(monkeypatch, show_on_third)
    saver = Checkpointer(tmp_path, every=1)
    saver.save(1, *make_trainer(0))
    saver.wait()
    assert latest(tmp_path) == checkpoint_path(tmp_path, 1) and saver.committed == [1]
    verify(checkpoint_path(tmp_path, 1))  # its marker holds the part that showed late
    assert len(pauses) == 3


def test_a_damaged_checkpoint_is_named_in_one_line(tmp_path: Path) -> None:
    """A committed checkpoint whose data is damaged: one line naming it and what to do (a
    torch CheckpointException, a BaseException with a traceback in its text, had gone past the
    rank's error handling and killed its worker three times, 350 lines of stderr)."""
    model, optimizer, scheduler = make_trainer(0)
    saver = Checkpointer(tmp_path, every=1)
    saver.save(1, model, optimizer, scheduler)
    saver.close()
    for part in checkpoint_path(tmp_path, 1).glob("*.distcp"):
        part.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointUnreadable) as info:
        load(checkpoint_path(tmp_path, 1), *make_trainer(1))
    message = str(info.value)
    assert "step-000000001' cannot be loaded (" in message and "--fresh" in message
    assert "\n" not in message and "CheckpointException" not in message
    assert info.value.final  # every load would fail the same way: the trainer does not restart


@pytest.mark.parametrize("change", [{"mlp_ratio": 2.0}, {"layers": 2}])  # a size; a key it lacks
def test_a_checkpoint_of_another_model_is_said_to_be_one(tmp_path: Path, change: dict[str, Any]) -> None:
    """Report lc 3: a checkpoint whose sizes or keys are another model's (another troupe
    version's defaults) was called unloadable with "move it away to resume from the one before",
    advice no checkpoint of the run could follow: every one is that model's."""
    saved = _saved_at_step_1(tmp_path)
    model = WorldModel(dataclasses.replace(CONFIG, **change))
    with pytest.raises(CheckpointUnreadable) as info:
        load(saved, model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    message = str(info.value)
    assert message.startswith(
        f"checkpoint {str(saved)!r} was made with another model than this run builds (another "
        "troupe version?) and cannot be loaded ("
    ), message
    assert message.endswith("resume it with the troupe that made it, or run with --fresh to start anew")
    assert "move it away" not in message and "\n" not in message
    assert info.value.final


def test_a_checkpoint_that_could_not_be_read_may_load_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error reading the files (a network file system's hiccup) is not final: a restart
    tries again."""
    model, optimizer, scheduler = make_trainer(0)
    saver = Checkpointer(tmp_path, every=1)
    saver.save(1, model, optimizer, scheduler)
    saver.close()

    def unreadable(path: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(checkpoint, "_verify", unreadable)
    with pytest.raises(CheckpointUnreadable, match="OSError") as info:
        load(checkpoint_path(tmp_path, 1), *make_trainer(1))
    assert not info.value.final


def _saved_at_step_1(folder: Path) -> Path:
    """A checkpoint of a fresh trainer, saved and committed as step 1 under ``folder``."""
    saver = Checkpointer(folder, every=1)
    saver.save(1, *make_trainer(0))
    saver.close()
    return checkpoint_path(folder, 1)


def test_bytes_changed_in_a_checkpoint_are_found_before_it_loads(tmp_path: Path) -> None:
    """A few bytes flipped inside the data loaded silently (no format error) and trained on from
    damaged weights: the commit marker holds each file's sha256, checked first."""
    path = _saved_at_step_1(tmp_path)
    marker = (path / COMMITTED).read_text()
    assert ".metadata" in marker and ".distcp" in marker
    part = next(path.glob("*.distcp"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x55
    part.write_bytes(bytes(data))
    with pytest.raises(CheckpointUnreadable, match=rf"{part.name} changed since it was written"):
        load(path, *make_trainer(1))


@pytest.mark.parametrize(
    ("marker", "said"),
    [
        ("", "does not hold its step"),  # renamed before its bytes reached the disk
        ("2\n", "does not hold its step"),  # another checkpoint's
        ("1\n", "has no sha256 of '.metadata'"),  # the step alone: cut short, or an older troupe's
        ("1\nnot a digest  x\n", "is damaged"),
        (None, "has no sha256 of '"),  # the manifest cut short at a line's end: a file unlisted
    ],
)
def test_a_marker_that_cannot_vouch_for_the_files_is_refused(
    tmp_path: Path, marker: str | None, said: str
) -> None:
    """A damaged file under a marker that checks nothing loaded silently (an empty marker, after
    a crash, passed as committed): a marker must hold the step and every file's sha256."""
    path = _saved_at_step_1(tmp_path)
    full = (path / COMMITTED).read_text()
    load(path, *make_trainer(1))  # as written, it loads
    cut = "".join(full.splitlines(keepends=True)[:-1])
    (path / COMMITTED).write_text(cut if marker is None else marker)
    with pytest.raises(CheckpointUnreadable, match=said) as info:
        load(path, *make_trainer(1))
    assert info.value.final and "move it away" in str(info.value)


def test_every_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every=0"):
        Checkpointer(tmp_path, 0)


if __name__ == "__main__":
    folder, total, every, hang_after, threads = sys.argv[1], *map(int, sys.argv[2:6])
    torch.set_num_threads(threads)

    def report(step: int) -> None:
        print(f"step {step}", flush=True)
        if step == hang_after:
            threading.Event().wait()  # killed here, a save perhaps still being written

    train(Path(folder), total, every, on_step=report)
