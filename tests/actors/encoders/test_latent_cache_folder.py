"""The latent cache's disk folder is the user's to name: a damaged index touches only the
cache's own files, a folder holding others' is refused, and an index that cannot be opened for
want of space is no damage. The whole folder used to be renamed to ``<dir>.damaged``, and the
next damage deleted that, with the user's files in it."""

from __future__ import annotations

import errno
import sqlite3
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from troupe.actors.encoders import latent_cache
from troupe.actors.encoders.cache_folder import DAMAGED_INDEX, foreign_entries
from troupe.actors.encoders.latent_cache import LatentCache

FP = "encoder-v1"
_iterdir = Path.iterdir
PARAMS = {"fps": 10}


def _video(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (1, 3, 2, 8, 8), generator=generator, dtype=torch.uint8)


def _encode(video: torch.Tensor) -> torch.Tensor:
    return video.float().mean(dim=(1, 2)).flatten()


def _filled(disk: Path, seeds: range) -> None:
    with LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=disk) as cache:
        for seed in seeds:
            cache.get_or_compute(_video(seed), PARAMS, FP, lambda s=seed: _encode(_video(s)))
        cache.flush()


def _damage_index(disk: Path, seed: int) -> None:
    for extra in ("cache.db-wal", "cache.db-shm"):
        (disk / extra).unlink(missing_ok=True)
    (disk / "cache.db").write_bytes(np.random.default_rng(seed).bytes(40_000))


def test_a_damaged_index_is_set_aside_in_the_folder_and_the_cache_starts_empty(tmp_path: Path) -> None:
    disk = tmp_path / "latents"
    _filled(disk, range(4))
    assert any(p.is_dir() for p in disk.iterdir())  # entry folders were written
    _damage_index(disk, 0)
    calls = []
    with LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=disk) as cache:
        again = cache.get_or_compute(_video(0), PARAMS, FP, lambda: calls.append(1) or _encode(_video(0)))
        stats = cache.stats()
    assert torch.equal(again, _encode(_video(0))) and calls == [1] and stats["misses"] == 1
    assert (disk / DAMAGED_INDEX).is_file()  # kept for a look
    assert not (tmp_path / "latents.damaged").exists()  # the folder stays where the user named it
    # Only the new entry's file is left: the old ones no index knew were deleted.
    assert len(list(disk.rglob("*.val"))) == 1
    assert foreign_entries(disk) == []


def test_a_second_damage_replaces_the_first_index_and_keeps_the_folder(tmp_path: Path) -> None:
    disk = tmp_path / "latents"
    for seed in (0, 1):
        _filled(disk, range(2))
        _damage_index(disk, seed)
        LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=disk).close()
    assert (disk / DAMAGED_INDEX).read_bytes() == np.random.default_rng(1).bytes(40_000)
    assert not (tmp_path / "latents.damaged").exists()


def test_a_folder_holding_files_the_cache_did_not_write_is_refused_untouched(tmp_path: Path) -> None:
    disk = tmp_path / "mine"
    _filled(disk, range(2))
    (disk / "NOTES.txt").write_text("precious")
    (disk / "ab").mkdir(exist_ok=True)
    (disk / "ab" / "readme").write_text("mine too")  # a hex-named folder of the user's
    _damage_index(disk, 0)
    before = sorted(p.relative_to(disk) for p in disk.rglob("*"))
    refusal = r"cache_dir .*mine holds 'NOTES.txt', which the latent cache did not write"
    with pytest.raises(ValueError, match=refusal):
        LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=disk)
    assert sorted(p.relative_to(disk) for p in disk.rglob("*")) == before
    assert (disk / "NOTES.txt").read_text() == "precious"
    assert foreign_entries(disk) == ["NOTES.txt", "ab"]


def test_an_index_file_gone_while_the_folder_is_looked_at_is_not_foreign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process of the host closing its last connection deletes ``cache.db-shm`` and
    ``-wal``: listed a moment before, they are no file of anybody's, and an encoder starting then
    was refused as if the folder held a stranger's."""
    disk = tmp_path / "latents"
    _filled(disk, range(2))
    ghosts = [disk / "cache.db-shm", disk / "cache.db-wal"]
    listed = sorted({*disk.iterdir(), *ghosts})
    for ghost in ghosts:
        ghost.unlink(missing_ok=True)
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(listed) if self == disk else _iterdir(self))
    assert foreign_entries(disk) == []
    (disk / "NOTES.txt").symlink_to(tmp_path / "nowhere")  # a dangling link is no ghost: it is there
    listed.append(disk / "NOTES.txt")
    assert foreign_entries(disk) == ["NOTES.txt"]


Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize(
    ("says", "free_mib", "raised", "message"),
    [
        ("database or disk is full", 900, errno.ENOSPC, r"latent cache's cache_dir .* is full \("),
        # an existing index whose -wal or -shm cannot grow: sqlite says no more than this
        ("disk I/O error", 1, errno.ENOSPC, r"cache_dir .* is full \(1.0 MiB free\)"),
        ("attempt to write a readonly database", 900, errno.EROFS, r"cache_dir .* cannot be written \(a"),
    ],
    ids=["full", "full-existing-index", "read-only"],
)
def test_a_full_or_read_only_disk_is_one_line_and_no_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, says: str, free_mib: int, raised: int, message: str
) -> None:
    """sqlite's "database or disk is full" (an OperationalError, a DatabaseError too) had set a
    healthy cache aside as damaged; an existing cache on a full or read-only disk died with
    sqlite's bare words, naming neither the folder nor the cause, and its worker crash-looped."""
    disk = tmp_path / "latents"
    _filled(disk, range(2))
    before = sorted(p.relative_to(disk) for p in disk.rglob("*"))

    def failing(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError(says)

    monkeypatch.setattr(latent_cache.diskcache, "Cache", failing)
    monkeypatch.setattr(latent_cache.shutil, "disk_usage", lambda _: Usage(1 << 30, 0, free_mib << 20))
    with pytest.raises(OSError, match=message) as info:
        LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=disk)
    assert info.value.errno == raised and "\n" not in str(info.value) and str(disk) in str(info.value)
    assert sorted(p.relative_to(disk) for p in disk.rglob("*")) == before
    assert not (disk / DAMAGED_INDEX).exists()


def test_a_disk_io_error_on_a_disk_with_room_is_sqlite_s_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not said to be a full disk where it is not one."""

    def failing(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(latent_cache.diskcache, "Cache", failing)
    monkeypatch.setattr(latent_cache.shutil, "disk_usage", lambda _: Usage(1 << 30, 0, 900 << 20))
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        LatentCache(memory_bytes=0, disk_bytes=1 << 20, directory=tmp_path / "latents")
