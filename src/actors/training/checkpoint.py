"""Asynchronous training checkpoints with torch.distributed.checkpoint (DCP).

A checkpoint is a folder ``step-<step, 9 digits>`` under the run's checkpoint folder. Saving is
asynchronous: :meth:`Checkpointer.save` snapshots the state (model, optimizer, LR scheduler, RNG
states, the sampler's position) and returns while DCP writes it in the background; when the write
completes, rank 0 commits it by writing a ``COMMITTED`` marker (atomically: written to a temporary
name, then renamed) that holds the step and the sha256 of every file, checked before a load.
DCP writes its ``.metadata`` only after every rank has written its part, and rank 0 commits only
once it finds every file that ``.metadata`` names in the folder, whole: ranks whose hosts do not
share the folder wrote their parts where rank 0 does not see them, and a checkpoint committed
without them loaded nowhere (:func:`_missing_part`; the save fails for good, naming the rank).
It looks again, re-listing the folder, for up to :data:`PART_WAIT_S` first: on a network file
system another host's files may show late (NFS caches a folder for up to 60 s). So
the marker means the whole checkpoint is on disk; a folder without it (a run killed while
writing) is ignored by :func:`latest`, and removed when that step is saved again.

Model and optimizer states go through ``get_state_dict``/``set_state_dict`` (keys are parameter
names, without DDP's prefix), so a checkpoint saved by W ranks loads on any other number (DCP
reshards). RNG states are per rank (key ``rng.rank<r>``); a rank that has none in the checkpoint
(more ranks than saved it) keeps its own. Without an initialised process group everything runs as
one process (DCP's ``no_dist``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import random
import re
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save

from troupe.runtime.tasks.output_store import atomic_file

__all__ = [
    "COMMITTED",
    "PART_WAIT_S",
    "CheckpointSaveFailed",
    "CheckpointUnreadable",
    "Checkpointer",
    "Restored",
    "capture_rng",
    "checkpoint_path",
    "latest",
    "load",
    "restore_rng",
    "verify",
]

# One process without a process group is a case this module means (no_dist): torch still warns on
# every save and load, from DCP's background thread, onto the run's terminal.
warnings.filterwarnings(
    "ignore", message="torch.distributed is disabled, unavailable or uninitialized", category=UserWarning
)

COMMITTED = "COMMITTED"
"""Marker file of a checkpoint whose every part is written."""

PART_WAIT_S = 60.0
"""How long rank 0 looks again for a rank's part it does not find whole before it refuses to
commit (a refusal ends the run): another host's file may show late on a network file system, as
NFS answers from what it cached of a folder, a name it did not find too, for up to its acdirmax
(60 s by default)."""
_PART_LOOK_EVERY_S = 0.2

_STEP_DIR = re.compile(r"step-(\d+)")
_RANK_PART = re.compile(r"__(\d+)_\d+\.distcp")  # DCP's file of a rank's part: __<rank>_<n>.distcp
_DIGEST = re.compile(r"[0-9a-f]{64}")


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    """The folder of the checkpoint of ``step`` under ``directory``."""
    return Path(directory) / f"step-{step:09d}"


def latest(directory: str | os.PathLike[str]) -> Path | None:
    """The committed checkpoint of the highest step under ``directory``; None when there is none.

    Folders without the ``COMMITTED`` marker (half-written) are ignored.
    """
    root = Path(directory)
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.fullmatch(p.name)) and (p / COMMITTED).is_file()
    ]
    return max(found)[1] if found else None


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def capture_rng() -> dict[str, Any]:
    """This process's RNG states: torch (CPU and, where present, CUDA), numpy, python."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set this process's RNG states to those :func:`capture_rng` returned."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _scheduler_state(scheduler: Any) -> dict[str, Any]:
    # Pickled as one value: its lists and floats must come back as they were, not as DCP entries.
    return {"scheduler": pickle.dumps(scheduler.state_dict())} if scheduler is not None else {}


class Checkpointer:
    """Saves a checkpoint every ``every`` steps, in the background, one save at a time.

    Call :meth:`maybe_save` after each train step and :meth:`close` at the end (it waits for the
    last save). Every rank makes one, at the same point (after :func:`init_ranks`).
    A background write's failure is raised by the next call.
    """

    def __init__(self, directory: str | os.PathLike[str], every: int) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"Checkpointer every={every!r}: expected a positive integer of steps")
        self.directory = Path(directory)
        self.every = every
        self._pending: Future[Any] | None = None
        self._pending_path: Path | None = None  # the step folder the save in flight writes
        # The background write's collectives get a group of their own: on the default group they
        # could interleave with the training loop's (DDP's all-reduce) in another order per rank.
        # Creating it is collective: every rank makes its Checkpointer at the same point.
        group = dist.new_group(backend="gloo") if _distributed() else None
        # Every rank is a member, so a group comes back (newer torch types the non-member marker too).
        self._group = group if isinstance(group, dist.ProcessGroup) else None
        self.committed: list[int] = []
        """Steps committed by this checkpointer, in order (rank 0)."""

    def maybe_save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        progress: Mapping[str, Any] | None = None,
    ) -> bool:
        """Save when ``step`` is a multiple of ``every``; True when a save was started."""
        if step % self.every:
            return False
        self.save(step, model, optimizer, scheduler, progress)
        return True

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        progress: Mapping[str, Any] | None = None,
    ) -> None:
        """Snapshot the state of ``step`` now, write and commit it in the background.

        ``progress`` is the sampler's position (for instance step, epoch and offset), returned as
        is by :func:`load`. Every rank calls this (DCP is collective).
        """
        self.wait()  # one save in flight: DCP's collectives must not interleave
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "progress": pickle.dumps({"step": step, **(progress or {})}),
            "rng": {f"rank{_rank()}": pickle.dumps(capture_rng())},
            **_scheduler_state(scheduler),
        }
        path = checkpoint_path(self.directory, step)
        if _rank() == 0:
            # A run killed while it wrote this step (its .metadata written, its commit not) left
            # the folder: DCP warns that it overwrites it (an error where warnings are, and a
            # refusal once torch's overwrite defaults to False). It is no checkpoint: it goes.
            # Before this rank's save starts, so before any rank writes (DCP plans together).
            _remove_uncommitted(path)
        result = async_save(
            state, checkpoint_id=str(path), process_group=self._group, no_dist=self._group is None
        )
        # torch returns a bare future, or (with a staging stager) a response holding the upload's.
        future: Future[Any] = result.upload_completion if isinstance(result, AsyncSaveResponse) else result
        commit = _rank() == 0

        committed: Future[None] = Future()

        def done(f: Future[Any]) -> None:
            try:
                f.result()
                if commit:
                    _check_every_part(path)
                    body = f"{step}\n{_manifest(path)}"
                    with atomic_file(path / COMMITTED) as partial:  # synced: never found empty
                        partial.write_text(body)
                    self.committed.append(step)
            except BaseException as e:  # raised to the trainer by the next call
                committed.set_exception(e)
            else:
                committed.set_result(None)

        # Waiters wake before a future's callbacks run: wait on the commit, not on the write.
        self._pending, self._pending_path = committed, path
        future.add_done_callback(done)

    def wait(self) -> None:
        """Block until the save in flight is written and committed; raise its error if it failed.

        Raises:
            CheckpointSaveFailed: the save failed (``final`` where the disk is full: its
                uncommitted step folder is removed then, as it holds what space there was).
        """
        pending, self._pending = self._pending, None
        path, self._pending_path = self._pending_path, None
        if pending is None:
            return
        try:
            pending.result()
        except CheckpointSaveFailed:  # the commit's own refusal: said already
            raise
        except (Exception, CheckpointException) as e:  # DCP's is a BaseException: it killed the worker
            cause: BaseException = e
            if isinstance(e, CheckpointException) and e.failures:  # what failed, on the first rank
                cause = next(iter(e.failures.values()))[0]
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
            free = _free_bytes(self.directory)
            if not _disk_full(cause, free):
                raise CheckpointSaveFailed(f"checkpoint save failed: {first}") from e
            removed = path is not None and _remove_uncommitted(path)
            removed_note = f"; its uncommitted {path.name} removed" if removed and path else ""
            mib = "" if free is None else f", {free / 2**20:.1f} MiB free"
            raise CheckpointSaveFailed(
                f"checkpoint save failed: {first} (the disk holding {self.directory} is full{mib}"
                f"{removed_note}: free space, then run again)",
                final=True,
            ) from e

    def close(self) -> None:
        """Wait for the last save (see :meth:`wait`)."""
        self.wait()


class CheckpointSaveFailed(RuntimeError):
    """A checkpoint that could not be written. ``final``: the disk holding it is full, or a
    rank's part is not in the folder as rank 0 sees it (the ranks' hosts do not share it), so
    every restart from the last checkpoint would train to the same save and fail there again (a
    full disk's save was restarted three times, each partial write left behind)."""

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


def _check_every_part(
    path: Path, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Refuse to commit the checkpoint ``path`` where a file its ``.metadata`` names is not there
    whole (as rank 0's host sees the folder) after :data:`PART_WAIT_S` of looking again.

    Raises:
        CheckpointSaveFailed: ``final``, naming the rank whose part is missing: its host writes
            the checkpoints elsewhere, and every save would miss it the same way.
    """
    reach = _part_sizes(path)
    started = clock()
    while (missing := _missing_part(path, reach)) is not None:
        waited = clock() - started
        if waited >= PART_WAIT_S:
            raise _part_not_seen(path, *missing, waited)
        sleep(min(_PART_LOOK_EVERY_S, PART_WAIT_S - waited))


def _part_not_seen(path: Path, name: str, how: str, waited: float) -> CheckpointSaveFailed:
    rank = _RANK_PART.fullmatch(name)
    whose = f"rank {rank.group(1)}'s part ({name})" if rank else name
    return CheckpointSaveFailed(
        f"checkpoint save failed: {path.name} is not committed: {whose} {how} {path.parent} on rank "
        f"0's host (looked for {waited:.0f} s); train.checkpoint_dir must be one folder every "
        "rank's host sees (a shared file system, at the same path on each host): give it one, then "
        "run again",
        final=True,
    )


def _part_sizes(path: Path) -> dict[str, int]:
    """The files the checkpoint's ``.metadata`` says the ranks wrote, each with the size its
    entries reach."""
    reach: dict[str, int] = {}
    for info in FileSystemReader(str(path)).read_metadata().storage_data.values():
        name = getattr(info, "relative_path", None)
        if isinstance(name, str):
            reach[name] = max(reach.get(name, 0), int(info.offset) + int(info.length))
    return reach


def _missing_part(path: Path, reach: Mapping[str, int]) -> tuple[str, str] | None:
    """The first of the files ``reach`` names that is absent from ``path`` or shorter than its
    size, with how (``is not in``, ``is cut short in``); None when every one is there.

    The folder is listed each time, not each name looked up: a network file system answers a
    lookup from its cache of names it did not find, while a listing reads the folder again.
    """
    with os.scandir(path) as entries:
        present = {e.name: e.stat().st_size for e in entries if e.is_file()}
    for name, size in sorted(reach.items()):
        if name not in present:
            return name, "is not in"
        if present[name] < size:
            return name, "is cut short in"
    return None


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _disk_full(cause: BaseException, free: int | None) -> bool:
    """Whether the save failed for want of space: ENOSPC anywhere in its causes, or a disk left
    nearly empty (torch's writer says a full disk as ``unexpected pos 704 vs 598``, no ENOSPC)."""
    seen: BaseException | None = cause
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        seen = seen.__cause__ or seen.__context__
    return free is not None and free < _LOW_SPACE


def _remove_uncommitted(path: Path) -> bool:
    """Delete the step folder of a save that failed (or a killed run's), unless it was
    committed; whether it was."""
    if (path / COMMITTED).exists() or not path.is_dir():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


_LOW_SPACE = 64 << 20


@dataclass(frozen=True)
class Restored:
    """What :func:`load` restored besides the objects it was given.

    Attributes:
        path: the checkpoint folder.
        progress: the sampler's position saved with it (always holds ``"step"``).
        rng_restored: whether this rank's RNG states were in the checkpoint (and are now set).
    """

    path: Path
    progress: dict[str, Any]
    rng_restored: bool


def load(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
) -> Restored:
    """Restore model, optimizer, scheduler and this rank's RNG states from the checkpoint ``path``.

    Every rank calls it, on any number of ranks. Raises FileNotFoundError when ``path`` is not a
    committed checkpoint.
    """
    path = Path(path)
    if not (path / COMMITTED).is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r}: not a committed checkpoint")
    try:
        _verify(path)
        return _load(path, model, optimizer, scheduler)
    except (Exception, CheckpointException) as exc:  # damaged, another model (a BaseException)
        raise _unreadable(path, exc) from exc


def verify(path: str | os.PathLike[str]) -> None:
    """Check the committed checkpoint ``path`` as :func:`load` does before it loads (its
    ``COMMITTED`` marker holds its step and the sha256 of every file), without loading it: what
    says a run is complete must be what a resume would accept.

    Raises:
        CheckpointUnreadable: as :func:`load` raises it.
    """
    path = Path(path)
    try:
        _verify(path)
    except Exception as exc:
        raise _unreadable(path, exc) from exc


def _unreadable(path: Path, exc: BaseException) -> CheckpointUnreadable:
    """The error that says ``path`` does not load, and what to do: a damaged one is moved away
    (the one before may load); one of another model (its sizes or keys are not this model's,
    its bytes having passed their sha256) is not, as every checkpoint of the run is that model's
    (another troupe version's defaults, say; ``train_dir`` refuses a [model] change up front)."""
    cause: BaseException = exc
    if isinstance(exc, CheckpointException) and exc.failures:  # what failed, on the first rank
        cause = next(iter(exc.failures.values()))[0]
    first = (str(cause).strip().splitlines() or [""])[0][:200]
    why = f"{type(cause).__name__}: {first}" if first else type(cause).__name__
    if first.startswith(_OTHER_MODEL):
        return CheckpointUnreadable(
            f"checkpoint {str(path)!r} was made with another model than this run builds (another "
            f"troupe version?) and cannot be loaded ({why}); resume it with the troupe that made "
            "it, or run with --fresh to start anew",
            final=True,
        )
    return CheckpointUnreadable(
        f"checkpoint {str(path)!r} cannot be loaded ({why}); move it away to resume from the one "
        "before, or run with --fresh",
        final=not isinstance(cause, OSError),
    )


# How DCP's load says a state dict is not the model's (a parameter's size; one it lacks).
_OTHER_MODEL = ("Size mismatch between saved", "Missing key in checkpoint state_dict")


class CheckpointUnreadable(ValueError):
    """A committed checkpoint that does not load (damaged, or made with another model).

    ``final``: its bytes or its model are wrong, so every load fails the same way; an error
    reading it (an OSError: a network file system's hiccup, say) may pass.
    """

    def __init__(self, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


def _manifest(path: Path) -> str:
    """``sha256  name`` of every file of the checkpoint, a line each: the commit marker's body,
    so that a file damaged since (bytes changed, not only cut short) is found before it loads."""
    return "".join(f"{_sha256(file)}  {file.name}\n" for file in _checkpoint_files(path))


def _checkpoint_files(path: Path) -> list[Path]:
    """The files DCP wrote into the checkpoint folder: all but the marker and its temporary."""
    return sorted(
        p
        for p in path.iterdir()
        if p.is_file() and p.name != COMMITTED and not p.name.startswith(f".{COMMITTED}.")
    )


def _verify(path: Path) -> None:
    """Check the checkpoint's files against its commit marker: the step, then ``sha256  name``
    of every file in the folder. A marker that lacks any of it (empty, cut short, or written by
    a troupe before markers held a manifest) cannot vouch for the files: refused, not trusted.

    Raises:
        ValueError: the marker is damaged, or a file is missing or its bytes changed since.
    """
    lines = (path / COMMITTED).read_text(errors="replace").splitlines()
    step = _STEP_DIR.fullmatch(path.name)
    if not lines or step is None or lines[0] != str(int(step.group(1))):
        raise ValueError(f"its {COMMITTED} marker does not hold its step (empty or damaged)")
    listed: dict[str, str] = {}
    for line in lines[1:]:
        digest, _, name = line.partition("  ")
        if not _DIGEST.fullmatch(digest) or not name:
            raise ValueError(f"its {COMMITTED} marker is damaged (a line reads {line[:80]!r})")
        listed[name] = digest
    unlisted = [file.name for file in _checkpoint_files(path) if file.name not in listed]
    if not listed or unlisted:
        what = repr(unlisted[0]) if unlisted else "any file"
        raise ValueError(
            f"its {COMMITTED} marker has no sha256 of {what} (cut short, or written by a troupe "
            "whose markers held none)"
        )
    for name, digest in listed.items():
        file = path / name
        if not file.is_file():
            raise ValueError(f"{name} is missing")
        if _sha256(file) != digest:
            raise ValueError(f"{name} changed since it was written (its sha256 differs)")


def _sha256(file: Path) -> str:
    h = hashlib.sha256()
    with file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> Restored:
    saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rng_key = f"rank{_rank()}"
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "progress": b""}
    if f"rng.{rng_key}" in saved:
        state["rng"] = {rng_key: b""}
    if scheduler is not None:
        if "scheduler" not in saved:
            raise ValueError(f"checkpoint {str(path)!r}: holds no LR scheduler state")
        state["scheduler"] = b""
    dcp_load(state, checkpoint_id=str(path), no_dist=not _distributed())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if scheduler is not None:
        scheduler.load_state_dict(pickle.loads(state["scheduler"]))
    if "rng" in state:
        restore_rng(pickle.loads(state["rng"][rng_key]))
    return Restored(path, pickle.loads(state["progress"]), "rng" in state)
