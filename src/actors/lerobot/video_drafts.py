"""A dataset's mp4s remuxed while its episodes are written, so that finalize has less left.

Finalize remuxes every committed episode's videos, in task-id order, into the dataset's shared
mp4s: on the default run, half of its time, all of it after the last item. A writer that keeps
:class:`VideoDrafts` remuxes each committed episode into a draft of those files as the run goes
on, on a thread of its own; finalize takes a draft whose episodes are the first of a file's
(:meth:`VideoDrafts.take`), adds the rest and moves it into place, and remuxes from the
episodes, as without drafts, wherever a draft is not that: the drafts change no byte of the
dataset, only when the work is done.

Episodes are drafted in task-id order, which is the dataset's, and the newest ``LAG`` committed
ones are held back, since items end slightly out of order. An episode committed after a later
one was drafted (a retried item, a resumed run's gaps) ends the drafting; so does any error: a
draft is never needed, and finalize remuxes what was not drafted. Each process drafts into its
own files (``PID-KEY-N.mp4`` under the folder); those of a process gone are deleted as a
writer starts (:func:`clear_stale`).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

import psutil
import structlog

from .format import EPISODE_FILE, VIDEO_KEYS, video_file
from .video import VideoConcat

__all__ = ["DRAFTS_DIR", "LAG", "VideoDrafts", "clear_stale"]

log = structlog.get_logger("troupe.lerobot")

DRAFTS_DIR = ".video-drafts"  # a writer's drafts, in its OutputStore's folder
LAG = 8  # committed episodes held back from the drafts: items end slightly out of order
_SETTLE_S = 60.0  # the longest finalize waits for the drafting thread to catch up


@dataclass
class _Draft:
    concat: VideoConcat | None  # None once finalize took it, or an add failed in it
    signature: tuple[str, ...]
    nbytes: int = 0


class VideoDrafts:
    """Drafts of a dataset's mp4s, per video key, in ``folder``.

    Args:
        folder: where the drafts are written (on the dataset's file system, or finalize copies
            nothing and remuxes as without drafts).
        limit_bytes: a draft file is closed once the next episode would pass this, as
            finalize's ``video_files_size_in_mb``.
    """

    def __init__(self, folder: Path, limit_bytes: int) -> None:
        self.folder = folder
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="troupe-video-drafts")
        self._pending: list[tuple[str, Path]] = []  # committed, not drafted, by task id
        self._last: str | None = None  # the last task id drafted
        self._stopped: str | None = None  # why drafting ended, once it did
        self._files: dict[str, list[_Draft]] = {key: [] for key in VIDEO_KEYS}
        self._fps: int | None = None

    def committed(self, task_id: str, path: Path) -> None:
        """An episode committed at ``path``: drafted on the drafts' own thread, later."""
        with contextlib.suppress(RuntimeError):  # closed: nothing more is drafted
            self._pool.submit(self._add, task_id, path)

    def settle(self, timeout_s: float = _SETTLE_S) -> None:
        """Wait until what was committed so far is drafted or held back (at most ``timeout_s``:
        after that, drafting ends and finalize remuxes the rest)."""
        try:
            self._pool.submit(lambda: None).result(timeout=timeout_s)
        except RuntimeError:  # closed
            return
        except FutureTimeout:
            self._stop(f"still drafting after {timeout_s:g} s")

    def take(self, key: str, n: int, sources: list[Path], fps: int) -> VideoConcat | None:
        """Draft ``n`` of ``key`` if its episodes are the first of ``sources`` (file ``n``'s, in
        order) at ``fps``, now finalize's to add the rest to and move; else None."""
        with self._lock:
            drafts = self._files.get(key, [])
            concat = drafts[n].concat if n < len(drafts) else None
            if concat is None or self._fps != fps:
                return None
            done = concat.sources
            if done != sources[: len(done)] or (concat.closed and len(done) != len(sources)):
                return None
            drafts[n].concat = None
            return concat

    def close(self) -> None:
        """Stop drafting and delete the drafts finalize did not take."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for drafts in self._files.values():
                for draft in drafts:
                    if draft.concat is not None:
                        _discard(draft.concat)
                drafts.clear()

    # -- the drafts' thread -------------------------------------------------------------------

    def _add(self, task_id: str, path: Path) -> None:
        if self._stopped is not None:
            return
        if self._last is not None and task_id <= self._last:
            self._stop(f"episode {task_id} was committed after {self._last} was drafted")
            return
        bisect.insort(self._pending, (task_id, path))
        while len(self._pending) > LAG and self._stopped is None:
            early_id, early_path = self._pending.pop(0)
            try:
                self._draft(early_id, early_path)
            except Exception as exc:  # a draft is never needed: finalize remuxes what was not
                self._stop(f"{type(exc).__name__}: {exc}")
                return
            self._last = early_id

    def _draft(self, task_id: str, path: Path) -> None:
        meta = json.loads((path / EPISODE_FILE).read_text(encoding="utf-8"))
        fps = int(meta["fps"])
        if self._fps is None:
            self._fps = fps
        elif fps != self._fps:
            raise ValueError(f"episode {task_id} is at {fps} fps, the drafts at {self._fps}")
        for key in VIDEO_KEYS:
            src = path / video_file(key)
            declared = tuple(str(meta["videos"][key][f]) for f in ("codec", "width", "height", "pix_fmt"))
            size = src.stat().st_size
            with self._lock:
                drafts = self._files[key]
                last = drafts[-1] if drafts else None
                if last is None or last.signature != declared or last.nbytes + size > self.limit_bytes:
                    if last is not None and last.concat is not None:
                        last.concat.close()  # finished: finalize takes it only whole
                    self.folder.mkdir(parents=True, exist_ok=True)
                    dest = self.folder / f"{os.getpid()}-{key}-{len(drafts)}.mp4"
                    last = _Draft(VideoConcat(dest, fps), declared)
                    drafts.append(last)
                if last.concat is None:
                    raise ValueError(f"draft {len(drafts) - 1} of {key} was given up")
                try:
                    last.concat.add(src)
                except BaseException:  # part of its packets may be in: the draft is no use
                    _discard(last.concat)
                    last.concat = None
                    raise
                last.nbytes += size

    def _stop(self, why: str) -> None:
        if self._stopped is None:
            self._stopped = why
            log.info("video_drafts_stopped", folder=str(self.folder), why=why)


def _discard(concat: VideoConcat) -> None:
    with contextlib.suppress(Exception):
        concat.close()
    with contextlib.suppress(OSError):
        concat.dest.unlink()


def clear_stale(folder: Path) -> None:
    """Delete the drafts of processes that are gone (a writer killed mid-run left them)."""
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
