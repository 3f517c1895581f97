"""What ``troupe logs tail`` shows of a log line: its filters and its readable form.

Filters (all given must match; within one, any value matches):

- ``--node``: the line's ``node`` field, exactly (for a line that is not JSON: the node whose
  file or stream it came from);
- ``--actor``: the ``actor`` field, exactly, or by prefix with a trailing ``*`` (``enc*``);
- ``--task``: the ``task_id`` field, exactly;
- ``--level``: the ``level`` field at least this severe: debug < info < warning < error <
  critical (an unknown level counts as info).

A line that is not a JSON object has none of those fields: ``--actor``, ``--task`` and
``--level`` leave it out; without them it is shown as it is. Log text is hostile (it may hold
``[bold]`` or escape codes meant for a terminal), so the readable form is printed as plain rich
:class:`~rich.text.Text`, never parsed as markup, with control characters shown as ``\\x1b``.
A record is one line: a newline in a value is written ``\\n`` (an error text holding a newline
and a made-up record printed as a record of its own); only a ``traceback`` or ``exception``
field is printed on the lines below it, each indented, an ``exception`` (structlog's list of
frames) as a Python traceback.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

__all__ = ["LEVELS", "LogFilter", "format_line", "parse_record", "readable", "visible"]

LEVELS = ("debug", "info", "warning", "error", "critical")
_RANK = {name: rank for rank, name in enumerate(LEVELS)} | {
    "warn": 2,
    "exception": 3,
    "fatal": 4,
}
_KEYS_FIRST = ("timestamp", "level", "node", "process", "actor", "event")
_BLOCKS = ("traceback", "exception")  # printed below the record, indented
_INDENT = "    "
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_STYLES = {"debug": "dim", "warning": "yellow", "error": "red", "critical": "bold red"}


def parse_record(line: str) -> dict[str, Any] | None:
    """The JSON object on ``line``, or None when it is not one."""
    if not line.startswith("{"):
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def _values(given: Iterable[str]) -> list[str]:
    """Values of a repeatable option, each of which may also be comma-separated."""
    return [v.strip() for g in given for v in g.split(",") if v.strip()]


@dataclass(frozen=True)
class LogFilter:
    """Which lines to show (see the module); an empty filter shows every line."""

    nodes: frozenset[str] = frozenset()
    actors: tuple[str, ...] = ()
    tasks: frozenset[str] = frozenset()
    min_level: int = 0
    _prefixes: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_options(
        cls, nodes: Iterable[str] = (), actors: Iterable[str] = (), tasks: Iterable[str] = (), level: str = ""
    ) -> LogFilter:
        """The filter of the command's options.

        Raises:
            ValueError: ``level`` is not one of :data:`LEVELS` (the message names it), or an
                actor is a pattern other than a prefix ending in ``*`` (``*2``, ``t*k`` and
                ``task?`` matched nothing, silently).
        """
        rank = 0
        if level:
            if level.lower() not in LEVELS:
                raise ValueError(f"--level: unknown level {level!r}; use one of {', '.join(LEVELS)}")
            rank = _RANK[level.lower()]
        actor_list = tuple(_values(actors))
        for actor in actor_list:
            if "*" in actor[:-1] or "?" in actor:
                raise ValueError(
                    f"--actor {actor!r}: give an actor's name, or the start of names ending in * "
                    "(e.g. enc*); other patterns are not supported"
                )
        return cls(
            nodes=frozenset(_values(nodes)),
            actors=actor_list,
            tasks=frozenset(_values(tasks)),
            min_level=rank,
            _prefixes=tuple(a[:-1] for a in actor_list if a.endswith("*")),
        )

    @property
    def reads_fields(self) -> bool:
        """Whether a line must be a JSON object to be shown (actor, task or level asked)."""
        return bool(self.actors or self.tasks or self.min_level)

    def accepts(self, line: str, source_node: str | None = None) -> bool:
        """Whether ``line`` (from the file or stream of ``source_node``) is shown."""
        if not (self.nodes or self.reads_fields):
            return True
        rec = parse_record(line)
        if rec is None:
            return not self.reads_fields and (not self.nodes or source_node in self.nodes)
        if self.nodes and str(rec.get("node", source_node)) not in self.nodes:
            return False
        if self.tasks and str(rec.get("task_id")) not in self.tasks:
            return False
        if self.actors:
            actor = rec.get("actor")
            if not isinstance(actor, str):
                return False
            if actor not in self.actors and not any(actor.startswith(p) for p in self._prefixes):
                return False
        if self.min_level:
            level = rec.get("level")
            rank = _RANK.get(level.lower(), 1) if isinstance(level, str) else 1
            if rank < self.min_level:
                return False
        return True


def format_line(line: str) -> str:
    """Render one JSON log line compactly; a line that is not JSON is shown as it is.

    The record's own line holds no newline (see the module); its ``traceback`` or ``exception``
    follows on lines of its own, indented.
    """
    rec = parse_record(line)
    if rec is None:
        return line.rstrip("\n")
    blocks = [_block(rec.pop(k)) for k in _BLOCKS if k in rec]
    head = " ".join(_inline(rec.pop(k)) for k in _KEYS_FIRST if k in rec)
    rest = " ".join(f"{_inline(k)}={_inline(v)}" for k, v in rec.items())
    text = f"{head} {rest}".rstrip()
    return "".join([text, *("\n" + textwrap.indent(b, _INDENT, lambda _: True) for b in blocks if b)])


def _inline(value: Any) -> str:
    """``value`` as text on one line."""
    return str(value).replace("\r", "\\r").replace("\n", "\\n")


def _block(value: Any) -> str:
    """A ``traceback`` or ``exception`` field as the lines of a traceback."""
    if isinstance(value, list) and all(isinstance(stack, dict) for stack in value):
        return _traceback(value)
    return str(value).rstrip("\n")


def _traceback(stacks: list[dict[str, Any]]) -> str:
    """structlog's exception dicts (the raised exception first, then its causes) as Python
    prints them: the first cause first."""
    parts: list[str] = []
    previous: dict[str, Any] | None = None  # the exception printed last: a cause of this one
    for stack in reversed(stacks):
        if previous is not None:
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n"
                if previous.get("is_cause")
                else "\nDuring handling of the above exception, another exception occurred:\n"
            )
        parts.append("Traceback (most recent call last):")
        for frame in stack.get("frames") or ():
            if isinstance(frame, dict):
                where = (
                    f'  File "{frame.get("filename")}", line {frame.get("lineno")}, in {frame.get("name")}'
                )
                parts.append(_inline(where))
        value = stack.get("exc_value")
        parts.append(_inline(f"{stack.get('exc_type')}: {value}" if value else stack.get("exc_type")))
        parts.extend(_inline(note) for note in stack.get("exc_notes") or ())
        previous = stack
    return "\n".join(parts)


def visible(text: str) -> str:
    """``text`` with control characters (a terminal's escape codes) written out: ``\\x1b``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def readable(line: str) -> Text:
    """The readable form of ``line`` as rich text, coloured by level, never read as markup."""
    rec = parse_record(line)
    level = rec.get("level") if rec is not None else None
    style = _STYLES.get(level.lower(), "") if isinstance(level, str) else ""
    return Text(visible(format_line(line)), style=style)
