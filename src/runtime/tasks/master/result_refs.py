"""A ``complete``'s result reference, checked as the master receives it.

A worker checks what its ``run_task`` returns (``task_runner.py``): at most
``RESULT_REF_MOST_BYTES`` of valid UTF-8, a reference to the task's committed output. A foreign
or older worker may still send the output itself as the reference (megabytes), or no str at
all, and the master would keep it in its journal and in memory for every done task, and send
many at once (``done_tasks``). :func:`result_ref_refused` says why such a reference is not taken;
the master then fails the attempt with it, as the worker's own check would have
(``WorkerControls._complete``).
"""

from __future__ import annotations

from typing import Any

from troupe.runtime.core.config_messages import short_repr
from troupe.runtime.tasks.task_actor import RESULT_REF_MOST_BYTES

__all__ = ["result_ref_refused"]


def result_ref_refused(ref: Any) -> str | None:
    """Why ``ref`` is not taken as a task's result reference, in words; None where it is (a str
    of at most ``RESULT_REF_MOST_BYTES`` bytes of UTF-8, or nil: no reference)."""
    if ref is None:
        return None
    if not isinstance(ref, str):
        return f"its result_ref is {short_repr(ref, 60)} ({type(ref).__name__}), not a str"
    try:
        # a str longer in characters is longer in bytes: it is not encoded to be refused
        size = len(ref.encode("utf-8")) if len(ref) <= RESULT_REF_MOST_BYTES else None
    except UnicodeEncodeError as exc:
        return f"its result_ref is not valid UTF-8 ({exc.reason} at index {exc.start})"
    if size is not None and size <= RESULT_REF_MOST_BYTES:
        return None
    length = f"{len(ref):,} characters" if size is None else f"{size:,} bytes"
    return (
        f"its result_ref is a str of {length}: a task's result is a short reference to its "
        f"committed output, at most {RESULT_REF_MOST_BYTES} bytes of UTF-8; commit the data and "
        "return where it is"
    )
