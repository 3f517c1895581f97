"""A two-level cache of encoder outputs: memory (LRU, bounded in bytes), then local disk (LRU,
bounded in bytes, shared by every process of a host that opens the same folder).

The key is a sha256 of the input's content (bytes, dtype, shape), the preprocessing parameters
(canonical JSON) and the encoder's fingerprint (weights and code version, given by the caller),
so a hit is always what encoding again would give. Every disk entry carries a checksum of its
bytes: an entry that fails it, or cannot be read, is deleted, counted and treated as a miss,
never returned.

Writes go to memory at once and to disk through a background thread with a bounded queue
(write-through, so other processes of the host see an entry as soon as it is written): culling
the disk tier happens on that thread, and when the queue is full the disk write is skipped and
counted, so eviction never blocks encoding. A write that would leave its disk with less than
``DISK_RESERVE`` free is skipped and counted too (``disk_writes_skipped``): the checkpoints and the
dataset on that disk matter more than a cache (a small disk had been filled by the cache, and the
next checkpoint failed for want of space); the index's write-ahead log, which diskcache's byte
bound does not count, is checkpointed at an eighth of the bound (a 1 MB cache had grown 4.8 MB).
An entry heavier than the bound leaves beside the index is not written (``disk_writes_too_big``,
said once): its own write culled every other entry, then it.

A lookup is never waited for long either: an LRU lookup writes to the index (the entry's access
time), so another process holding the index's write lock (stopped or stuck in a transaction, a
``sqlite3`` shell) had every lookup of the host's encoders retried without end. One that cannot
take the lock within ``LOOKUP_WAIT_S`` is a miss, counted (``disk_busy``), and for ``BUSY_SKIP_S``
after it lookups do not ask the disk at all (misses, counted too): an encode on the event loop
waits at most ``LOOKUP_WAIT_S`` per ``BUSY_SKIP_S`` while the lock is held. Nor is a close: the
writer waits the lock out while the cache is open, but once it closes, a write that cannot take
the lock within ``LOOKUP_WAIT_S`` is dropped with those queued behind it (counted, logged once).

Example::

    cache = LatentCache(memory_bytes=256 << 20, disk_bytes=4 << 30, directory="/var/cache/latents")
    latents = cache.get_or_compute(video, {"fps": 10}, encoder_fingerprint, lambda: encode(video))
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import queue
import shutil
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import cachetools
import diskcache  # type: ignore[import-untyped]  # no types shipped
import numpy as np
import torch

from troupe.runtime.library_logging import get_logger

from .cache_folder import INDEX, foreign_problem, set_index_aside

__all__ = [
    "BUSY_SKIP_S",
    "DISK_RESERVE",
    "LOOKUP_WAIT_S",
    "MIN_DISK_BYTES",
    "LatentCache",
    "cache_key",
    "decode_entry",
    "disk_bound_problem",
    "encode_entry",
]

log = get_logger(__name__)

DISK_RESERVE = 64 << 20  # left free on the disk tier's disk: checkpoints and datasets come first
LOOKUP_WAIT_S = 0.2  # a lookup's wait for the index's write lock (others hold it for milliseconds)
BUSY_SKIP_S = 2.0  # after a lookup found the index locked, the disk is not asked for this long
MIN_DISK_BYTES = 64 << 10  # the smallest disk bound: the empty index alone weighs 32 KiB of it

_AS_INT = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}
_MAGIC = b"TLC1"
_PREFIX = struct.Struct("<4s32sI")  # magic, sha256 of (header + payload), header length


def _raw(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a contiguous CPU array (bf16 and fp8 through an integer view)."""
    t = t.detach().cpu().contiguous()
    return (t.view(_AS_INT[t.dtype]) if t.dtype in _AS_INT else t).numpy()


def cache_key(content: torch.Tensor | np.ndarray, params: Mapping[str, Any], fingerprint: str) -> str:
    """The cache key of ``content`` preprocessed with ``params`` and encoded by ``fingerprint``.

    Raises:
        TypeError: ``params`` is not JSON data (the key must not depend on object identity).
    """
    if isinstance(content, torch.Tensor):
        dtype, shape, arr = str(content.dtype), tuple(content.shape), _raw(content)
    else:
        arr = np.ascontiguousarray(content)
        dtype, shape = f"numpy.{arr.dtype.str}", arr.shape
    h = hashlib.sha256()
    head = {"dtype": dtype, "shape": list(shape), "params": dict(params), "encoder": fingerprint}
    h.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
    h.update(arr.data.cast("B") if arr.size else b"")
    return h.hexdigest()


def encode_entry(key: str, value: torch.Tensor) -> bytes:
    """A disk entry: a prefix with a checksum, a JSON header (key, dtype, shape), the raw bytes."""
    header = json.dumps({"key": key, "dtype": str(value.dtype).removeprefix("torch."),
                         "shape": list(value.shape)}).encode()  # fmt: skip
    payload = _raw(value).tobytes()
    digest = hashlib.sha256(header + payload).digest()
    return _PREFIX.pack(_MAGIC, digest, len(header)) + header + payload


def decode_entry(key: str, blob: bytes) -> torch.Tensor:
    """The tensor of a disk entry written by ``encode_entry`` for ``key``.

    Raises:
        ValueError: the entry is truncated, fails its checksum, or belongs to another key.
    """
    if len(blob) < _PREFIX.size:
        raise ValueError("truncated entry")
    magic, digest, header_len = _PREFIX.unpack_from(blob)
    body = blob[_PREFIX.size :]
    if magic != _MAGIC or header_len > len(body) or hashlib.sha256(body).digest() != digest:
        raise ValueError("checksum mismatch")
    header = json.loads(body[:header_len])
    if header["key"] != key:
        raise ValueError("entry of another key")
    dtype = getattr(torch, header["dtype"])
    carrier = _AS_INT.get(dtype, dtype)
    payload = bytearray(body[header_len:])  # writable: the tensor owns its memory
    flat = torch.frombuffer(payload, dtype=carrier) if payload else torch.empty(0, dtype=carrier)
    return flat.view(dtype).reshape(header["shape"])


def disk_bound_problem(disk_bytes: float) -> str | None:
    """One line refusing a disk tier bound too small to keep an entry, else None (0: no disk tier).
    The bound counts the index, which weighs 32 KiB empty: below it, every entry was culled by
    its own write, and the figures said each was written to disk."""
    if 0 < disk_bytes < MIN_DISK_BYTES:
        return (
            f"a disk tier of {disk_bytes / 2**20:.4g} MiB keeps nothing: its index alone weighs 32 KiB "
            f"of the bound; give it at least {MIN_DISK_BYTES / 2**20:.4g} MiB, or 0 for no disk tier"
        )
    return None


def _nbytes(value: torch.Tensor) -> int:
    return max(1, value.numel() * value.element_size())


class LatentCache:
    """Memory (LRU, ``memory_bytes``) over local disk (LRU, ``disk_bytes`` under ``directory``).

    ``directory=None`` or ``disk_bytes=0`` means no disk tier. Thread-safe; processes of a host
    that open the same ``directory`` share its disk tier (diskcache's SQLite index and files).
    Tensors returned are copies: writing to them does not change the cache.
    """

    def __init__(
        self,
        memory_bytes: int,
        disk_bytes: int = 0,
        directory: str | Path | None = None,
        write_queue: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if memory_bytes < 0 or disk_bytes < 0:
            raise ValueError(f"cache bounds must be >= 0, got memory_bytes={memory_bytes}, "
                             f"disk_bytes={disk_bytes}")  # fmt: skip
        too_small = disk_bound_problem(disk_bytes) if directory is not None else None
        if too_small:
            raise ValueError(f"disk_bytes={disk_bytes}: {too_small}")
        self.memory_limit = memory_bytes
        self.disk_limit = disk_bytes if directory is not None else 0
        self._lock = threading.Lock()
        self._memory: cachetools.LRUCache[str, torch.Tensor] = cachetools.LRUCache(
            maxsize=max(1, memory_bytes), getsizeof=_nbytes
        )
        self._counts = dict.fromkeys(
            ("memory_hits", "disk_hits", "misses", "corrupt", "disk_writes", "disk_writes_skipped",
             "disk_writes_too_big", "disk_errors", "disk_busy"), 0,
        )  # fmt: skip
        self._disk: diskcache.Cache | None = None
        self._clock = clock
        self._busy_until = -math.inf  # the disk tier is not asked until then (its index locked)
        self._directory = Path(str(directory)) if directory is not None else None
        self._queue: queue.Queue[tuple[str, torch.Tensor] | None] = queue.Queue(maxsize=max(1, write_queue))
        self._writer: threading.Thread | None = None
        # set by close: a write the index's lock holds up is then dropped, not waited for
        self._stopping = threading.Event()
        if self.disk_limit > 0:
            # Every value a file of its own (min file size 0): the index stays small and the
            # byte bound counts what the entries weigh.
            self._disk = _open_disk(Path(str(directory)), self.disk_limit)
            self._writer = threading.Thread(target=self._write_loop, name="latent-cache-writer", daemon=True)
            self._writer.start()

    @property
    def enabled(self) -> bool:
        """Whether any tier can hold an entry (a cache of no bytes looks nothing up)."""
        return self.memory_limit > 0 or self._disk is not None

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def get(self, key: str) -> torch.Tensor | None:
        """The cached value of ``key`` (memory, else disk, promoted to memory), or None."""
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None:
                self._counts["memory_hits"] += 1
                return hit.clone()
        value = self._disk_get(key)
        if value is None:
            self._count("misses")
            return None
        self._count("disk_hits")
        self._remember(key, value)
        return value.clone()

    def _disk_get(self, key: str) -> torch.Tensor | None:
        if self._disk is None:
            return None
        if self._clock() < self._busy_until:
            self._count("disk_busy")
            return None
        try:
            blob = self._disk.get(key, default=None, retry=False)
        except diskcache.Timeout:  # another process holds the index's write lock: a miss
            self._disk_busy()
            return None
        except Exception:  # an unreadable entry (its file gone or damaged): a miss, counted
            blob, unreadable = None, True
        else:
            unreadable = False
        if blob is None and not unreadable:
            return None
        try:
            if not isinstance(blob, bytes):
                raise ValueError(f"not an entry: {type(blob).__name__}")
            return decode_entry(key, blob)
        except Exception:
            self._count("corrupt")
            try:
                self._disk.delete(key, retry=False)
            except diskcache.Timeout:  # left for a later lookup to delete
                self._disk_busy()
            except Exception:
                self._count("disk_errors")
            return None

    def _disk_busy(self) -> None:
        with self._lock:
            self._counts["disk_busy"] += 1
            self._busy_until = self._clock() + BUSY_SKIP_S

    def _remember(self, key: str, value: torch.Tensor) -> None:
        if _nbytes(value) > self.memory_limit:
            return  # larger than the whole tier: disk only
        with self._lock:
            self._memory[key] = value

    def put(self, key: str, value: torch.Tensor) -> None:
        """Cache ``value`` (a copy) in memory now and on disk in the background."""
        value = value.detach().cpu().clone()
        self._remember(key, value)
        if self._disk is None:
            return
        try:
            self._queue.put_nowait((key, value))
        except queue.Full:
            self._count("disk_writes_skipped")

    def get_or_compute(
        self,
        content: torch.Tensor | np.ndarray,
        params: Mapping[str, Any],
        fingerprint: str,
        compute: Callable[[], torch.Tensor],
    ) -> torch.Tensor:
        """The cached value for these key parts, else ``compute()``'s, cached."""
        key = cache_key(content, params, fingerprint)
        hit = self.get(key)
        if hit is not None:
            return hit
        value = compute()
        self.put(key, value)
        return value

    def _write_loop(self) -> None:
        disk = self._disk
        assert disk is not None
        dropped = 0  # writes a lock held up at the stop, and those queued behind them
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    if dropped:
                        self._dropped_at_stop(dropped)
                    return
                if dropped:
                    dropped += 1
                    self._count("disk_writes_skipped")
                    continue
                key, value = item
                entry = encode_entry(key, value)
                if not self._room_for(len(entry)):
                    self._count("disk_writes_skipped")
                    continue
                if self._too_big(disk, len(entry)):
                    continue
                # waits out a lock (puts meanwhile are skipped), until the cache is closed
                if not self._unless_stopped(partial(disk.set, key, entry, retry=False)):
                    dropped = 1
                    self._count("disk_writes_skipped")
                    continue
                if disk.volume() > self.disk_limit:
                    self._unless_stopped(partial(disk.cull, retry=False))  # else the next write culls
                self._count("disk_writes")
            except Exception:  # a full or failing disk loses the entry, never the encoding
                self._count("disk_errors")
            finally:
                self._queue.task_done()

    def _unless_stopped(self, call: Callable[[], object]) -> bool:
        """``call()`` (a disk write), tried again while another process holds the index's lock
        (each try waits ``LOOKUP_WAIT_S``); False once the cache is closing: a stop waited up to
        30 s for a writer that could not take the lock, and left it retrying without end."""
        while True:
            try:
                call()
                return True
            except diskcache.Timeout:
                if self._stopping.is_set():
                    return False

    def _dropped_at_stop(self, count: int) -> None:
        log.warning(
            "latent_cache_writes_dropped", directory=str(self._directory), count=count,
            reason=f"the index was locked by another process for {LOOKUP_WAIT_S} s as the cache closed: "
            "those entries are encoded again when next needed",
        )  # fmt: skip

    def _too_big(self, disk: diskcache.Cache, nbytes: int) -> bool:
        """Whether an entry outweighs what the bound leaves beside the index: written, its own
        write culled every other entry, then it (the bound counts the index), and it was
        counted written. Counted ``disk_writes_too_big``; said the first time."""
        room = self.disk_limit - (disk.volume() - disk.reset("size"))  # the bound less the index
        if nbytes <= room:
            return False
        with self._lock:
            self._counts["disk_writes_too_big"] += 1
            first = self._counts["disk_writes_too_big"] == 1
        if first:
            log.warning(
                "latent_cache_entry_too_big", directory=str(self._directory), entry_bytes=nbytes,
                room_bytes=room, disk_bytes=self.disk_limit,
                note=f"entries over {max(room, 0) / 2**20:.3g} MiB are not kept on disk: give the disk tier "
                f"a disk_mb above {(nbytes + self.disk_limit - room) / 2**20:.3g} MiB to keep them",
            )  # fmt: skip
        return True

    def _room_for(self, nbytes: int) -> bool:
        assert self._directory is not None
        try:
            free = shutil.disk_usage(self._directory).free
        except OSError:
            return False
        return free - nbytes >= DISK_RESERVE

    def flush(self) -> None:
        """Wait until every queued disk write is done."""
        self._queue.join()

    def stats(self) -> dict[str, Any]:
        """Counts and bytes per tier, and hit rates (of all lookups) per tier; ``disk_busy``: lookups
        that found the disk tier's index locked by another process, or came in the pause after
        one, answered as misses."""
        with self._lock:
            counts = dict(self._counts)
            memory = {"items": len(self._memory), "bytes": int(self._memory.currsize),
                      "limit_bytes": self.memory_limit}  # fmt: skip
        lookups = counts["memory_hits"] + counts["disk_hits"] + counts["misses"]
        disk: dict[str, Any] = {"enabled": self._disk is not None, "limit_bytes": self.disk_limit}
        if self._disk is not None:
            disk |= {"items": len(self._disk), "bytes": int(self._disk.volume())}
        return {
            **counts,
            "lookups": lookups,
            "memory_hit_rate": counts["memory_hits"] / lookups if lookups else 0.0,
            "disk_hit_rate": counts["disk_hits"] / lookups if lookups else 0.0,
            "memory": memory,
            "disk": disk,
        }

    def close(self) -> None:
        """Finish the queued disk writes and close the disk tier. With the index locked by another
        process, the writes still queued are dropped (counted ``disk_writes_skipped``, logged as
        ``latent_cache_writes_dropped``) after one wait of ``LOOKUP_WAIT_S``."""
        if self._writer is not None:
            self._stopping.set()
            self._queue.put(None)
            self._writer.join(timeout=30)
            self._writer = None
        if self._disk is not None:
            self._disk.close()
            self._disk = None

    def __enter__(self) -> LatentCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wal_pages(size_limit: int) -> int:
    """Pages the index's write-ahead log grows to before SQLite checkpoints it: an eighth of
    the cache's bound (diskcache's 1000, 4 MB, for bounds of 32 MB and more)."""
    return max(16, min(1000, size_limit // 4096 // 8))


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _disk_full(directory: Path) -> OSError:
    free_bytes = _free_bytes(directory)
    free = "its free space unknown" if free_bytes is None else f"{free_bytes / 2**20:.1f} MiB free"
    return OSError(
        errno.ENOSPC,
        f"the disk holding the latent cache's cache_dir {directory} is full ({free}): its index cannot "
        "be opened; free space on it (its checkpoints or cache: --fresh deletes a run's), then run again",
    )


def _not_opened(directory: Path, exc: sqlite3.OperationalError) -> Exception:
    """What to raise for an index that could not be opened: one line for a full disk (sqlite says
    "database or disk is full", or "disk I/O error" where it cannot grow an existing index's
    ``-wal`` or ``-shm``) or a folder it may not write (a read-only mount), else sqlite's own
    error (a lock)."""
    text = str(exc)
    free = _free_bytes(directory)
    if "full" in text or ("disk I/O error" in text and free is not None and free < DISK_RESERVE):
        return _disk_full(directory)
    if "readonly" in text:  # "attempt to write a readonly database"
        return OSError(
            errno.EROFS,
            f"the latent cache's cache_dir {directory} cannot be written (a read-only file system, or "
            f"its files another user's; sqlite: {text}): name a folder this process may write, or "
            "disk_mb = 0 for no disk tier",
        )
    return exc


def _recorded_bound(directory: Path) -> int | None:
    """The byte bound the folder's index records, its last opener's (diskcache keeps one per
    folder), or None: no index yet, or not readable now (it is opened, and said, below)."""
    index = directory / INDEX
    if not index.is_file():
        return None
    try:
        reader = sqlite3.connect(f"{index.as_uri()}?mode=ro", uri=True, timeout=LOOKUP_WAIT_S)
        with contextlib.closing(reader) as db:
            row = db.execute("SELECT value FROM Settings WHERE key = 'size_limit'").fetchone()
    except sqlite3.Error:
        return None
    return int(row[0]) if row and isinstance(row[0], int) else None


def _open_disk(directory: Path, size_limit: int) -> diskcache.Cache:
    """The disk tier at ``directory``. One whose index is damaged (not a database) has the index
    set aside in the folder (``cache.db.damaged``, replacing an older one), its entries deleted,
    and starts empty: it is a cache, what it held is encoded again. Only the cache's own files
    are touched: the folder is the user's (the whole folder used to be renamed, and the next
    damage deleted it). An error that is no damage (``OperationalError``: a full disk, a lock)
    is raised as it is: setting a healthy cache aside would not mend it.

    Raises:
        ValueError: the folder holds files the cache did not write.
        OSError: the disk is full (ENOSPC), or the folder cannot be written (EROFS); one line.
        sqlite3.OperationalError: the index could not be opened (a lock).
    """
    problem = foreign_problem(directory, "cache_dir")
    if problem:
        raise ValueError(problem)

    recorded = _recorded_bound(directory)
    if recorded is not None and recorded != size_limit:
        log.warning(
            "latent_cache_bound_differs", directory=str(directory), disk_bytes=size_limit,
            recorded_bytes=recorded,
            note="encoders naming one cache_dir share one bound: each culls the whole folder to its own, so "
            "the smallest of those writing holds; give them one disk_mb (this one's is recorded now)",
        )  # fmt: skip

    def opened() -> diskcache.Cache:
        # Every value a file of its own (min file size 0): the index stays small and the
        # byte bound counts what the entries weigh.
        return diskcache.Cache(
            str(directory), timeout=LOOKUP_WAIT_S, size_limit=size_limit,
            eviction_policy="least-recently-used", disk_min_file_size=0,
            sqlite_wal_autocheckpoint=_wal_pages(size_limit),
        )  # fmt: skip

    try:
        return opened()
    except sqlite3.OperationalError as exc:
        said = _not_opened(directory, exc)
        if said is exc:
            raise
        raise said from None
    except sqlite3.DatabaseError as exc:  # "file is not a database", "malformed": damage
        aside = set_index_aside(directory)
        log.warning("latent_cache_damaged", directory=str(directory), moved_to=str(aside), error=str(exc))
        return opened()
