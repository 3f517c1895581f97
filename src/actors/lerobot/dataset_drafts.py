"""A dataset's files written while its episodes are committed, so that finalize has less left.

Finalize writes every committed episode, in task-id order, into the dataset's shared files: the
data parquet files and, per video key, mp4s remuxed end to end; on the default run most of its
time, all of it after the last item. A writer that keeps :class:`DatasetDrafts` writes each
committed episode into drafts of those files as the run goes on, on a thread of its own;
finalize takes a draft whose episodes are the first of a file's (:meth:`DatasetDrafts.take` for
a video, :meth:`DatasetDrafts.take_data` for a data file), adds the rest and moves it into
place, and writes from the episodes, as without drafts, wherever a draft is not that: the drafts
change no byte of the dataset, only when the work is done. An episode's place in the data
(its index, its first frame's global index, its task's index) follows from the episodes before
it, which a draft has in the same order.

Episodes are drafted in task-id order, which is the dataset's. Told the run's items
(:meth:`DatasetDrafts.expect`, the writer's start hook), an episode is drafted as soon as every
item before it is: the newest ``LAG`` committed ones had been held back, since items end slightly
out of order, and finalize added them after the last item. An item before it that is not
committed (it died, an earlier run committed it, or none was told) holds an episode back until
``LAG`` newer ones are. An episode committed after a later one was drafted (a retried item, a
resumed run's gaps) ends the drafting; so does any error: a draft is never needed, and finalize
writes what was not drafted. Each process drafts into its own files (``PID-...`` under the
folder); those of a process gone are deleted as a writer starts (:func:`clear_stale`).

Each committed episode's ``episode.json`` is read once, as it is committed, and kept for finalize
(:meth:`DatasetDrafts.take_meta`): parsing them all was most of finalize's reading.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.output_store import fsync_path

from .episode_rows import episode_rows
from .format import EPISODE_FILE, FRAMES_FILE, VIDEO_KEYS, data_schema, video_file
from .video import VideoConcat

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

__all__ = ["DRAFTS_DIR", "LAG", "DataDraft", "DatasetDrafts", "clear_stale"]

log = get_logger("troupe.lerobot")

DRAFTS_DIR = ".drafts"  # a writer's drafts, in its OutputStore's folder
# Committed episodes held back behind an item not committed: items end slightly out of order.
LAG = 8
_SETTLE_S = 60.0  # the longest finalize waits for the drafting thread to catch up
# Drafted bytes not yet synced to disk past which the drafts are (``_sync``): what finalize's
# fsyncs, after the last item, still write; without, every byte (writeback waits half a minute).
SYNC_BYTES = 256 << 10


@dataclass
class _VideoDraft:
    concat: VideoConcat | None  # None once finalize took it, or an add failed in it
    signature: tuple[str, ...]
    nbytes: int = 0


@dataclass
class DataDraft:
    """A data file being written: its writer, where, and the episodes (folders) in it."""

    path: Path
    writer: pq.ParquetWriter
    episodes: list[Path] = field(default_factory=list)
    nbytes: int = 0
    taken: bool = False  # finalize's now, or given up

    def discard(self) -> None:
        """Close it (a partial file) and delete it."""
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


class DatasetDrafts:
    """Drafts of a dataset's data files and, per video key, its mp4s, in ``folder``.

    Args:
        folder: where the drafts are written (on the dataset's file system, or finalize copies
            nothing and writes as without drafts).
        video_limit_bytes: a video draft is closed once the next episode would pass this, as
            finalize's ``video_files_size_in_mb``.
        data_limit_bytes: the same for data files (``data_files_size_in_mb``).
    """

    def __init__(self, folder: Path, video_limit_bytes: int, data_limit_bytes: int) -> None:
        self.folder = folder
        self.video_limit_bytes = video_limit_bytes
        self.data_limit_bytes = data_limit_bytes
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="troupe-dataset-drafts")
        self._pending: list[tuple[str, Path]] = []  # committed, not drafted, by task id
        self._metas: dict[Path, dict[str, Any]] = {}  # episode folder -> its episode.json, parsed
        self._last: str | None = None  # the last task id drafted
        self._items: list[str] = []  # the run's task ids, sorted (``expect``)
        self._stopped: str | None = None  # why drafting ended, once it did
        self._videos: dict[str, list[_VideoDraft]] = {key: [] for key in VIDEO_KEYS}
        self._data: list[DataDraft] = []
        self._fps: int | None = None
        self._count = 0  # episodes drafted: the next one's index
        self._unsynced = 0  # bytes drafted since the drafts were last synced to disk
        self._frames = 0  # their frames: the next one's first global index
        self._tasks: dict[str, int] = {}  # task text -> index, in order of first appearance
        self._schema: pa.Schema | None = None  # data_schema(), made on the drafts' thread
        # PyAV and pyarrow, which no module of this package imports as it loads (see the
        # package's docstring), are imported now, on the drafts' thread, while the upstream
        # stages make the first episode: the writer's threads, which encode it and write its
        # frames, then find them imported. Drafting waits behind this (one thread, in order).
        self._pool.submit(_import_writers_modules)

    def expect(self, task_ids: list[str]) -> None:
        """The run's items (task ids): an episode is drafted once every item before it is, not
        held back. Before the first :meth:`committed`, as the run starts."""
        with contextlib.suppress(RuntimeError):  # closed: nothing more is drafted
            self._pool.submit(self._expect, sorted(task_ids))

    def committed(self, task_id: str, path: Path) -> None:
        """An episode committed at ``path``: drafted on the drafts' own thread, later."""
        with contextlib.suppress(RuntimeError):  # closed: nothing more is drafted
            self._pool.submit(self._add, task_id, path)

    def settle(self, timeout_s: float = _SETTLE_S) -> None:
        """Wait until what was committed so far is drafted or held back (at most ``timeout_s``:
        after that, drafting ends and finalize writes the rest)."""
        try:
            self._pool.submit(lambda: None).result(timeout=timeout_s)
        except RuntimeError:  # closed
            return
        except FutureTimeout:
            self._stop(f"still drafting after {timeout_s:g} s")

    def take(self, key: str, n: int, sources: list[Path], fps: int) -> VideoConcat | None:
        """Video draft ``n`` of ``key`` if its episodes are the first of ``sources`` (file
        ``n``'s, in order) at ``fps``, now finalize's to add the rest to and move; else None."""
        with self._lock:
            drafts = self._videos.get(key, [])
            concat = drafts[n].concat if n < len(drafts) else None
            if concat is None or self._fps != fps:
                return None
            done = concat.sources
            if done != sources[: len(done)] or (concat.closed and len(done) != len(sources)):
                return None
            drafts[n].concat = None
            return concat

    def take_data(self, n: int, episodes: list[Path]) -> DataDraft | None:
        """Data draft ``n`` if its episodes are the first of ``episodes`` (file ``n``'s, in
        order), now finalize's to write the rest to, close and move; else None."""
        with self._lock:
            draft = self._data[n] if n < len(self._data) else None
            if draft is None or draft.taken or draft.episodes != episodes[: len(draft.episodes)]:
                return None
            if n + 1 < len(self._data) and len(draft.episodes) != len(episodes):
                return None  # closed already, short of the file finalize writes
            draft.taken = True
            return draft

    def take_meta(self, episode: Path) -> dict[str, Any] | None:
        """The parsed ``episode.json`` of the committed episode at ``episode`` (its folder), now
        finalize's (asked again, None); None where it was not read (drafting had ended, or the
        file is not a JSON object): finalize reads it then."""
        with self._lock:
            return self._metas.pop(episode, None)

    def close(self) -> None:
        """Stop drafting and delete the drafts finalize did not take."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for drafts in self._videos.values():
                for draft in drafts:
                    if draft.concat is not None:
                        draft.concat.discard()
                drafts.clear()
            for data in self._data:
                if not data.taken:
                    data.discard()
            self._data.clear()
            self._metas.clear()

    # -- the drafts' thread -------------------------------------------------------------------

    def _add(self, task_id: str, path: Path) -> None:
        if self._stopped is not None:
            return
        self._read_meta(path)
        if self._last is not None and task_id <= self._last:
            self._stop(f"episode {task_id} was committed after {self._last} was drafted")
            return
        bisect.insort(self._pending, (task_id, path))
        while self._pending and self._stopped is None and (len(self._pending) > LAG or self._next()):
            early_id, early_path = self._pending.pop(0)
            try:
                self._draft(early_path)
            except Exception as exc:  # a draft is never needed: finalize writes what was not
                self._stop(f"{type(exc).__name__}: {exc}")
                return
            self._last = early_id

    def _expect(self, items: list[str]) -> None:
        self._items = items

    def _next(self) -> bool:
        """Whether the first episode pending is the run's next item after the last drafted."""
        at = 0 if self._last is None else bisect.bisect_right(self._items, self._last)
        return at < len(self._items) and self._items[at] == self._pending[0][0]

    def _read_meta(self, path: Path) -> None:
        # On its commit, not once drafted: the episodes held back are read before finalize too.
        try:
            meta = json.loads((path / EPISODE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # finalize reads it, and says what is wrong
        if isinstance(meta, dict):
            with self._lock:
                self._metas[path] = meta

    def _draft(self, path: Path) -> None:
        with self._lock:
            meta = self._metas.get(path)
        if meta is None:
            meta = json.loads((path / EPISODE_FILE).read_text(encoding="utf-8"))
        fps = int(meta["fps"])
        if self._fps is None:
            self._fps = fps
        elif fps != self._fps:
            raise ValueError(f"episode {path.name} is at {fps} fps, the drafts at {self._fps}")
        for key in VIDEO_KEYS:
            declared = tuple(str(meta["videos"][key][f]) for f in ("codec", "width", "height", "pix_fmt"))
            self._draft_video(key, path / video_file(key), declared, fps)
        task_index = self._tasks.setdefault(meta["task"], len(self._tasks))
        self._draft_data(path, task_index)
        self._count += 1
        self._frames += int(meta["length"])
        if self._unsynced >= SYNC_BYTES:
            self._sync()

    def _sync(self) -> None:
        """The open drafts' bytes to disk now, on this thread, as the run goes (``SYNC_BYTES``)."""
        self._unsynced = 0
        with self._lock:
            files = [d[-1].concat.dest for d in self._videos.values() if d and d[-1].concat is not None]
            files += [d.path for d in self._data[-1:] if not d.taken]
        for file in files:
            fsync_path(file)  # not fdatasync: macOS has none

    def _draft_video(self, key: str, src: Path, declared: tuple[str, ...], fps: int) -> None:
        size = src.stat().st_size
        with self._lock:
            drafts = self._videos[key]
            last = drafts[-1] if drafts else None
            if last is None or last.signature != declared or last.nbytes + size > self.video_limit_bytes:
                if last is not None and last.concat is not None:
                    last.concat.close()  # finished: finalize takes it only whole
                self.folder.mkdir(parents=True, exist_ok=True)
                last = _VideoDraft(VideoConcat(self._file(f"{key}-{len(drafts)}.mp4"), fps), declared)
                drafts.append(last)
            if last.concat is None:
                raise ValueError(f"draft {len(drafts) - 1} of {key} was given up")
            try:
                last.concat.add(src)
            except BaseException:  # part of its packets may be in: the draft is no use
                last.concat.discard()
                last.concat = None
                raise
            last.nbytes += size
        self._unsynced += size

    def _draft_data(self, path: Path, task_index: int) -> None:
        import pyarrow.parquet as pq

        schema = self._schema
        if schema is None:
            schema = self._schema = data_schema()
        size = (path / FRAMES_FILE).stat().st_size
        with self._lock:
            last = self._data[-1] if self._data else None
            if last is None or last.nbytes + size > self.data_limit_bytes:
                if last is not None and not last.taken:
                    last.writer.close()  # finished: finalize takes it only whole
                self.folder.mkdir(parents=True, exist_ok=True)
                where = self._file(f"data-{len(self._data)}.parquet")
                last = DataDraft(where, pq.ParquetWriter(where, schema))
                self._data.append(last)
            if last.taken:
                raise ValueError(f"data draft {len(self._data) - 1} was given up")
            try:
                rows = episode_rows(path, self._count, self._frames, task_index, schema)
                last.writer.write_table(rows)
            except BaseException:  # part of its rows may be in: the draft is no use
                last.taken = True
                last.discard()
                raise
            last.episodes.append(path)
            last.nbytes += size
        self._unsynced += size

    def _file(self, name: str) -> Path:
        return self.folder / f"{os.getpid()}-{name}"

    def _stop(self, why: str) -> None:
        if self._stopped is None:
            self._stopped = why
            log.info("dataset_drafts_stopped", folder=str(self.folder), why=why)


def _import_writers_modules() -> None:
    """Import what writing an episode and drafting it use, in the order a writer thread does
    (PyAV to encode, then pyarrow's parquet for the frames): a thread that needs one meanwhile
    waits for its import to finish rather than doing it again."""
    import av  # noqa: F401
    import pyarrow.parquet  # noqa: F401


def clear_stale(folder: Path) -> None:
    """Delete the drafts of processes that are gone (a writer killed mid-run left them)."""
    import psutil  # here: the writer stage calls it once, as a run starts

    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        pid = entry.name.partition("-")[0]
        if pid.isdigit() and psutil.pid_exists(int(pid)) and int(pid) != os.getpid():
            continue
        with contextlib.suppress(OSError):
            entry.unlink()
