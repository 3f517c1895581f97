"""Every help text of the command line shows its bracketed words: typer renders help as rich
markup, in which ``[node]`` is a style and vanished from ``node start --tag``'s help ("replaces
 tags"). Each command's ``--help`` is rendered here and searched for them."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from troupe.cli.main import app

_BRACKETED = re.compile(r"(?<!\\)\[([a-z_.]+)\]")  # what rich would take for a style


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command under ``group`` by its words (typer's own click: duck-typed)."""
    found = [(path, group)]
    for name, command in sorted(getattr(group, "commands", {}).items()):
        found += _commands(command, (*path, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))


def _help_texts(command: Any) -> list[str]:
    texts = [command.help or ""]
    texts += [getattr(p, "help", None) or "" for p in command.params]
    return [t for t in texts if "[" in t]


@pytest.mark.parametrize("path", [p for p, c in COMMANDS if _help_texts(c)], ids=" ".join)
def test_bracketed_words_in_help_are_shown(path: tuple[str, ...]) -> None:
    command = dict(COMMANDS)[path]
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.replace("│", " ").split())
    for text in _help_texts(command):
        plain = text.replace("\\[", "[")
        for word in re.findall(r"\[([a-z_.]+)\]", plain):
            assert f"[{word}]" in shown, f"{' '.join(path)}: [{word}] of {text!r} is not shown"


def test_no_help_text_has_an_unescaped_style_like_word() -> None:
    """The source itself: a bracketed word in a help text is escaped (``\\[node]``)."""
    bare = [
        (" ".join(path), text)
        for path, command in COMMANDS
        for text in _help_texts(command)
        if _BRACKETED.search(text)
    ]
    assert bare == []
