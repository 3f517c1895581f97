"""What a training run's encoder actors did, asked of each once the ranks are done and before the
actors are stopped (their counts die with them): the sample groups each answered, and the latent
cache's figures summed over them.

The cache's figures keep the names :meth:`~troupe.actors.encoders.latent_cache.LatentCache.stats`
gives them (``memory_hits``, ``disk_hits``, ``misses``, ``corrupt``, and the disk tier's writes:
``disk_writes``, ``disk_writes_skipped``, ``disk_errors``), and ``groups_encoded`` is the actor's
``encoded`` (the name its metrics export). A corrupt entry is a disk entry that failed its
checksum or did not read: it was deleted and encoded again, so it is counted among the misses
too. A disk tier that stored fewer entries than it was given (its disk under the reserve the
cache leaves free for checkpoints, or failing) is said in one line per run
(:func:`not_stored_line`): it said so nowhere, and every rerun encoded everything again. An
encoder that cannot be asked (its worker died) leaves the sums ``partial``, naming it in
``unanswered``: the run's result is still the run's.

``requests`` is the ranks' figure: the asks they sent each encoder (``TrainResult.requests``,
summed over the ranks, since their last (re)start, as the losses), not the actor's own count,
which starts again with its worker (a worker killed mid-run had its 72 of 150 groups reported
as the run's). The cache's figures can only be the actors': where they count fewer groups than
the ranks had answered, a worker restarted and lost its counts, and the sums say ``partial``
with ``not_counted`` (they had said ``partial: false`` of 238 of 300 groups).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from troupe.runtime import TroupeError
from troupe.runtime.library_logging import get_logger

__all__ = [
    "CACHE_FIGURES",
    "EncoderFigures",
    "RankAsks",
    "ask_encoders",
    "latent_cache_figures",
    "not_stored_line",
    "rank_asks",
]

log = get_logger(__name__)

CACHE_FIGURES = (
    "memory_hits",
    "disk_hits",
    "misses",
    "corrupt",
    "disk_writes",
    "disk_writes_skipped",
    "disk_errors",
)
"""The latent cache's own counts summed over the encoder actors, under the cache's names."""


@dataclass(frozen=True)
class RankAsks:
    """What the ranks asked of the encoders: ``requests`` per actor, and ``answered``, the asks
    that got an answer (the requests less the ones retried elsewhere after a failure)."""

    requests: dict[str, int]
    answered: int


def rank_asks(actors: Sequence[str], progress: Sequence[dict[str, Any]]) -> RankAsks:
    """The ranks' asks per encoder from their last ``progress`` answers (``requests`` by actor
    index, ``retries``), summed over the ranks."""
    requests = dict.fromkeys(actors, 0)
    retries = 0
    for reply in progress:
        counts = reply.get("requests")
        for i, n in enumerate(counts if isinstance(counts, list) else []):
            if i < len(actors):
                requests[actors[i]] += int(n)
        retries += int(reply.get("retries") or 0)
    return RankAsks(requests, max(0, sum(requests.values()) - retries))


@dataclass(frozen=True)
class EncoderFigures:
    """``requests``: per encoder actor, the ranks' asks where given (see the module), else the
    groups it answered (-1: it could not be asked); ``latent_cache``: :func:`latent_cache_figures`
    of their answers."""

    requests: dict[str, int]
    latent_cache: dict[str, Any]


def latent_cache_figures(
    answers: dict[str, dict[str, Any] | None], answered_by_ranks: int | None = None
) -> dict[str, Any]:
    """The cache figures summed over the encoders' ``stats`` answers (None: not answered).

    Returns ``memory_hits``, ``disk_hits``, ``misses``, ``corrupt``, ``disk_writes``,
    ``disk_writes_skipped``, ``disk_errors``, ``groups_encoded``, and ``partial`` (some encoder
    did not answer, or the encoders count fewer groups than ``answered_by_ranks``) with
    ``unanswered`` (their names, sorted) and ``not_counted`` (the groups the ranks had answered
    that the counts miss: 0 when all are counted).
    """
    sums = dict.fromkeys((*CACHE_FIGURES, "groups_encoded"), 0)
    unanswered = sorted(actor for actor, stats in answers.items() if stats is None)
    for stats in answers.values():
        if stats is None:
            continue
        found = stats.get("cache")
        cache: dict[str, Any] = found if isinstance(found, dict) else {}
        for name in CACHE_FIGURES:
            sums[name] += int(cache.get(name) or 0)
        sums["groups_encoded"] += int(stats.get("encoded") or 0)
    counted = sum(int(stats.get("groups") or 0) for stats in answers.values() if stats is not None)
    not_counted = 0 if answered_by_ranks is None else max(0, answered_by_ranks - counted)
    partial = bool(unanswered) or not_counted > 0
    return {**sums, "partial": partial, "unanswered": unanswered, "not_counted": not_counted}


async def ask_encoders(
    ask: Callable[[str], Awaitable[Any]], actors: Sequence[str], ranks: RankAsks | None = None
) -> EncoderFigures:
    """Each of ``actors`` asked for its ``stats`` through ``ask`` (a TroupeError, or an answer
    that is not a map: not answered); the figures logged, and damaged cache entries found, if
    any, logged once at warning with their count (one line per entry would flood the log).
    ``ranks``: what the ranks asked, the run's ``requests`` (see the module)."""
    answers: dict[str, dict[str, Any] | None] = {}
    for actor in actors:
        try:
            reply = await ask(actor)
        except TroupeError:
            reply = None
        answers[actor] = reply if isinstance(reply, dict) else None
    if ranks is not None:
        requests = dict(ranks.requests)
    else:
        requests = {a: -1 if s is None else int(s.get("groups") or 0) for a, s in answers.items()}
    cache = latent_cache_figures(answers, None if ranks is None else ranks.answered)
    log.info("train_latent_cache", **cache)
    if cache["corrupt"]:
        log.warning(
            "train_latent_cache_corrupt",
            corrupt=cache["corrupt"],
            partial=cache["partial"],
            note="damaged disk entries of the latent cache were deleted and encoded again",
        )
    return EncoderFigures(requests, cache)


def not_stored_line(
    cache: dict[str, Any], cache_dir: str, free_bytes: int | None, reserve: int
) -> str | None:
    """The line that says the latent cache's disk tier stored fewer entries than it was given,
    and what to do; None where it stored all (or was given none: no disk tier).

    ``cache``: :func:`latent_cache_figures`; ``cache_dir``: the encoders' ``cache_dir``;
    ``free_bytes``: the free space of the disk holding it, now (None: not known here, as on a
    cluster's hosts); ``reserve``: what the cache leaves free on that disk for checkpoints.
    """
    skipped, errors = int(cache.get("disk_writes_skipped") or 0), int(cache.get("disk_errors") or 0)
    if not skipped and not errors:
        return None
    written = int(cache.get("disk_writes") or 0)
    where = f"the disk holding encoders.cache_dir {cache_dir}"
    if free_bytes is None:  # each encoder host's own disk
        disk = f"the cache leaves {_mib(reserve)} free on {where} (on each encoder host) for checkpoints"
    else:
        disk = f"{where} has {_mib(free_bytes)} free, and the cache leaves {_mib(reserve)} free there"
        disk += " for checkpoints"
    todo = []
    if skipped:
        disk += " (it skips a write too while the encoders outpace the disk)"
        todo.append("free space on that disk, or give encoders.cache_dir one with room")
    if errors:
        todo.append("see that the cache can write there (its space, rights, a read-only mount)")
    return (
        f"the latent cache stored {written} of {written + skipped + errors} entries on disk "
        f"({skipped} skipped, {errors} failed), so a rerun encodes those again: {disk}; {'; '.join(todo)}"
    )


def _mib(nbytes: int) -> str:
    """``nbytes`` in MiB as the line says them: whole from 10 MiB, else to a tenth."""
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 10 * 2**20 else f"{nbytes / 2**20:.1f} MiB"
