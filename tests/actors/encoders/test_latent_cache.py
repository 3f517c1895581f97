"""The two-level latent cache: memory then disk, byte bounds, checksums, keys, sharing by processes."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import threading
from collections import namedtuple
from pathlib import Path
from typing import Any

import diskcache
import numpy as np
import pytest
import torch

from support.fake_clock import Clock
from support.log_capture import module_logs
from troupe.actors.encoders import latent_cache
from troupe.actors.encoders.latent_cache import DISK_RESERVE, LatentCache, cache_key, encode_entry

FP = "encoder-v1"
PARAMS = {"fps": 10, "size": [8, 8]}


def _video(seed: int, shape: tuple[int, ...] = (1, 3, 2, 8, 8)) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def _latents(seed: int, numel: int = 256) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))  # float32: 4 bytes each


class Encoder:
    """Counts its calls: a hit must not call it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, video: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return video.float().mean(dim=(1, 2)).flatten() * 0.5


def test_a_second_lookup_hits_memory(tmp_path: Path) -> None:
    enc, video = Encoder(), _video(0)
    with LatentCache(memory_bytes=1 << 20, disk_bytes=1 << 20, directory=tmp_path) as cache:
        first = cache.get_or_compute(video, PARAMS, FP, lambda: enc(video))
        second = cache.get_or_compute(video.clone(), PARAMS, FP, lambda: enc(video))
        stats = cache.stats()
    assert enc.calls == 1 and torch.equal(first, second)
    assert (stats["memory_hits"], stats["disk_hits"], stats["misses"]) == (1, 0, 1)
    assert stats["memory_hit_rate"] == 0.5


def test_after_memory_eviction_the_disk_returns_the_same_tensor(tmp_path: Path) -> None:
    enc = Encoder()
    videos = [_video(i) for i in range(3)]
    entry = 8 * 8 * 4  # bytes of one result (64 float32)
    with LatentCache(memory_bytes=entry, disk_bytes=1 << 20, directory=tmp_path) as cache:
        firsts = [cache.get_or_compute(v, PARAMS, FP, lambda v=v: enc(v)) for v in videos]
        cache.flush()
        assert cache.stats()["memory"]["items"] == 1  # only the last one fits in memory
        again = cache.get_or_compute(videos[0], PARAMS, FP, lambda: enc(videos[0]))
        stats = cache.stats()
    assert enc.calls == 3
    assert torch.equal(again, firsts[0]) and again.dtype == firsts[0].dtype
    assert stats["disk_hits"] == 1 and stats["disk_hit_rate"] == 0.25


def test_both_tiers_stay_within_their_byte_bounds(tmp_path: Path) -> None:
    memory_bytes, disk_bytes = 10_000, 400_000
    with LatentCache(memory_bytes, disk_bytes, tmp_path / "disk", write_queue=1000) as cache:
        for i in range(200):
            cache.put(f"k{i}", _latents(i, numel=1024))  # 4 KiB each: 800 KiB in all
            assert cache.stats()["memory"]["bytes"] <= memory_bytes
        cache.flush()
        stats = cache.stats()
        disk_files = sum(p.stat().st_size for p in (tmp_path / "disk").rglob("*.val"))
    assert stats["memory"]["bytes"] <= memory_bytes and stats["memory"]["items"] == 2
    assert 0 < stats["disk"]["bytes"] <= disk_bytes
    assert 0 < disk_files <= disk_bytes
    assert stats["disk_writes"] == 200 and stats["disk"]["items"] < 200  # the oldest were culled


def test_the_disk_tier_evicts_the_least_recently_used(tmp_path: Path) -> None:
    # diskcache culls the least recently used entries, several at a time, when over the bound.
    with LatentCache(0, 160_000, tmp_path) as cache:
        for i in range(60):  # 4 KiB each: about 240 KiB in all
            cache.put(f"k{i}", _latents(i, numel=1024))
            cache.flush()
            assert cache.get("k0") is not None  # kept the most recently used of the old ones
        stats = cache.stats()
        assert cache.get("k1") is None and cache.get("k59") is not None
    assert stats["disk"]["items"] < 60 and stats["disk"]["bytes"] <= 160_000


def _damage(directory: Path, how: str) -> int:
    files = list(directory.rglob("*.val"))
    for f in files:
        raw = bytearray(f.read_bytes())
        if how == "flip":
            raw[-1] ^= 0xFF  # one flipped byte in the payload
            f.write_bytes(bytes(raw))
        elif how == "truncate":
            f.write_bytes(bytes(raw[:20]))
        else:
            f.unlink()
    return len(files)


@pytest.mark.parametrize("how", ["flip", "truncate", "remove"])
def test_a_damaged_disk_file_is_encoded_again_never_returned(tmp_path: Path, how: str) -> None:
    enc, video = Encoder(), _video(1)
    with LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=tmp_path) as cache:
        good = cache.get_or_compute(video, PARAMS, FP, lambda: enc(video))
        cache.flush()
        assert _damage(tmp_path, how) == 1
        again = cache.get_or_compute(video, PARAMS, FP, lambda: enc(video))
        cache.flush()
        stats = cache.stats()
        third = cache.get_or_compute(video, PARAMS, FP, lambda: enc(video))  # the rewritten entry
    assert enc.calls == 2 and torch.equal(again, good) and torch.equal(third, good)
    assert stats["disk_hits"] == 0 and stats["misses"] == 2
    assert stats["corrupt"] == (0 if how == "remove" else 1)  # a vanished file is a plain miss


@pytest.mark.parametrize("memory_bytes", [1 << 20, 256])
def test_the_second_epoch_hits_every_group(tmp_path: Path, memory_bytes: int) -> None:
    enc = Encoder()
    videos = [_video(i) for i in range(8)]  # a fixed order, deterministic preprocessing
    with LatentCache(memory_bytes, 1 << 20, tmp_path) as cache:
        first = [cache.get_or_compute(v, PARAMS, FP, lambda v=v: enc(v)) for v in videos]
        cache.flush()
        before = cache.stats()
        second = [cache.get_or_compute(v, PARAMS, FP, lambda v=v: enc(v)) for v in videos]
        after = cache.stats()
    assert enc.calls == 8 and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    hits = after["memory_hits"] + after["disk_hits"] - before["memory_hits"] - before["disk_hits"]
    assert hits == 8 and after["misses"] == before["misses"] == 8
    # All in memory when it holds them; else (one entry of 256 bytes) from disk.
    assert after["disk_hits"] == (0 if memory_bytes > 256 else 8)


def test_an_entry_with_a_wrong_checksum_or_key_is_a_miss(tmp_path: Path) -> None:
    with LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=tmp_path) as cache:
        blob = bytearray(encode_entry("a", _latents(0)))
        blob[8] ^= 0x01  # inside the stored checksum
        with diskcache.Cache(str(tmp_path)) as raw:
            raw.set("a", bytes(blob))
            raw.set("b", encode_entry("a", _latents(1)))  # a valid entry, filed under another key
            raw.set("c", "not an entry")
        assert cache.get("a") is None and cache.get("b") is None and cache.get("c") is None
        assert cache.stats()["corrupt"] == 3
        with diskcache.Cache(str(tmp_path)) as raw:
            assert len(raw) == 0  # deleted, not left to fail again


def test_other_fingerprint_params_content_or_dtype_is_another_key() -> None:
    video = _video(2)
    key = cache_key(video, PARAMS, FP)
    assert key == cache_key(video.clone(), dict(reversed(PARAMS.items())), FP)
    others = [
        cache_key(video, PARAMS, "encoder-v2"),
        cache_key(video, {**PARAMS, "fps": 5}, FP),
        cache_key(_video(3), PARAMS, FP),
        cache_key(video.to(torch.int16), PARAMS, FP),
        cache_key(video.reshape(1, 3, 2, 4, 16), PARAMS, FP),
    ]
    assert key not in others and len(set(others)) == len(others)


def test_a_different_fingerprint_is_a_miss() -> None:
    enc, video = Encoder(), _video(4)
    with LatentCache(memory_bytes=1 << 20) as cache:
        cache.get_or_compute(video, PARAMS, FP, lambda: enc(video))
        cache.get_or_compute(video, PARAMS, "encoder-v2", lambda: enc(video))
        cache.get_or_compute(video, {**PARAMS, "fps": 5}, FP, lambda: enc(video))
        assert cache.stats()["misses"] == 3
    assert enc.calls == 3


def test_a_returned_tensor_is_a_copy() -> None:
    with LatentCache(memory_bytes=1 << 20) as cache:
        cache.put("k", _latents(0))
        got = cache.get("k")
        assert got is not None
        got.zero_()
        again = cache.get("k")
    assert again is not None and torch.equal(again, _latents(0))


def test_a_full_write_queue_skips_the_disk_write(tmp_path: Path) -> None:
    gate, writing = threading.Event(), threading.Event()
    with LatentCache(1 << 20, 1 << 20, tmp_path, write_queue=1) as cache:
        disk = cache._disk
        real_set = disk.set

        def stalled_set(*args: Any, **kwargs: Any) -> Any:  # a disk slower than encoding
            writing.set()
            assert gate.wait(30)
            return real_set(*args, **kwargs)

        disk.set = stalled_set
        cache.put("k0", _latents(0))
        assert writing.wait(30)  # the writer holds k0
        for i in range(1, 5):
            cache.put(f"k{i}", _latents(i))  # k1 waits in the queue; k2..k4 do not fit
        gate.set()
        cache.flush()
        stats = cache.stats()
    assert stats["disk_writes_skipped"] == 3 and stats["disk_writes"] == 2
    assert stats["memory"]["items"] == 5  # nothing lost from memory


def test_an_index_locked_by_another_process_is_a_miss_not_a_wait(tmp_path: Path) -> None:
    """An LRU lookup writes to the index: with its write lock held elsewhere (a process stopped
    mid-write, a ``sqlite3`` shell), every lookup of the host's encoders was retried without end."""
    clock, disk = Clock(), tmp_path / "disk"
    with LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=disk, clock=clock) as cache:
        key = cache_key(_video(0), PARAMS, FP)
        cache.put(key, _latents(0))
        cache.flush()
        holder = sqlite3.connect(disk / "cache.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        found: list[torch.Tensor | None] = []
        lookup = threading.Thread(target=lambda: found.append(cache.get(key)), daemon=True)
        try:
            lookup.start()
            lookup.join(timeout=60)
            assert found == [None]  # a miss: the sample is encoded
            assert cache.get(key) is None  # the pause after it: the disk is not asked
            stats = cache.stats()
            assert (stats["disk_busy"], stats["misses"], stats["disk_hits"]) == (2, 2, 0)
            assert stats["disk"]["items"] == 1  # the entry is kept, only not reached
        finally:
            holder.execute("ROLLBACK")
            holder.close()
            lookup.join(timeout=60)
        assert cache.get(key) is None  # the lock gone, the pause not over yet
        clock.now += latent_cache.BUSY_SKIP_S
        assert torch.equal(cache.get(key), _latents(0))  # and over: the entry is there, as it was


def test_a_folder_opened_with_another_bound_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """diskcache keeps one bound per folder and each writer culls it to its own: a quick run's
    small disk_mb on a production cache_dir culled it to that size, silently."""
    LatentCache(0, 1 << 20, tmp_path).close()
    with module_logs(monkeypatch, latent_cache) as logs:
        LatentCache(0, 1 << 20, tmp_path).close()  # the same bound: nothing to say
        LatentCache(0, 64 << 10, tmp_path).close()
    warned = [e for e in logs if e["event"] == "latent_cache_bound_differs"]
    assert [(e["disk_bytes"], e["recorded_bytes"]) for e in warned] == [(64 << 10, 1 << 20)]
    assert "the smallest of those writing holds" in warned[0]["note"]


def test_bad_bounds_name_the_argument() -> None:
    with pytest.raises(ValueError, match="memory_bytes=-1"):
        LatentCache(memory_bytes=-1)
    with pytest.raises(ValueError, match=r"disk_bytes=10000: a disk tier of 0.009537 MiB keeps nothing"):
        LatentCache(memory_bytes=0, disk_bytes=10_000, directory="/nowhere")  # each entry culled at once
    LatentCache(memory_bytes=0, disk_bytes=10_000).close()  # no folder: no disk tier, nothing to bound


def _writer(directory: str, seed: int) -> None:
    with LatentCache(0, 1 << 20, directory) as cache:
        cache.put(cache_key(_video(seed), PARAMS, FP), _latents(seed))


def test_two_processes_share_the_disk_tier(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), seed)) for seed in (10, 11)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    enc = Encoder()
    with LatentCache(0, 1 << 20, tmp_path) as cache:
        got = [cache.get_or_compute(_video(s), PARAMS, FP, lambda: enc(_video(0))) for s in (10, 11)]
        stats = cache.stats()
    assert enc.calls == 0 and stats["disk_hits"] == 2
    assert all(torch.equal(g, _latents(s)) for g, s in zip(got, (10, 11), strict=True))


def test_numpy_content_keys_like_its_bytes() -> None:
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert cache_key(arr, PARAMS, FP) == cache_key(arr.copy(order="F"), PARAMS, FP)
    assert cache_key(arr, PARAMS, FP) != cache_key(arr.astype(np.float64), PARAMS, FP)


def test_a_disk_short_of_its_reserve_gets_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints on that disk come first: a write that would leave it less than DISK_RESERVE
    free is skipped and counted, the entry kept in memory (a small disk had been filled by the
    cache, and the next checkpoint failed for want of space)."""
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(latent_cache.shutil, "disk_usage", lambda _: usage(1 << 30, 1 << 30, DISK_RESERVE))
    with LatentCache(1 << 20, 1 << 20, tmp_path) as cache:
        cache.put("k0", _latents(0))
        cache.flush()
        stats = cache.stats()
    assert stats["disk_writes_skipped"] == 1 and stats["disk_writes"] == 0
    assert stats["memory"]["items"] == 1


def test_an_entry_bigger_than_the_bound_leaves_is_refused_not_counted_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sm 4: an entry over what the disk bound leaves beside the index (32 KiB of a 64 KiB bound)
    was written, culled at once by its own write (every other entry before it), and counted
    written. Now it is refused and counted ``disk_writes_too_big``, said once; smaller ones stay."""
    with module_logs(monkeypatch, latent_cache) as logs, LatentCache(0, 64 << 10, tmp_path) as cache:
        cache.put("small", _latents(0))  # 1 KiB
        cache.flush()
        for seed in (1, 2):
            cache.put(f"big{seed}", _latents(seed, numel=10_000))  # 40 KiB each
        cache.flush()
        stats = cache.stats()
        kept = cache.get("small")
    assert (stats["disk_writes"], stats["disk"]["items"]) == (1, 1), stats
    assert kept is not None and torch.equal(kept, _latents(0))  # not culled by the big ones
    assert (stats["disk_writes_too_big"], stats["disk_writes_skipped"]) == (2, 0), stats
    (said,) = [e for e in logs if e["event"] == "latent_cache_entry_too_big"]
    assert said["entry_bytes"] > said["room_bytes"] and said["disk_bytes"] == 64 << 10, said
