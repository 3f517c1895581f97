"""What a stage's run-wide hooks must return, checked as they return it.

``start(run)`` (and ``committed_among(task_ids)``) returns the ids of the items whose output is
committed already (an iterable of str), or None; ``finalize(run)`` returns a dict (its
``"summary"`` and outputs), or None. A wrong type failed far from the hook (``'int' object is not
iterable``, ``dictionary update sequence element #0 has length 1``), and a ``start`` that
returned one id as a bare ``str`` had each of its characters taken for an item id, without a
word. Now each says which hook, what it must return and what it returned.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["committed_ids", "final_summary"]

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60


def committed_ids(stage: str, value: Any, hook: str = "start") -> list[str]:
    """``start()``'s (or ``committed_among()``'s, ``hook``) return as the sorted ids of the
    committed items (``stage``: its class's name, for the error).

    Raises:
        TypeError: it is neither None nor an iterable of ids (a single ``str`` or ``bytes`` is
            not: its characters are no ids).
    """
    if value is None:
        return []
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Iterable):
        raise TypeError(
            f"{stage}.{hook}() must return the ids of the items committed already (an iterable of "
            f"str, such as a list or set) or None, got {_got(value)}"
        )
    return sorted(str(task_id) for task_id in value)


def final_summary(stage: str, value: Any) -> dict[str, Any]:
    """``finalize()``'s return as the run's ``finals[stage]`` (``stage``: its class's name).

    Raises:
        TypeError: it is neither None nor a dict.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{stage}.finalize() must return a dict (its 'summary' string and outputs) or None, "
            f"got {_got(value)}"
        )
    return dict(value)


def _got(value: Any) -> str:
    return f"{type(value).__name__} {_SHORT.repr(value)}"
