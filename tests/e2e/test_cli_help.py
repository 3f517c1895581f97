"""The troupe command's own surface: ``--version``, and help pages that show what a user types."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from troupe.cli.main import app
from troupe.runtime.code_identity import code_digest


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The argv of every command and group under ``group``, itself included."""
    yield path
    for name, sub in getattr(group, "commands", {}).items():  # typer vendors its own click
        yield from _commands(sub, (*path, name))


ALL = sorted(_commands(typer.main.get_command(app)))


def test_version_prints_the_installed_version_and_its_code() -> None:
    """`troupe --version` prints the package metadata's version and the digest of the code it
    runs (the version alone is the same for every checkout), and exits 0."""
    done = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"troupe {metadata.version('troupe')} (code {code_digest()})"


def test_node_start_help_shows_no_type_after_a_flag() -> None:
    """The flags of `troupe node start --help` (--with-master, --new, --help) take no value and
    show no `<bool>`; options that take one still show its type."""
    done = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "node", "start", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--with-master" in done.stdout and "--help" in done.stdout
    assert "<bool>" not in done.stdout
    assert "<path>" in done.stdout  # --config, --logs, --journal


@pytest.mark.parametrize("argv", ALL, ids=lambda argv: " ".join(argv) or "troupe")
def test_no_help_page_shows_a_bool_type(argv: tuple[str, ...]) -> None:
    """Every command's and group's help page renders, with no `<bool>` anywhere."""
    result = CliRunner().invoke(app, [*argv, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "--help" in result.output
    assert "<bool>" not in result.output


def test_ctl_lists_undrain_beside_drain() -> None:
    """`troupe ctl undrain NODE` exists and says what it does."""
    result = CliRunner().invoke(app, ["ctl", "undrain", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "NODE" in result.output and "Resume a drained node" in result.output


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (("run",), "troupe run [OPTIONS] [PIPELINE.toml]"),
        (("ctl", "submit"), "troupe ctl submit [OPTIONS] {JOB.toml}"),
        (("ctl", "cancel"), "troupe ctl cancel [OPTIONS] {JOB}"),
        (("ctl", "dead"), "troupe ctl dead [OPTIONS] {JOB}"),
        (("ctl", "retry"), "troupe ctl retry [OPTIONS] {JOB}"),
        (("ctl", "drain"), "troupe ctl drain [OPTIONS] {NODE}"),
        (("ctl", "undrain"), "troupe ctl undrain [OPTIONS] {NODE}"),
        (("ctl", "chaos"), "troupe ctl chaos [OPTIONS] {KIND}"),
    ],
)
def test_usage_names_arguments_as_the_readme_does(argv: tuple[str, ...], usage: str) -> None:
    """Arguments are named in capitals, as the README's command table writes them."""
    result = CliRunner().invoke(app, [*argv, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert usage in result.output
