"""The ``troupe`` console script: a Ctrl-C before the command handles stop signals itself ends
it quietly.

The command's modules take most of a second to import on a small machine, and typer builds the
command line from every command's signature after that (another fraction of a second); the
command's own handling of stop signals (``stop_signals``) begins only then. An interrupt before
it printed Python's traceback of whichever module was loading, or of typer's signature parsing.
Nothing has started by then, so the command exits 130, as it does for a Ctrl-C anywhere else.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C stopped


def main() -> None:
    """Import the command, then run it."""
    try:
        from troupe.cli.main import app

        app()
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)
