"""What decides a run's episodes: the pipeline a run folder was made with, and how two differ.

A run folder's record (``run_record.py``) keeps the pipeline it was made with in the terms that
decide what its episodes hold: the pipeline's name, items and seed_start, and each stage's actor
class and constructor kwargs (with ``{out}`` unresolved, so a moved directory still matches):
:func:`fingerprint`. Replicas, batches, queues, slots and retries only change how fast the same
episodes come, so they may differ between runs. A rerun is compared with it field by field
(:func:`first_difference`, the first field that differs named in the refusal); kwargs a stage's
finalize hook named as its alone (``StageActor.finalize_kwargs``, kept in the record's
``finalize_only``: :func:`finalize_only`) decide no output and are left out of the comparison
(:func:`without_finalize_only`).
"""

from __future__ import annotations

import json
from typing import Any

from troupe.runtime.pipeline.config import PipelineConfig

__all__ = ["finalize_only", "fingerprint", "first_difference", "well_formed", "without_finalize_only"]


def fingerprint(cfg: PipelineConfig) -> dict[str, Any]:
    """What decides a run's episodes, from the pipeline before ``{out}`` is resolved."""
    stages: dict[str, Any] = {}
    for stage in cfg.stages:
        entry: dict[str, Any] = {"actor": stage.actor, "kwargs": dict(stage.kwargs)}
        if stage.after is not None:
            entry["after"] = stage.after
        stages[stage.name] = entry
    data = {
        "name": cfg.name,
        "items": cfg.items,
        "seed_start": cfg.seed_start,
        "stages": ",".join(s.name for s in cfg.stages),
        "stage": stages,
    }
    made: dict[str, Any] = json.loads(json.dumps(data))  # tuples and lists alike, as read back
    return made


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def _shown(key: str, flat: dict[str, Any], typed: bool = False) -> str:
    if key not in flat:
        return f"no {key}"
    value = flat[key]
    if typed:
        return f"{key}={json.dumps(value)} ({_JSON_TYPES.get(type(value), type(value).__name__)})"
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


_JSON_TYPES = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "a list",
    dict: "a table",
    type(None): "null",
}


def first_difference(made: dict[str, Any], asked: dict[str, Any]) -> tuple[str, str] | None:
    """The first field that differs, as (``key=made``, ``key=asked``); None when none does. The
    pipeline's name comes first: another pipeline's folder is said to be one, whatever else
    differs (its item count, say, which comes before the name in the record)."""
    a, b = _flat(made), _flat(asked)
    keys = [*a, *(k for k in b if k not in a)]
    for key in sorted(keys, key=lambda k: k != "name"):  # stable: the record's order otherwise
        if a.get(key, _MISSING) != b.get(key, _MISSING):
            shown = _shown(key, a), _shown(key, b)
            if shown[0] == shown[1]:  # the same text, of other types ("6" and 6): said with them
                shown = _shown(key, a, typed=True), _shown(key, b, typed=True)
            return shown
    return None


_MISSING = object()


def well_formed(pipeline: Any) -> bool:
    """Whether a recorded pipeline (:func:`fingerprint`) has its fields, of their types: one edited
    by hand (``"items": "6"``) or cut (no ``name``) is damaged, not another pipeline (it read
    "made with items=6, this run asks items=6", or "made with no name")."""
    if not isinstance(pipeline, dict):
        return False
    kinds = {"name": str, "items": int, "seed_start": int, "stages": str, "stage": dict}
    if not all(type(pipeline.get(k)) is t for k, t in kinds.items()):
        return False
    return all(
        isinstance(entry, dict)
        and isinstance(entry.get("actor"), str)
        and isinstance(entry.get("kwargs"), dict)
        for entry in pipeline["stage"].values()
    )


def finalize_only(finals: dict[str, Any]) -> dict[str, list[str]]:
    """The kwargs only each stage's ``finalize`` reads, by stage, as its hook's answer named them."""
    only = {}
    for stage, summary in finals.items():
        names = summary.get("finalize_kwargs") if isinstance(summary, dict) else None
        if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
            only[stage] = names
    return only


def without_finalize_only(pipeline: Any, only: Any) -> Any:
    """``pipeline`` (:func:`fingerprint`) without the kwargs ``only`` names by stage (the
    record's ``finalize_only``): they decide no output, so they are not compared."""
    if (
        not isinstance(only, dict)
        or not isinstance(pipeline, dict)
        or not isinstance(pipeline.get("stage"), dict)
    ):
        return pipeline
    stages = dict(pipeline["stage"])
    for stage, names in only.items():
        entry = stages.get(stage)
        if isinstance(entry, dict) and isinstance(entry.get("kwargs"), dict) and isinstance(names, list):
            stages[stage] = {**entry, "kwargs": {k: v for k, v in entry["kwargs"].items() if k not in names}}
    return {**pipeline, "stage": stages}
