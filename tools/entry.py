"""The ``troupe`` console script: a Ctrl-C before the command handles stop signals itself ends
it quietly.

The command's modules take most of a second to import on a small machine, and typer builds the
command line from every command's signature after that (another fraction of a second); the
command's own handling of stop signals (``stop_signals``) begins only then. An interrupt before
it printed Python's traceback of whichever module was loading, or of typer's signature parsing.
Nothing has started by then, so the command exits 130, as it does for a Ctrl-C anywhere else.
A command whose output's reader went away ends quietly with 141 (``closed_output``).

``troupe run`` starts its node's template here, before those imports (``template_prestart``):
the template imports the stage classes (torch among them) on the core the command's own
imports leave idle, and the run's node takes it over (``troupe run --cluster``: a template that
imports the classes' modules only, to check them before the run submits its job). The classes
are read from the pipeline
file with the standard library (or the embedded default's data); a file that does not parse
starts nothing here, and the command says what is wrong with it as before.

A command started in a folder that no longer exists (deleted under the shell) is refused here, in
one line, exit 2: the processes it starts inherit that folder, and torch, the stage loader and
the node's template each failed in it with a traceback of their own (torch's as a "oneMKL FATAL
ERROR" that named a library, not the folder). ``ctl`` and ``logs`` only talk to what runs and
read the paths given, and go on.

The open-files limit is raised here, before anything starts, and a command that starts
processes with too low a hard limit is refused in one line, exit 2 (``file_limit``).

A closed stdin, stdout or stderr is opened on ``/dev/null`` first of all (``closed_std_fds``).
"""

from __future__ import annotations

import os
import sys

from troupe.cli.closed_std_fds import open_closed_std_fds

__all__ = ["main"]

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C stopped
REFUSED = 2  # bad input, as the commands' own refusals
FOLDER_GONE = "the current folder no longer exists (deleted under this shell): cd to an existing folder"
_FOLDER_FREE = ("ctl", "logs")  # commands that work without one
_STARTS_PROCESSES = ("run", "demo", "node", "master", "bench")  # need FILES_NEEDED descriptors


def main() -> None:
    """Import the command, then run it."""
    open_closed_std_fds()
    try:
        if _folder_gone() and not _folder_free(sys.argv[1:]):
            _refuse(FOLDER_GONE)
        _check_file_limit(sys.argv[1:])
        _start_template_ahead(sys.argv[1:])
        from troupe.cli.closed_output import run_app
        from troupe.cli.main import app
        from troupe.cli.stop_signals import keep_ignored_signals

        keep_ignored_signals()  # nohup's SIGHUP stays ignored (nothing handled one yet)
        run_app(app)
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)


def _folder_gone() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def _folder_free(args: list[str]) -> bool:
    """``troupe ARGS`` needs no current folder (or only prints its help or version)."""
    return not args or args[0] in _FOLDER_FREE or any(_elsewhere(a) or a == "--version" for a in args)


def _check_file_limit(args: list[str]) -> None:
    """Raise the open-files limit; refuse a command that starts processes if it stays too low."""
    from troupe.cli.file_limit import raise_file_limit, too_few_files

    limit = raise_file_limit()
    if not args or args[0] not in _STARTS_PROCESSES or any(_elsewhere(a) for a in args):
        return
    refused = too_few_files(limit, args[0])
    if refused is not None:
        _refuse(refused)


def _refuse(message: str) -> None:
    """One error line, as the commands' own, and exit ``REFUSED``."""
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True).print(Text("error: ", "bold red") + Text(message), highlight=False, soft_wrap=True)
    sys.exit(REFUSED)


def _start_template_ahead(args: list[str]) -> None:
    """For ``troupe run`` on this host, start the node's template now (see the module's doc)."""
    if not args or args[0] != "run" or any(_elsewhere(a) for a in args[1:]):
        return
    classes = stage_classes(args[1:])
    if classes:
        from troupe.template_prestart import prestart

        # On a cluster's nodes, the template only checks the classes (they fork nothing here).
        prestart(classes, check_only=any(a == "--cluster" or a.startswith("--cluster=") for a in args))


def _elsewhere(arg: str) -> bool:
    """An option after which this command runs nothing."""
    return arg in ("--help", "-h")


def stage_classes(args: list[str]) -> list[str]:
    """The stage classes of the pipeline that ``troupe run ARGS`` runs: the ``.toml`` file among
    ``args``, or the embedded default; empty where that cannot be told (no such file, not a
    pipeline, a training config, a file that does not parse)."""
    files = [a for a in args if a.endswith(".toml") and not a.startswith("-")]
    if len(files) > 1:
        return []
    if not files:
        from troupe.actors.datagen.embedded_pipeline import DEFAULT_PIPELINE

        return [str(s["actor"]) for s in DEFAULT_PIPELINE["stages"]]
    import tomllib

    try:
        with open(files[0], "rb") as f:
            data = tomllib.load(f)
    except (OSError, ValueError):
        return []
    stages = data.get("stages")
    if "train" in data or not isinstance(stages, list):
        return []
    return [s["actor"] for s in stages if isinstance(s, dict) and isinstance(s.get("actor"), str)]
