"""``troupe configs``: the configs the README and the --help texts name, from the install.

The repository's ``configs/`` folder ships in the wheel as the package ``troupe.configs`` (its
files as they are, nothing copied in the source tree): an install made with pip has no
checkout, and ``troupe run configs/train.toml`` found no file. ``troupe configs`` lists them
with the first line of each one's comment; ``troupe configs NAME...`` writes each to
``configs/NAME`` in the current folder, where the README's commands look for it (``--out PATH``
for one elsewhere). A file already there is refused, before anything is written, unless
``--force``.

An ``--out`` that is no file to make (``-``, ``/dev/stdout``, a FIFO, a terminal: what a script
pipes the config through) is written to as it is, never refused nor replaced: the atomic
rename that makes a file whole would have put a regular file in place of ``/dev/stdout``
itself. A symbolic link to a file (a config kept by config management) is written through: its
target is the file replaced, the link stays.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import sys
import tempfile
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from troupe.cli.client import fail
from troupe.cli.literal import literal
from troupe.cli.preflight import writable_problem

__all__ = ["configs", "shipped_configs"]

console = Console()
_SUFFIXES = (".toml", ".service", ".sbatch")
DEFAULT_FOLDER = Path("configs")
STDOUT = "-"
_FD_FOLDER = re.compile(r"/proc/[^/]+(/task/[^/]+)?/fd")


def shipped_configs() -> dict[str, Traversable]:
    """Each shipped config by its name in ``configs/`` (``train.toml``, ``slurm/troupe.sbatch``)."""
    found: dict[str, Traversable] = {}

    def walk(folder: Traversable, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.name.startswith(("_", ".")):
                walk(entry, f"{prefix}{entry.name}/")
            elif entry.is_file() and entry.name.endswith(_SUFFIXES):
                found[prefix + entry.name] = entry

    walk(files("troupe.configs"), "")
    return dict(sorted(found.items()))


def _about(text: str, most: int = 90) -> str:
    """What a config is for: the first sentence of its leading comment (after a ``#!`` line), or
    where that is longer than ``most``, what comes before its first colon."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("#!"):
            continue
        said = line.lstrip("#").strip()
        if not line.startswith("#") or (not said and lines):
            break
        if said:
            lines.append(said)
    paragraph = " ".join(lines)
    sentence = paragraph.split(". ", 1)[0]
    if len(sentence) > most:
        head = sentence.split(": ", 1)[0]
        sentence = head if len(head) <= most else head[: most - 3] + "..."
    return sentence.rstrip(".")


def _unknown(name: str, known: dict[str, Traversable]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"no shipped config {name!r}{hint} (`troupe configs` lists them: {', '.join(known)})"


def _through_fd(path: Path) -> bool:
    """Whether ``path`` or a link on its way is an open file of a process (``/dev/stdout``,
    ``/dev/fd/N``, ``/proc/self/fd/N``): what it names is whatever that descriptor is, a pipe
    or a terminal as often as a file, and only writing to it reaches that."""
    hop = path
    for _ in range(40):  # the kernel's own limit on links followed
        if _FD_FOLDER.fullmatch(os.path.realpath(hop.parent)):
            return True
        if not hop.is_symlink():
            return False
        hop = hop.parent / os.readlink(hop)
    return False


def _direct(dest: Path) -> bool:
    """Whether ``dest`` is written to as it is (no file made beside it and renamed over it):
    ``-``, a descriptor's link, or anything there that is no regular file nor folder."""
    if str(dest) == STDOUT or _through_fd(dest):
        return True
    try:
        mode = os.stat(dest).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _write_direct(text: str, dest: Path) -> None:
    """``text`` written to what is at ``dest``: appended (a shell's ``>>`` kept), never made nor
    truncated, as the rename of a whole file is no way to reach a pipe or a terminal."""
    if str(dest) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        raise fail(
            f"--out {dest}: cannot write to it ({exc.strerror}); give a file path, or - for stdout", 1
        ) from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _write(text: str, dest: Path) -> None:
    """``text`` at ``dest``, whole or not at all (a temporary sibling renamed into place)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def configs(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NAME]...",
            help="Configs to write out (as `troupe configs` lists them: train.toml, slurm/troupe.sbatch); "
            "none: list them.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Where to write the one NAME given (default: configs/NAME here); - for stdout.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Write over a file that is there.")] = False,
) -> None:
    """List the configs troupe ships, or write them out.

    Without NAME: each config with what it is for. With NAMEs: each is written to configs/NAME
    in the current folder, where the README's commands look for it (troupe run
    configs/train.toml), or to --out for one. datagen-train.toml reads datagen.toml beside it:
    write both. An existing file is refused unless --force; --out - (or a pipe, a
    terminal, /dev/stdout) is written to as it is.
    """
    known = shipped_configs()
    if not names:
        if out is not None or force:
            raise fail("--out and --force go with a NAME to write: troupe configs NAME [--out PATH]", 2)
        width = max(map(len, known))
        for name, entry in known.items():
            about = _about(entry.read_text(encoding="utf-8"))
            console.print(literal(f"{name:<{width}}  {about}"), soft_wrap=True, highlight=False)
        return
    if out is not None and len(names) > 1:
        raise fail(f"--out takes one NAME, got {len(names)}: write them to configs/ (no --out)", 2)
    for name in names:
        if name not in known:
            raise fail(_unknown(name, known), 2)
    targets = {name: out if out is not None else DEFAULT_FOLDER / name for name in dict.fromkeys(names)}
    direct = {name: _direct(dest) for name, dest in targets.items()}
    for name, dest in targets.items():  # every problem before the first file is written
        if direct[name]:
            continue
        if dest.is_dir():
            raise fail(f"--out {dest}: is a directory; give a file path such as {dest / Path(name).name}", 2)
        real = dest.resolve()
        if real.exists() and not force:
            through = f" (a link to {real})" if dest.is_symlink() else ""
            raise fail(f"{dest}: already exists{through}; pass --force to write over it, or --out PATH", 2)
        problem = writable_problem(real.parent, "folder")
        if problem is not None:
            raise fail(f"{dest}: {problem}", 2)
    for name, dest in targets.items():
        text = known[name].read_text(encoding="utf-8")
        if direct[name]:
            _write_direct(text, dest)  # its own output: no line beside it, which may be stdout
            continue
        _write(text, dest.resolve())
        console.print(literal(f"wrote {dest}"), soft_wrap=True, highlight=False)
