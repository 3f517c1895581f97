"""Text a command prints that its output's encoding cannot carry is escaped, not fatal.

Under ``PYTHONIOENCODING=ascii`` or ``LANG=C`` on an older Python, an ``--out`` with an umlaut
made ``troupe run`` end in a UnicodeEncodeError traceback as it printed its summary, after the
run itself had finished. On a terminal whose locale is not UTF-8 (``LC_ALL=C`` with Python's
UTF-8 coercion off), stdout's handler is ``surrogateescape``, which passes a file name's raw bytes
but is as strict as ``strict`` for anything else: rich's spinner (Braille dots) and the "…" it
cuts a narrow cell with ended ``troupe run`` and ``troupe ctl top`` as they started, with the
terminal's cursor left hidden. Such a stream's errors handler is made :data:`ESCAPE`: a
character the encoding cannot carry prints as ``\\xfc`` or ``\\u2026``, a file name's raw byte
(a surrogate escape) as that byte, and the line, and the command, go on (stderr's own handler,
``backslashreplace``, is already safe). A spinner on such a console is drawn in ASCII
(:func:`spinner_for`): escaped, each frame of it would be six characters of noise.
"""

from __future__ import annotations

import codecs
import sys

from rich.console import Console

__all__ = ["ESCAPE", "escape_unencodable", "spinner_for"]

ESCAPE = "troupe.escape"
_SURROGATE_ESCAPES = range(0xDC80, 0xDD00)  # how surrogateescape decoded a raw byte of 128..255
_UNSAFE = ("strict", "surrogateescape")


def _escape(error: UnicodeError) -> tuple[str | bytes, int]:
    """``backslashreplace``, but a surrogate escape goes out as the byte it was read from."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start : error.end]
    if all(ord(c) in _SURROGATE_ESCAPES for c in text):
        return bytes(ord(c) - 0xDC00 for c in text), error.end
    return codecs.backslashreplace_errors(error)


codecs.register_error(ESCAPE, _escape)


def escape_unencodable() -> None:
    """Make stdout and stderr escape what their encoding cannot carry, where they would raise."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None or getattr(stream, "errors", None) not in _UNSAFE:
            continue
        try:
            reconfigure(errors=ESCAPE)
        except (ValueError, OSError):  # closed, or a stream that cannot change now
            pass


def spinner_for(console: Console) -> str:
    """The name of the rich spinner ``console``'s encoding can draw: its Braille dots only where
    it is a UTF encoding (rich's bars and tables make the same choice themselves, its spinners
    do not)."""
    return "line" if console.options.ascii_only else "dots"
