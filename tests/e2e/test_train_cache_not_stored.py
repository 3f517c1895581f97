"""A training run whose latent cache could store nothing on disk says so (report lc 2): its
``encoders.cache_dir`` on a disk with less free than the 64 MiB the cache leaves for checkpoints
skipped every write, and nothing said it (not the table, not ``--json``, not the log), so every
rerun encoded everything again. The write counts are in ``latent_cache`` now, and one line says
what was not stored, where, the free space and the reserve, and what to do.

A real one-host run on a test copy of the shipped config, its cache_dir on a 40 MiB tmpfs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.clip_data import write_run
from support.small_disk import small_disk
from support.train_run_cli import config_copy, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_a_cache_whose_disk_is_under_the_reserve_says_it_stored_nothing(tmp_path: Path) -> None:
    dataset = tmp_path / "dataset"
    write_run(dataset, {f"ep{i}": 24 for i in range(4)})
    with small_disk(tmp_path / "small", "40m") as disk:
        cache_dir = disk / "cache"
        changes = {"train": {"dataset": str(dataset)}, "encoders": {"cache_dir": str(cache_dir)}}
        config = config_copy(tmp_path / "train.toml", "train.toml", changes)
        out = tmp_path / "out"
        code, stdout, stderr = run_cli("run", str(config), "--out", str(out), "--json", "--steps", "3")
        assert code == 0, stdout[-3000:] + stderr[-3000:]
        assert not list(cache_dir.rglob("*.val"))  # nothing stored, as the line says
    cache = json.loads(stdout)["latent_cache"]
    skipped = cache["disk_writes_skipped"]
    assert cache["disk_writes"] == 0 and skipped > 0 and cache["disk_errors"] == 0, cache
    said = [line for line in stderr.splitlines() if "the latent cache stored" in line]
    assert len(said) == 1, stderr
    assert said[0].startswith(
        f"the latent cache stored 0 of {skipped} entries on disk ({skipped} skipped, 0 failed), so a "
        f"rerun encodes those again: the disk holding encoders.cache_dir {cache_dir} has "
    ), said
    assert "MiB free, and the cache leaves 64 MiB free there for checkpoints" in said[0], said
    assert said[0].endswith("free space on that disk, or give encoders.cache_dir one with room"), said
    events = [json.loads(line) for line in (out / "logs" / "local.jsonl").read_text().splitlines()]
    warned = [e for e in events if e.get("event") == "train_latent_cache_not_stored"]
    assert len(warned) == 1 and warned[0]["disk_writes_skipped"] == skipped, warned
    assert warned[0]["reserve_bytes"] == 64 << 20 and warned[0]["free_bytes"] < 64 << 20, warned
