"""The dataset's data files (``data/chunk-XXX/file-YYY.parquet``): the episodes' rows, many
episodes per file, a new file past ``data_files_size_in_mb``; a draft written as the episodes were
committed is finished and moved into place rather than written anew.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from troupe.actors.lerobot.errors import InvalidData
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.output_store import atomic_file, replace_durably

from .dataset_drafts import DataDraft, DatasetDrafts
from .episode_rows import episode_rows
from .finalize_episodes import MB, Episode, damaged, file_groups, file_slot
from .format import DATA_PATH, FRAMES_FILE, data_schema

if TYPE_CHECKING:
    from .finalize import DatasetConfig

__all__ = ["write_data"]

log = get_logger(__name__)


def write_data(
    root: Path, episodes: list[Episode], cfg: DatasetConfig, drafts: DatasetDrafts | None = None
) -> tuple[set[Path], dict[int, dict[str, int]]]:
    schema = data_schema()
    written: set[Path] = set()
    where: dict[int, dict[str, int]] = {}
    groups = file_groups(
        episodes,
        lambda ep: (ep.path / FRAMES_FILE).stat().st_size,
        cfg.data_files_size_in_mb * MB,
        lambda ep: None,
    )
    for n, group in enumerate(groups):
        slot = file_slot(n, cfg.chunks_size)
        dest = root / DATA_PATH.format(**slot)
        paths = [ep.path for ep in group]
        draft = drafts.take_data(n, paths) if drafts is not None else None
        if draft is None or not _finish_data_draft(draft, group, schema, dest):
            with atomic_file(dest) as tmp, pq.ParquetWriter(tmp, schema) as writer:
                for ep in group:
                    writer.write_table(_rows(ep, schema))
        for ep in group:
            where[ep.index] = slot
        written.add(dest)
    return written, where


def _rows(ep: Episode, schema: pa.Schema) -> pa.Table:
    try:
        return episode_rows(ep.path, ep.index, ep.start, ep.task_index, schema)
    except (pa.ArrowException, OSError) as exc:
        said = f"{ep.path / FRAMES_FILE} cannot be read ({exc})"
        raise InvalidData(damaged(ep.meta["task_id"], ep.path, said)) from None


def _finish_data_draft(draft: DataDraft, group: list[Episode], schema: pa.Schema, dest: Path) -> bool:
    """The data draft with the rest of ``group``'s rows written, moved to ``dest`` (durably);
    False, the draft deleted, where that failed: the file is written anew then."""
    try:
        for ep in group[len(draft.episodes) :]:
            draft.writer.write_table(_rows(ep, schema))
        draft.writer.close()
        dest.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(draft.path, dest)
    except (InvalidData, OSError, pa.ArrowException) as exc:
        log.info("data_draft_unused", dest=str(dest), why=f"{type(exc).__name__}: {exc}")
        draft.discard()
        return False
    return True
