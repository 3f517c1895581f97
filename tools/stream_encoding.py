"""Text a command prints that its output's encoding cannot carry is escaped, not fatal.

Under ``PYTHONIOENCODING=ascii`` or ``LANG=C`` on an older Python, an ``--out`` with an umlaut
made ``troupe run`` end in a UnicodeEncodeError traceback as it printed its summary, after the
run itself had finished. stdout's errors handler is made ``backslashreplace`` (stderr's is
already): such a character prints as ``\\xfc``, and the line, and the command, go on.
"""

from __future__ import annotations

import sys

__all__ = ["escape_unencodable"]


def escape_unencodable() -> None:
    """Make stdout and stderr escape what their encoding cannot carry, where they are strict."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None or getattr(stream, "errors", None) != "strict":
            continue
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):  # closed, or a stream that cannot change now
            pass
