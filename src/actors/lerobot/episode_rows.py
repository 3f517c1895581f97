"""One committed episode's rows as the dataset's data files hold them: its frames with the
columns that place it in the dataset (``episode_index``, the global frame ``index``,
``task_index``), cast to the data schema. Finalize writes these, and so does a draft of the data
files written while the run goes on (``dataset_drafts``): the same rows, so the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .format import FRAMES_FILE

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["episode_rows"]


def episode_rows(episode: Path, index: int, start: int, task_index: int, schema: pa.Schema) -> pa.Table:
    """The episode at ``episode`` (its folder) as rows of the dataset's data files.

    Raises:
        pa.ArrowException, OSError: its frames file cannot be read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    # ParquetFile.read, not read_table: a third of the CPU for one small file (no dataset
    # discovery, no thread pool).
    frames = pq.ParquetFile(episode / FRAMES_FILE).read(use_threads=False)
    n_rows = frames.num_rows
    extra = {
        "episode_index": np.full(n_rows, index, dtype=np.int64),
        "index": np.arange(start, start + n_rows, dtype=np.int64),
        "task_index": np.full(n_rows, task_index, dtype=np.int64),
    }
    for name, values in extra.items():
        frames = frames.append_column(name, pa.array(values))
    return frames.select(schema.names).cast(schema)
