"""A training run's latent cache figures, asked of its encoder actors before they stop: summed
over the actors under the cache's names, a damaged entry logged once with the count, and an
encoder that cannot be asked making the figures partial rather than failing the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

import troupe.actors.training.encoder_figures as encoder_figures
from support.encoder_workers import encoder_worker
from support.log_capture import module_logs
from troupe.actors.training.encoder_figures import ask_encoders, not_stored_line, rank_asks
from troupe.cli.commands.train_report import cache_line
from troupe.runtime import TroupeError


def _video(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (1, 3, 2, 8, 8), generator=gen, dtype=torch.uint8)


async def _disk_writes_reach(ref: Any, n: int) -> None:
    with anyio.fail_after(30):  # the disk tier is written by a background thread
        while (await ref.ask("stats", timeout=30))["cache"]["disk_writes"] < n:
            await anyio.sleep(0.05)


async def test_figures_are_summed_and_damaged_entries_logged_once(
    troupe_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "latents"  # shared by both actors; no memory tier: every lookup reads it
    cached = {"encoder_kwargs": {}, "memory_mb": 0, "disk_mb": 4, "cache_dir": str(cache)}
    config = encoder_worker("encode-a", **cached) + encoder_worker("encode-b", **cached)
    cluster = troupe_cluster(config)
    async with cluster.client() as rt:
        a, b = rt.ref("encode-a"), rt.ref("encode-b")
        for seed in (0, 1):  # two misses, encoded and written to disk
            await a.ask("encode", {"tag": seed, "video": _video(seed)}, timeout=60)
        await _disk_writes_reach(a, 2)
        files = sorted(cache.rglob("*.val"))
        assert len(files) == 2, files
        for path in files:  # damaged on disk, as the report's 237 entries were
            path.write_bytes(b"damaged")
        for seed in (0, 1):  # both found damaged: deleted, encoded again, written again
            reply = await b.ask("encode", {"tag": seed, "video": _video(seed)}, timeout=60)
            assert reply["cached"] is False
        await _disk_writes_reach(b, 2)
        reply = await a.ask("encode", {"tag": 0, "video": _video(0)}, timeout=60)
        assert reply["cached"] is True  # a disk hit

        with module_logs(monkeypatch, encoder_figures) as logs:
            figures = await ask_encoders(lambda actor: rt.ref(actor).ask("stats", None, timeout=30),
                                         ["encode-a", "encode-b"])  # fmt: skip
    assert figures.requests == {"encode-a": 3, "encode-b": 2}
    assert figures.latent_cache == {
        "memory_hits": 0, "disk_hits": 1, "misses": 4, "corrupt": 2, "disk_writes": 4,
        "disk_writes_skipped": 0, "disk_errors": 0, "groups_encoded": 4,
        "partial": False, "unanswered": [], "not_counted": 0,
    }  # fmt: skip
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["event"], e["corrupt"]) for e in warnings] == [("train_latent_cache_corrupt", 2)]


async def test_an_encoder_that_cannot_be_asked_makes_them_partial(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {
        "encode-0": {"groups": 5, "encoded": 2, "cache": {"memory_hits": 1, "disk_hits": 2, "misses": 2}},
        "encode-1": TroupeError("no such actor: its worker died"),
        "encode-2": "not a map",
    }

    async def ask(actor: str) -> Any:
        answer = answers[actor]
        if isinstance(answer, Exception):
            raise answer
        return answer

    with module_logs(monkeypatch, encoder_figures) as logs:
        figures = await ask_encoders(ask, list(answers))
    assert figures.requests == {"encode-0": 5, "encode-1": -1, "encode-2": -1}
    assert figures.latent_cache == {
        "memory_hits": 1, "disk_hits": 2, "misses": 2, "corrupt": 0, "disk_writes": 0,
        "disk_writes_skipped": 0, "disk_errors": 0, "groups_encoded": 2,
        "partial": True, "unanswered": ["encode-1", "encode-2"], "not_counted": 0,
    }  # fmt: skip
    assert not [e for e in logs if e["log_level"] == "warning"]  # nothing damaged: no warning


async def test_requests_are_the_ranks_asks_and_a_restarted_worker_makes_the_counts_partial() -> None:
    """A worker killed mid-run counts its groups from its restart: 72 + 166 of the 300 groups the
    ranks had answered were reported as the run's requests, with partial: false."""
    answers = {
        "encode-0": {"groups": 72, "encoded": 72, "cache": {"misses": 72}},  # restarted at step 60
        "encode-1": {"groups": 166, "encoded": 166, "cache": {"misses": 166}},
    }

    async def ask(actor: str) -> Any:
        return answers[actor]

    names = list(answers)
    # Two ranks' last progress: asks by encoder index; 4 failed and were retried elsewhere.
    ranks = rank_asks(names, [{"requests": [80, 72], "retries": 4}, {"requests": [72, 80], "retries": 0}])
    assert ranks.requests == {"encode-0": 152, "encode-1": 152} and ranks.answered == 300
    figures = await ask_encoders(ask, names, ranks)
    assert figures.requests == {"encode-0": 152, "encode-1": 152}
    cache = figures.latent_cache
    assert cache["partial"] is True and cache["not_counted"] == 62 and cache["unanswered"] == []
    assert cache_line(cache).endswith(
        "; partial: 62 groups answered are not counted (an encoder's worker restarted)"
    )
    whole = await ask_encoders(ask, names, rank_asks(names, [{"requests": [72, 166], "retries": 0}]))
    assert whole.latent_cache["partial"] is False and whole.latent_cache["not_counted"] == 0


def test_a_disk_tier_that_stored_nothing_is_said_with_the_free_space_and_the_reserve() -> None:
    """Report lc 2: a cache_dir on a disk under the reserve stored nothing, every rerun encoded
    everything again, and nothing said so: the write counts are summed with the rest, and the
    run says it in one line."""
    answers = {
        "encode-0": {"groups": 20, "encoded": 20, "cache": {"misses": 20, "disk_writes_skipped": 20}},
        "encode-1": {"groups": 9, "encoded": 9, "cache": {"misses": 9, "disk_writes_skipped": 9}},
    }
    cache = encoder_figures.latent_cache_figures(answers)  # type: ignore[arg-type]
    assert (cache["disk_writes"], cache["disk_writes_skipped"], cache["disk_errors"]) == (0, 29, 0)
    assert not_stored_line(cache, "/small/cache", 59 << 20, 64 << 20) == (
        "the latent cache stored 0 of 29 entries on disk (29 skipped, 0 failed), so a rerun encodes "
        "those again: the disk holding encoders.cache_dir /small/cache has 59 MiB free, and the cache "
        "leaves 64 MiB free there for checkpoints (it skips a write too while the encoders outpace "
        "the disk); free space on that disk, or give encoders.cache_dir one with room"
    )
    assert cache_line(cache).endswith(", 29 groups encoded, 0 written to disk (29 skipped, 0 failed)")


def test_failed_disk_writes_are_said_and_a_cluster_s_free_space_is_not_guessed() -> None:
    cache = {"disk_writes": 5, "disk_writes_skipped": 0, "disk_errors": 3}
    line = not_stored_line(cache, "/c", None, 64 << 20)
    assert line == (
        "the latent cache stored 5 of 8 entries on disk (0 skipped, 3 failed), so a rerun encodes "
        "those again: the cache leaves 64 MiB free on the disk holding encoders.cache_dir /c (on each "
        "encoder host) for checkpoints; see that the cache can write there (its space, rights, a "
        "read-only mount)"
    )
    stored = {"disk_writes": 5, "disk_writes_skipped": 0, "disk_errors": 0}
    assert not_stored_line(stored, "/c", 1 << 30, 64 << 20) is None  # all stored: nothing said
    assert not_stored_line({}, "/c", 1 << 30, 64 << 20) is None  # no disk tier: nothing given
