"""The committed episodes as finalize reads them: each loaded in task id order (its
``episode.json``, or the one the drafts read as it was committed), with its episode, task and
first frame indices; checked to agree in fps, video sizes and depth range; the error that names
one damaged since its commit; and how consecutive episodes are grouped into the dataset's files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from troupe.actors.lerobot.errors import InvalidData
from troupe.runtime.library_logging import get_logger
from troupe.runtime.tasks.output_store import OutputStore

from .dataset_drafts import DatasetDrafts
from .format import EPISODE_FILE, EPISODE_FORMAT, VIDEO_KEYS

__all__ = ["MB", "Episode", "check_uniform", "damaged", "file_groups", "file_slot", "load_episodes"]

log = get_logger(__name__)

MB = 1024 * 1024


@dataclass(frozen=True)
class Episode:
    index: int
    path: Path
    meta: dict[str, Any]
    task_index: int
    start: int  # global index of its first frame

    @property
    def length(self) -> int:
        return int(self.meta["length"])


def file_slot(n: int, chunks_size: int) -> dict[str, int]:
    return {"chunk_index": n // chunks_size, "file_index": n % chunks_size}


def file_groups(
    items: list[Episode],
    size: Callable[[Episode], int],
    limit: float,
    key: Callable[[Episode], object],
) -> Iterator[list[Episode]]:
    """Split consecutive episodes into files: a new one past ``limit`` bytes or on a new key."""
    group: list[Episode] = []
    total = 0
    for ep in items:
        nbytes = size(ep)  # once: a stat each time
        if group and (total + nbytes > limit or key(ep) != key(group[0])):
            yield group
            group, total = [], 0
        group.append(ep)
        total += nbytes
    if group:
        yield group


def load_episodes(
    store: OutputStore, task_ids: list[str], fps: int, drafts: DatasetDrafts | None = None
) -> tuple[list[Episode], list[str], list[str]]:
    episodes: list[Episode] = []
    tasks: dict[str, int] = {}
    skipped: list[str] = []
    start = 0
    for task_id in task_ids:
        path = store.committed_path(task_id)
        if not (path / EPISODE_FILE).is_file():
            skipped.append(task_id)
            log.warning("finalize_skipped_output", task_id=task_id, reason="no episode.json")
            continue
        meta = drafts.take_meta(path) if drafts is not None else None
        if meta is None:
            meta = _read_meta(task_id, path)
        if not isinstance(meta, dict) or meta.get("format") != EPISODE_FORMAT:
            raise InvalidData(
                f"committed output {task_id!r} has format "
                f"{meta.get('format') if isinstance(meta, dict) else None!r}, not "
                f"{EPISODE_FORMAT!r}; rewrite it with this troupe version"
            )
        if meta["fps"] != fps:
            raise InvalidData(
                f"episode {task_id!r} is at {meta['fps']} fps but the dataset is at {fps}; "
                "finalize episodes of one fps per dataset"
            )
        task_index = tasks.setdefault(meta["task"], len(tasks))
        episodes.append(Episode(len(episodes), path, meta, task_index, start))
        start += int(meta["length"])
    return episodes, list(tasks), skipped


def _read_meta(task_id: str, path: Path) -> Any:
    try:
        return json.loads((path / EPISODE_FILE).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        said = f"{path / EPISODE_FILE} is not its JSON ({exc})"
        raise InvalidData(damaged(task_id, path, said)) from None


def damaged(task_id: str, path: Path, what: str) -> str:
    """The error of an episode damaged since its commit in a way its files' sizes do not show
    (those are set aside as a run starts): which, what is wrong, and the way out."""
    return (
        f"committed episode {task_id!r} is damaged: {what}; delete {path} and run the same command "
        "again, which makes that episode again (--fresh would make every episode anew)"
    )


def check_uniform(episodes: list[Episode]) -> dict[str, dict[str, Any]]:
    first = episodes[0].meta
    for ep in episodes[1:]:
        for key in VIDEO_KEYS:
            a, b = first["videos"][key], ep.meta["videos"][key]
            if (a["height"], a["width"]) != (b["height"], b["width"]):
                raise InvalidData(
                    f"episode {ep.meta['task_id']!r} has {key} at {b['width']}x{b['height']} but "
                    f"{first['task_id']!r} at {a['width']}x{a['height']}; one size per dataset"
                )
        if ep.meta["depth_max_m"] != first["depth_max_m"]:
            raise InvalidData(
                f"episode {ep.meta['task_id']!r} quantised depth to {ep.meta['depth_max_m']} m, "
                f"others to {first['depth_max_m']} m; use one EpisodeConfig per dataset"
            )
    return dict(first["videos"])
