"""The ``troupe`` console script: a Ctrl-C while the command still imports ends it quietly.

The command's modules take most of a second to import on a small machine, and its own handling
of stop signals (``stop_signals``) begins only after that; an interrupt before then printed
Python's traceback of whichever module was loading. Nothing has started by then, so the command
exits 130, as it does for a Ctrl-C anywhere else.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C stopped


def main() -> None:
    """Import the command, then run it."""
    try:
        from troupe.cli.main import app
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)
    app()
