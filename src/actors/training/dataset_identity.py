"""What a training's checkpoints were trained on: the dataset's identity, kept in its run record.

A store may grow between runs (a ``troupe run`` still writing it): that is the same dataset,
and the checkpoints go on over it. One made again (other seeds, fewer episodes) or replaced by
another is not: the checkpoint's sampler position is over clips that are not there, or are
others (a resume on a dataset that shrank failed every restart with ``IndexError: clip index 21
out of range``; a larger one of other content trained on without a word).

The identity is the episode count and a sample: the digest of the length and the actions of
each of the first :data:`SAMPLE` episodes by name (the task id; ``#<index>`` in a LeRobot
dataset troupe did not make), the same whether the episodes are read from a run folder's store
or from the dataset its finalize wrote. Against the one recorded:

- a sampled episode holding other data (or gone, with as many episodes as then or more): the
  dataset was replaced, refused;
- fewer episodes: it shrank, refused;
- more episodes: it grew, said in one line, and recorded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from troupe.actors.lerobot.format import RGB_KEY
from troupe.runtime.errors import ConfigError

from .dataset import (
    _UNREADABLE,
    ClipSource,
    _actions,
    _committed,
    _finalized_sources,
    _store_source,
    store_dir,
)

__all__ = ["SAMPLE", "DatasetIdentity", "dataset_identity"]

SAMPLE = 8
"""Episodes whose data the identity digests (the first by name): a few reads, whatever the size."""

_UNKNOWN = object()  # an episode whose data do not read: not compared

_WAY_OUT = "give the run back the dataset it trained on, or --fresh to start anew on this one"


@dataclass(frozen=True)
class DatasetIdentity:
    """The identity of the dataset at ``root`` now (see the module)."""

    root: Path
    episodes: int
    sample: dict[str, str]
    sources: dict[str, Callable[[], ClipSource]] = field(repr=False, compare=False, default_factory=dict)

    def record(self) -> dict[str, Any]:
        """What the run record keeps."""
        return {"episodes": self.episodes, "sample": dict(self.sample)}

    def against(self, recorded: Any, out: Path) -> str | None:
        """Compare with the identity ``recorded`` when the checkpoints of ``out`` began.

        Returns:
            A line saying the dataset grew, or None (the same, or nothing recorded to compare).

        Raises:
            ConfigError: the dataset was replaced, or shrank.
        """
        if not _well_formed(recorded):
            return None  # recorded by an older troupe, or edited: nothing to hold it to
        then, where = recorded["episodes"], f"train.dataset {self.root}"
        now = {name: self._digest(name) for name in sorted(recorded["sample"])}
        other = [n for n, digest in now.items() if digest not in (None, _UNKNOWN, recorded["sample"][n])]
        gone = [name for name, digest in now.items() if digest is None]
        if other or (gone and self.episodes >= then):  # fewer episodes, the rest the same: shrank
            what = f"{other[0]} holds other data" if other else f"{gone[0]} is gone"
            raise ConfigError(
                f"{where} is not the dataset --out {out}'s checkpoints were trained on: its "
                f"episode {what} ({self.episodes} episodes now, {then} then); {_WAY_OUT}"
            )
        if self.episodes < then:
            raise ConfigError(
                f"{where} holds {self.episodes} episodes, fewer than the {then} --out {out}'s "
                f"checkpoints were trained on: it changed since; {_WAY_OUT}"
            )
        if self.episodes > then:
            return f"{where} has grown since the checkpoints began: {self.episodes} episodes, {then} then"
        return None

    def _digest(self, name: str) -> str | object | None:
        """The digest of the episode ``name`` now; None: it has none; _UNKNOWN: it does not
        read (the ranks say so, as they read it)."""
        if name in self.sample:
            return self.sample[name]
        source = self.sources.get(name)
        if source is None:
            return None
        try:
            return _digest(source())
        except _UNREADABLE:
            return _UNKNOWN


def dataset_identity(root: Path) -> DatasetIdentity | None:
    """The identity of the dataset at ``root``; None where it cannot be read (the ranks say
    why, as they read it) or is no dataset (refused before)."""
    try:
        sources = _sources(root)
        sample = {name: _digest(sources[name]()) for name in sorted(sources)[:SAMPLE]}
    except _UNREADABLE:
        return None
    return DatasetIdentity(root, len(sources), sample, sources)


# -- private ---------------------------------------------------------------------------------------


def _sources(root: Path) -> dict[str, Callable[[], ClipSource]]:
    """Each episode's name, with a function that gives its source (read only for the sample)."""
    if (root / "meta" / "info.json").is_file():
        sources = _finalized_sources(root, RGB_KEY)
        task_ids = _task_ids(root)
        return {task_ids.get(s.episode_index, f"#{s.episode_index}"): partial(_given, s) for s in sources}
    return {
        path.name: partial(_store_source, path, i, RGB_KEY)
        for i, path in enumerate(_committed(store_dir(root)))
    }


def _given(source: ClipSource) -> ClipSource:
    return source


def _task_ids(root: Path) -> dict[int, str]:
    """The task id of each episode of a finalized dataset troupe made (``troupe/task_id``)."""
    ids: dict[int, str] = {}
    for f in sorted((root / "meta" / "episodes").rglob("*.parquet")):
        table = pq.read_table(f)
        if "troupe/task_id" not in table.column_names:
            return {}
        rows = table.select(["episode_index", "troupe/task_id"]).to_pylist()
        ids.update({int(r["episode_index"]): str(r["troupe/task_id"]) for r in rows})
    return ids


def _digest(source: ClipSource) -> str:
    """sha256 of an episode's length, actions and their validity mask (the same bytes in a run's
    store and in the dataset its finalize writes)."""
    # Not the cached reader: a file replaced at the same path is read again.
    actions, mask = _actions.__wrapped__(source.frames, source.episode_index, source.shared)
    digest = hashlib.sha256(f"{source.length}\0".encode())
    digest.update(actions.tobytes())
    digest.update(mask.tobytes())
    return digest.hexdigest()


def _well_formed(recorded: Any) -> bool:
    if not isinstance(recorded, dict):
        return False
    episodes, sample = recorded.get("episodes"), recorded.get("sample")
    return (
        isinstance(episodes, int)
        and not isinstance(episodes, bool)
        and isinstance(sample, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in sample.items())
    )
