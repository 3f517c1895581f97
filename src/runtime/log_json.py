"""Log lines as strict JSON: a float that is not finite is written as a string.

Python's ``json`` writes a NaN (a loss gone bad, a ratio of zeros) and an infinity as the bare
``NaN`` / ``Infinity`` / ``-Infinity``, which are not JSON: JavaScript, Go's encoding/json (and
so Loki, Vector, Fluent Bit) and Elasticsearch refuse the line. They are written as the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` instead, which keep what the value was (null would
not), in maps and lists at any depth.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["strict_json"]


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite, in maps and lists too, as its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def strict_json(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of a log line (structlog's ``JSONRenderer`` serializer), non-finite floats
    written as strings."""
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:  # a NaN or an infinity somewhere: only such a line pays for the walk
        return json.dumps(_finite(obj), allow_nan=False, **kwargs)
