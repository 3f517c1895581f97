"""The line ``troupe run`` says when the default endpoints another troupe holds gave way to free
ports, a pipeline's run or a training's: on stderr (stdout may carry ``--json``), never wrapped."""

from __future__ import annotations

from rich.console import Console

from troupe.cli.literal import literal

__all__ = ["moved_note", "say_moved"]


def moved_note(
    node: str, node_moved: bool, master: str | None = None, master_moved: bool = False
) -> str | None:
    """The line that says which default endpoints were taken and where the run listens instead
    (None when none moved); ``master``: the master the run starts (None: it starts none, as a
    training run, whose node's is then the only default)."""
    if master is None:
        if not node_moved:
            return None
        return (
            f"the default endpoint is taken (another troupe run?): this run's node listens on {node} "
            f"(troupe ctl status --node {node})"
        )
    taken = " and ".join(w for w, moved in (("node's", node_moved), ("master's", master_moved)) if moved)
    if not taken:
        return None
    verb = "endpoints are" if node_moved and master_moved else "endpoint is"
    return (
        f"the default {taken} {verb} taken (another troupe run?): this run's node listens on {node}, "
        f"its master on {master} (troupe ctl status --node {node})"
    )


def say_moved(note: str) -> None:
    """``note`` on stderr, whole: piped, it was cut at column 80."""
    Console(stderr=True).print(literal(note), soft_wrap=True)
