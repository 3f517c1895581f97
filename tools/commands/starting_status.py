"""What ``troupe run`` says while its node starts: the seconds its template spends importing.

On a terminal, a spinner that names the class or module the template imports now and the
seconds so far. Piped (or with ``--json``, on stderr), nothing for a start of usual length, then
one line after 30 s and one a minute after that: a slow disk or a module that hangs as it
imports is named while the run waits, not minutes later.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from troupe.cli.literal import literal, markup
from troupe.cli.stream_encoding import spinner_for
from troupe.runtime.node.template_link import READY_S

__all__ = ["StartingStatus"]

_FIRST_S = 30.0
_EVERY_S = 60.0


class StartingStatus:
    """The start of ``troupe run``, shown.

    Args:
        console: where the spinner goes (the command's console).
        cluster: a ``--cluster`` run, which joins a cluster instead of starting a node.
        quiet: no spinner (``--json``); the waiting lines still go to stderr.
        notes: where the waiting lines go (default: stderr).
    """

    def __init__(
        self,
        console: Console,
        cluster: bool,
        quiet: bool,
        notes: Console | None = None,
        first_s: float = _FIRST_S,
        every_s: float = _EVERY_S,
    ) -> None:
        self._spinning = not quiet and console.is_terminal
        self._status = console.status(
            "joining the cluster"
            if cluster
            else "starting the node: its template imports the stages' classes",
            spinner=spinner_for(console),
        )
        self._notes = notes if notes is not None else Console(stderr=True)
        self._next_note_s = first_s
        self._every_s = every_s

    def start(self) -> None:
        if self._spinning:
            self._status.start()

    def stop(self) -> None:
        if self._spinning:
            self._status.stop()
            self._spinning = False

    @property
    def text(self) -> str:
        """What the spinner says now, as shown."""
        said = self._status.status
        return said.plain if isinstance(said, Text) else Text.from_markup(str(said)).plain

    def importing(self, now: str | None, waited_s: float) -> None:
        """``run_pipeline``'s ``on_importing``: the spinner's text, or a line now and then."""
        what = literal(now if now is not None else "the stages' classes")  # the user's class path
        if self._spinning:
            self._status.update(
                markup("starting the node: its template imports ", what, f" ({waited_s:.0f} s)")
            )
            return
        if waited_s < self._next_note_s:
            return
        self._next_note_s = waited_s + self._every_s
        self._notes.print(
            markup(
                f"still starting the node after {waited_s:.0f} s: its template imports ",
                what,
                f" (an import still going after {READY_S:g} s fails the run; Ctrl-C stops it now)",
            ),
            soft_wrap=True,
        )
