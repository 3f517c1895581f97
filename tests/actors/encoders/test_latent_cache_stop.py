"""Closing a latent cache while another process holds its index's write lock (sm 3).

The background writer waited the lock out without end, and ``close`` waited 30 s for it, then
closed the index under a writer still retrying: an encoder's stop took 30 s while a ``sqlite3``
shell, or a process stopped mid-write, held the lock. Now the writes still queued are dropped
after one wait of a lookup's (they are cache entries: encoded again when next needed), counted
and logged, and the writer ends.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.log_capture import module_logs
from troupe.actors.encoders import latent_cache
from troupe.actors.encoders.latent_cache import LatentCache

# holds the index's write lock until its stdin closes
HOLD = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
db.execute("ROLLBACK")
"""


def _latents(seed: int) -> torch.Tensor:
    return torch.randn(256, generator=torch.Generator().manual_seed(seed))


def test_a_close_with_the_index_locked_elsewhere_drops_the_queued_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = tmp_path / "disk"
    cache = LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=disk)
    writer = cache._writer
    assert writer is not None
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(disk / "cache.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        for seed in range(3):
            cache.put(f"k{seed}", _latents(seed))
        with module_logs(monkeypatch, latent_cache) as logs:
            cache.close()
        # the writer ended, with the lock still held: the close did not wait for it
        assert not writer.is_alive()
        assert holder.poll() is None
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the lock is released
        try:
            holder.wait(timeout=60)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(timeout=60)
            assert holder.stdout is not None
            holder.stdout.close()
    stats = cache.stats()
    assert (stats["disk_writes"], stats["disk_writes_skipped"], stats["disk_errors"]) == (0, 3, 0), stats
    (said,) = [e for e in logs if e["event"] == "latent_cache_writes_dropped"]
    assert said["count"] == 3 and said["log_level"] == "warning", said
    # the folder is whole: a cache opened on it after writes as before, and none of the three is there
    with LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=disk) as again:
        assert all(again.get(f"k{seed}") is None for seed in range(3))
        again.put("k3", _latents(3))
        again.flush()
        assert torch.equal(again.get("k3"), _latents(3))
