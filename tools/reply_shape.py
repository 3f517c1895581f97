"""A reply whose shape the CLI does not know, said in one line: what answered, and which field.

A master (or node) of another troupe version, or a damaged one, may answer ``status``,
``jobs`` or ``dead`` with a field null, a string where a number goes, or a node entry that is
a string. Turned into tables, such a reply raised a Python traceback (``'NoneType' object has
no attribute 'items'``). The views build their tables inside :func:`shaped_as`, which says it
the way a reply that is not a dict at all is said (``answered, but not as a master``), exit 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from troupe.runtime.errors import TroupeError

from .client import fail
from .master_client import answered_not_as

__all__ = ["SHAPE_ERRORS", "not_as_expected", "shaped_as"]

# What reading a reply of another shape raises: a field missing (KeyError), of another type
# (TypeError, AttributeError: a str or None where a dict goes), a value a format refuses.
SHAPE_ERRORS = (KeyError, IndexError, TypeError, AttributeError, ValueError)


def not_as_expected(endpoint: str, role: str, why: str) -> TroupeError:
    """``ENDPOINT answered, but not as a ROLE of this troupe version expects (WHY)``."""
    return answered_not_as(
        endpoint,
        f"a {role} of this troupe version expects ({why}): another troupe version, or a damaged "
        f"{role}? see its log",
    )


@contextlib.contextmanager
def shaped_as(endpoint: str, role: str) -> Iterator[None]:
    """Build views of ``role``'s reply from ``endpoint`` in this block: a reply of another shape
    ends the command with one line, exit 1 (``fail``), naming the field where it can."""
    try:
        yield
    except SHAPE_ERRORS as exc:
        if isinstance(exc, KeyError):
            why = f"no field {exc.args[0]!r}" if exc.args else "a field missing"
        else:
            why = f"a field of another type: {exc}"
        raise fail(str(not_as_expected(endpoint, role, why))) from None
