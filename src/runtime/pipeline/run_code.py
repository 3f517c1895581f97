"""Which troupe code made what a run's folder holds: kept in its record, said when other code goes on.

A run folder resumed by another troupe (an upgrade between an interrupted run and its rerun)
mixed two codes' outputs without a word: the episodes made before were encoded with the older
libx264 settings, those after with the newer, and every frame decodes. README promises the same
bytes only from the same troupe version, and nothing in the folder said which made it. The
record (``run.json``; a training's ``.troupe-train/run.json``) now keeps ``made_by``: the codes
that made what the folder holds, oldest first, each as ``troupe --version`` shows it
(``version`` and ``digest``, ``runtime/code_identity.py``); a run whose code is not the last
one's says so in one line as it starts, and adds its own once it may have made something: a
pipeline run before it first hands an item to its last stage or finalises (``first_output.py``;
one stopped before that made nothing, and is not recorded: report rg 6), a training as it
is prepared, taken back as it ends where it committed no checkpoint (``train_dir.py``). A run
folder's record starts with an empty list: nothing made there yet. It is not
refused: the outputs made so far are sound, and ``--fresh`` makes them all again with one code
where that matters. A record of a troupe that kept no ``made_by`` starts its list with
:data:`UNRECORDED`, said as such.

The code is this process's: ``troupe run``'s, whose node's workers fork from it. On a cluster
the nodes run their own code, compared with it as the run starts (``mixed_code.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from troupe.runtime.code_identity import code_digest, version

__all__ = ["UNRECORDED", "code_line", "last_other_code", "this_code"]

UNRECORDED: dict[str, Any] = {"version": None, "digest": None}
"""The entry of ``made_by`` for the code of a run recorded before troupe kept it: unknown."""


def this_code() -> dict[str, Any]:
    """This process's troupe code, as ``made_by`` keeps it."""
    return {"version": version(), "digest": code_digest()}


def code_line(made_by: Any, out: Path, made_now: str) -> tuple[list[dict[str, Any]], str | None]:
    """``made_by`` (a record's, or None where it kept none) with this process's code last, and
    the line that says a run of it goes on where other code ran last (None where the same did).

    ``made_now``: what this run makes there, in the line (``what this run makes there``).
    """
    now = this_code()
    if made_by == []:  # a record begun before anything was made: nothing to mix with
        return [now], None
    earlier = _entries(made_by)
    if earlier and earlier[-1] == now:
        return earlier, None
    if not earlier:  # a record of a troupe that kept none: its code is not known
        earlier = [dict(UNRECORDED)]
    named = ", then ".join(_shown(entry) for entry in earlier)
    line = (
        f"--out {out} was made by {named}; this is {_shown(now)}: {made_now} will be this code's and "
        "may differ from what is there already (an encoder's settings, say), so the folder mixes "
        "both; --fresh makes everything again with this one"
    )
    return [*earlier, now], line


def last_other_code(made_by: Any) -> str | None:
    """The code that made the latest of a folder (the last of its ``made_by``), as ``troupe
    --version`` says it, where it is known and not this process's: the troupe to run to go on
    with what it made; None otherwise."""
    earlier = _entries(made_by)
    if not earlier or earlier[-1] == this_code() or earlier[-1].get("digest") is None:
        return None
    return _shown(earlier[-1])


def _entries(made_by: Any) -> list[dict[str, Any]]:
    """The well-formed entries of a recorded ``made_by`` (a list of version and digest); none
    where it is missing or damaged (said as unrecorded)."""
    if not isinstance(made_by, list):
        return []
    keys = set(UNRECORDED)
    return [dict(e) for e in made_by if isinstance(e, dict) and set(e) == keys]


def _shown(entry: dict[str, Any]) -> str:
    """An entry as ``troupe --version`` says it: ``troupe 0.1.0 (code 3f9a1c2e)``."""
    if entry.get("digest") is None:
        return "a troupe that did not record its code"
    return f"troupe {entry.get('version')} (code {entry['digest']})"
