"""``troupe configs``: the configs the README and the --help texts name, from the install.

The repository's ``configs/`` folder ships in the wheel as the package ``troupe.configs`` (its
files as they are, nothing copied in the source tree): an install made with pip has no
checkout, and ``troupe run configs/train.toml`` found no file. ``troupe configs`` lists them
with the first line of each one's comment; ``troupe configs NAME...`` writes each to
``configs/NAME`` in the current folder, where the README's commands look for it (``--out PATH``
for one elsewhere). A file already there is refused, before anything is written, unless
``--force``.
"""

from __future__ import annotations

import difflib
import os
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
        typer.Option("--out", "-o", help="Where to write the one NAME given (default: configs/NAME here)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Write over a file that is there.")] = False,
) -> None:
    """List the configs troupe ships, or write them out.

    Without NAME: each config with what it is for. With NAMEs: each is written to configs/NAME
    in the current folder, where the README's commands look for it (troupe run
    configs/train.toml), or to --out for one. datagen-train.toml reads datagen.toml beside it:
    write both. An existing file is refused unless --force.
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
    for name, dest in targets.items():  # every problem before the first file is written
        if dest.is_dir():
            raise fail(f"--out {dest}: is a directory; give a file path such as {dest / Path(name).name}", 2)
        if dest.exists() and not force:
            raise fail(f"{dest}: already exists; pass --force to write over it, or --out PATH", 2)
        problem = writable_problem(dest.parent, "folder")
        if problem is not None:
            raise fail(f"{dest}: {problem}", 2)
    for name, dest in targets.items():
        _write(known[name].read_text(encoding="utf-8"), dest)
        console.print(literal(f"wrote {dest}"), soft_wrap=True, highlight=False)
