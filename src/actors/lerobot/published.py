"""The episodes a finalized dataset published, and which of them a finalize again renumbers.

Finalize numbers episodes in task id order, so one made after the dataset was published (an
item ``--retry-dead`` made) takes its place among them and every later episode's
``episode_index`` shifts: a split or an ``episodes=[...]`` by index then names other episodes.
The run says so (README, Decisions); this is how it knows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["published_task_ids", "renumbered"]


def published_task_ids(root: Path) -> tuple[str, ...]:
    """The task id of each episode of the dataset at ``root``, by episode index, as its
    ``meta/episodes`` says; empty where no dataset was published there (no ``meta/info.json``:
    none yet, or a finalize was interrupted) or it cannot be read (its finalize rewrites it)."""
    if not (root / "meta" / "info.json").is_file():
        return ()
    import pyarrow as pa  # here, not as the module loads: see troupe.actors.lerobot's docstring
    import pyarrow.parquet as pq

    by_index: dict[int, str] = {}
    try:
        for path in sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet")):
            table = pq.read_table(path, columns=["episode_index", "troupe/task_id"])
            by_index.update(
                zip(table["episode_index"].to_pylist(), table["troupe/task_id"].to_pylist(), strict=True)
            )
    except (OSError, pa.ArrowException, KeyError):
        return ()
    return tuple(by_index[i] for i in sorted(by_index))


def renumbered(before: Sequence[str], after: Sequence[str]) -> int:
    """How many episodes published as ``before`` (task ids by index) have another index in
    ``after``, or none."""
    index = {task_id: i for i, task_id in enumerate(after)}
    return sum(index.get(task_id) != i for i, task_id in enumerate(before))
