"""A finished run's outputs, as its record keeps them (``complete``): the files its stages'
``finalize`` hooks said they wrote, each with its size and modification time as written, so that a
rerun finds the run complete only where they are still there as they were (:func:`still_there`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["finals_outputs", "output_stats", "still_there"]


def still_there(complete: dict[str, Any], out: Path) -> bool:
    """Whether every file the finalize hooks said they wrote (their ``outputs``) still exists as it
    was written (its size and modification time: one damaged or edited since is written
    again), and the run finished in this directory: one copied or moved since names the
    outputs (and says it is complete) where it was, so it is finalised again here."""
    finals = complete.get("finals")
    made_in = complete.get("out", str(out))  # absent: recorded before runs kept it
    if not isinstance(finals, dict) or made_in != str(out):
        return False
    outputs = finals_outputs(finals)
    if outputs is None:  # a damaged record: finalising again is what is safe
        return False
    recorded = complete.get("stats")
    recorded = recorded if isinstance(recorded, dict) else {}  # absent: recorded before stats
    now = output_stats(finals)
    return all(p in now and recorded.get(p, now[p]) == now[p] for p in outputs)


def finals_outputs(finals: dict[str, Any]) -> list[str] | None:
    """The files the finalize hooks said they wrote; None if the record has something else."""
    paths: list[str] = []
    for summary in finals.values():
        outputs = summary.get("outputs", []) if isinstance(summary, dict) else []
        if not isinstance(outputs, list) or not all(isinstance(p, str) for p in outputs):
            return None
        paths.extend(outputs)
    return paths


def output_stats(finals: dict[str, Any]) -> dict[str, list[int]]:
    """Each output that exists, by path: [size, modification time in ns]."""
    stats: dict[str, list[int]] = {}
    for path in finals_outputs(finals) or []:
        try:
            st = os.stat(path)
        except (OSError, ValueError):  # gone, or a path no file can have
            continue
        stats[path] = [st.st_size, st.st_mtime_ns]
    return stats
