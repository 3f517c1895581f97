"""The dataset's video files (``videos/{key}/chunk-XXX/file-YYY.mp4``): per video key, many
episodes remuxed end to end (no re-encoding; a new file past ``video_files_size_in_mb`` or where
an episode's codec headers differ), or one file per episode with ``remux_videos=False``; each
episode's span in its file is its ``meta/episodes`` video columns. A draft remuxed as the episodes
were committed is finished and moved into place rather than remuxed anew.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from troupe.actors.lerobot.errors import InvalidData
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.output_store import atomic_file, replace_durably

from .dataset_drafts import DatasetDrafts
from .finalize_episodes import MB, Episode, damaged, file_groups, file_slot
from .format import VIDEO_KEYS, VIDEO_PATH, video_file
from .video import SignatureMismatch, VideoConcat, concat_videos, video_signature

if TYPE_CHECKING:
    from .finalize import DatasetConfig

__all__ = ["write_videos"]

log = get_logger(__name__)


def write_videos(
    root: Path, episodes: list[Episode], cfg: DatasetConfig, drafts: DatasetDrafts | None
) -> tuple[set[Path], dict[int, dict[str, Any]]]:
    written: set[Path] = set()
    columns: dict[int, dict[str, Any]] = {ep.index: {} for ep in episodes}
    for key in VIDEO_KEYS:
        written |= _write_video_key(root, key, episodes, cfg, columns, drafts if cfg.remux_videos else None)
    return written, columns


def _write_video_key(
    root: Path,
    key: str,
    episodes: list[Episode],
    cfg: DatasetConfig,
    columns: dict[int, dict[str, Any]],
    drafts: DatasetDrafts | None = None,
) -> set[Path]:
    sources = {ep.index: ep.path / video_file(key) for ep in episodes}
    if not cfg.remux_videos:  # a file per episode
        return _write_video_files(root, key, episodes, cfg, columns, sources, lambda ep: None)
    # Episodes whose codec headers differ cannot share a stream: they start a new file. What
    # each episode.json declares splits them without opening every video; the remux checks
    # the whole signature on the files it opens anyway, and a difference the declarations
    # missed (codec headers, a damaged episode.json) sends us to the files themselves.
    declared = _declared_signatures(episodes, key)
    if declared is not None:
        try:
            return _write_video_files(root, key, episodes, cfg, columns, sources, declared.get, drafts)
        except SignatureMismatch:
            log.info("finalize_video_signatures_read", key=key)
    signatures = {i: video_signature(p) for i, p in sources.items()}
    return _write_video_files(root, key, episodes, cfg, columns, sources, signatures.get)


def _declared_signatures(episodes: list[Episode], key: str) -> dict[int, object] | None:
    try:
        return {
            ep.index: tuple(str(ep.meta["videos"][key][f]) for f in ("codec", "width", "height", "pix_fmt"))
            for ep in episodes
        }
    except (KeyError, TypeError):
        return None


def _write_video_files(
    root: Path,
    key: str,
    episodes: list[Episode],
    cfg: DatasetConfig,
    columns: dict[int, dict[str, Any]],
    sources: dict[int, Path],
    signature: Callable[[int], object],
    drafts: DatasetDrafts | None = None,
) -> set[Path]:
    written: set[Path] = set()
    limit = cfg.video_files_size_in_mb * MB if cfg.remux_videos else 0
    groups = file_groups(
        episodes,
        lambda ep: sources[ep.index].stat().st_size,
        limit,
        lambda ep: signature(ep.index),
    )
    for n, group in enumerate(groups):
        slot = file_slot(n, cfg.chunks_size)
        dest = root / VIDEO_PATH.format(video_key=key, **slot)
        paths = [sources[ep.index] for ep in group]
        draft = drafts.take(key, n, paths, cfg.fps) if drafts is not None else None
        spans = _finish_draft(draft, paths, dest) if draft is not None else None
        if spans is None:
            with atomic_file(dest) as tmp:
                spans = concat_videos(paths, tmp, cfg.fps)
        written.add(dest)
        for ep, (t0, t1) in zip(group, spans, strict=True):
            frames = round((t1 - t0) * cfg.fps)
            if frames != ep.length:
                said = f"its {key} video has {frames} frames but {ep.length} rows"
                raise InvalidData(damaged(ep.meta["task_id"], ep.path, said))
            columns[ep.index].update(
                {
                    f"videos/{key}/chunk_index": slot["chunk_index"],
                    f"videos/{key}/file_index": slot["file_index"],
                    f"videos/{key}/from_timestamp": t0,
                    f"videos/{key}/to_timestamp": t1,
                }
            )
    return written


def _finish_draft(draft: VideoConcat, sources: list[Path], dest: Path) -> list[tuple[float, float]] | None:
    """The draft with the rest of ``sources`` added, moved to ``dest`` (durably, as
    ``atomic_file``): its spans; None, the draft deleted, where that failed (a source that
    differs, another file system): the file is remuxed anew then."""
    try:
        for src in sources[len(draft.sources) :]:
            draft.add(src)
        draft.close()
        dest.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(draft.dest, dest)
    except (InvalidData, OSError) as exc:
        log.info("video_draft_unused", dest=str(dest), why=f"{type(exc).__name__}: {exc}")
        draft.discard()
        return None
    return draft.spans
