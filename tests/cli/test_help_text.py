"""Every help text of the command line shows its bracketed words: typer renders help as rich
markup, in which ``[node]`` is a style and vanished from ``node start --tag``'s help ("replaces
 tags"). Each command's ``--help`` is rendered here and searched for them; and every paragraph of
its help is shown whole, as written, on one line of a wide terminal."""

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


def _shown_texts(command: Any) -> list[str]:
    """What ``command``'s ``--help`` shows as prose: its help's paragraphs, its options' help,
    and, for a group, each subcommand's first paragraph (the command list)."""
    texts = [p for p in (command.help or "").split("\n\n") if p.strip()]
    texts += [p.help for p in command.params if getattr(p, "help", None) and not getattr(p, "hidden", False)]
    for sub in getattr(command, "commands", {}).values():
        if not sub.hidden:
            texts.append((sub.short_help or sub.help or "").split("\n\n")[0])
    return [" ".join(t.replace("\\[", "[").split()) for t in texts if t.strip()]


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "troupe")
def test_every_paragraph_of_help_flows_on_a_wide_terminal(path: tuple[str, ...]) -> None:
    """At 1,000 columns each paragraph of help is one line: typer keeps a docstring's single line
    breaks, and ``troupe run --help`` (and the command list of ``troupe --help``) broke
    mid-sentence ("(default: the data generation" / "pipeline, ...") at any width."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "1000", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.replace("│", " ").split()) for line in result.output.splitlines()]
    for text in _shown_texts(dict(COMMANDS)[path]):
        assert any(text in line for line in lines), f"{' '.join(path)}: {text!r} is not on one line"
