"""An output folder held by one run at a time: by the lock of its journal (a one-host run's,
which its master takes over) or of its record (a run whose items come from a master); another run
is refused, naming the holder's pid. A training's folder is held the same way (``train_dir``).
"""

from __future__ import annotations

from pathlib import Path

from troupe.runtime.errors import ConfigError
from troupe.runtime.tasks.journal_lock import JournalBusy, JournalLock, lock_path

__all__ = ["held_by_another", "hold", "in_use_message"]


def held_by_another(target: Path, out: Path, who: str) -> str | None:
    """Why the output folder ``out`` cannot be used now: another ``who`` holds the lock of
    ``target`` (``JournalLock``), named by its pid; None when nobody does."""
    try:
        JournalLock.acquire(target).release()
    except JournalBusy:
        return in_use_message(target, out, who)
    return None


def hold(target: Path, out: Path, who: str) -> JournalLock:
    """The lock of ``target`` (``JournalLock``), for this process to hold ``out`` while it runs.

    Raises:
        ConfigError: another ``who`` holds it, named by its pid.
    """
    try:
        return JournalLock.acquire(target)
    except JournalBusy:
        raise ConfigError(in_use_message(target, out, who)) from None


def in_use_message(target: Path, out: Path, who: str) -> str:
    """The refusal of ``out`` while another ``who`` holds the lock of ``target``."""
    holder = lock_path(target).read_text(encoding="utf-8", errors="replace").strip()
    return (
        f"--out {out} is in use by another {who} (pid {holder or '?'}); wait for it to end, "
        "or pick another --out"
    )
