"""The command's stdout for its own output only: what the processes it starts print goes to stderr.

``troupe run --json | jq`` needs stdout to hold one JSON object, and ``troupe run > report.txt``
the report; but the node's template, its workers and its supervisor inherit the command's
descriptors, and a stage module that prints as it imports (or a ``process`` that prints) wrote
into the middle of them. Within :func:`own_stdout`, file descriptor 1, which children inherit, is
the command's stderr; the command's own ``sys.stdout`` (and the rich console, which writes to
it) is a copy of the original stdout. The template the console script's entry starts ahead is
given the same arrangement at its spawn (``template_prestart``). The copy is guarded as
``sys.stdout`` was (``unwritable_output``).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator

from troupe.cli.unwritable_output import guarded

__all__ = ["own_stdout"]


@contextlib.contextmanager
def own_stdout() -> Iterator[None]:
    """Within it, processes started inherit stderr as their stdout; ``sys.stdout`` stays ours."""
    original = sys.stdout
    try:
        original.flush()
        if original.fileno() != 1:  # the caller took stdout over (a test's runner): leave it be
            raise ValueError
        kept = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no stdout of fd 1 to keep apart
        yield
        return
    try:
        os.dup2(2, 1)
    except OSError:  # no stderr to point it at: children keep the stdout they had
        os.close(kept)
        yield
        return
    ours = io.TextIOWrapper(
        io.FileIO(kept, "w", closefd=True),
        encoding=getattr(original, "encoding", None) or "utf-8",
        errors=getattr(original, "errors", None) or "strict",
        line_buffering=True,
    )
    sys.stdout = guarded(ours)
    try:
        yield
    finally:
        sys.stdout = original
        try:
            guarded(ours).flush()  # a reader gone (``| head``) raises here, as it would have on fd 1
        finally:
            os.dup2(ours.fileno(), 1)
            with contextlib.suppress(OSError):
                ours.close()
