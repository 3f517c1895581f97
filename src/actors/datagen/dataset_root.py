"""Where the dataset writer writes its dataset, and whether that folder is the writer's to write.

``finalize_dataset`` owns ``data/``, ``videos/`` and ``meta/`` of its root: it rewrites their
files and deletes every other file under ``data/``, ``videos/`` and ``meta/episodes/``. The run's
``--out`` is guarded by its run record (``run_dir``); a ``dataset`` kwarg naming another folder
was not, and a LeRobot dataset there was replaced without a word (40 episodes became 6, report
ds 6). Such a folder is taken only when it is new or empty, and marked (``MARK``, naming the
writer's store): a folder with this store's mark is the dataset an earlier run of it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from troupe.runtime.errors import ConfigError

__all__ = ["MARK", "claim_dataset_root", "dataset_root"]

MARK = ".troupe-dataset"
"""The file in a dataset folder other than ``--out`` that names the store its episodes are in."""


def dataset_root(dataset: str | None, out: str | None) -> Path | None:
    """The dataset's folder, absolute: ``dataset``, one relative taken from ``out`` (the run's
    ``--out``, as ``{out}`` reads: from the shell's folder, a rerun elsewhere wrote a second
    dataset there, report ds 4); ``out`` without ``dataset``; None without either."""
    if dataset is None:
        return None if out is None else Path(out).absolute()
    root = Path(dataset).expanduser()
    if not root.is_absolute() and out is not None:
        root = Path(out) / root
    return root.absolute()


def claim_dataset_root(root: Path, store: Path, out: str | None) -> None:
    """Take ``root`` for the dataset of ``store``'s episodes: ``out`` itself is the run's (its
    record guards it); any other folder must be new, empty, or marked by this store before.

    Raises:
        ConfigError: ``root`` is a file, or holds what this store's runs did not write there.
    """
    if out is not None and root == Path(out).absolute():
        return
    owner = str(store.absolute())
    try:
        entries = sorted(p.name for p in root.iterdir())
    except FileNotFoundError:
        entries = []
    except NotADirectoryError:
        raise ConfigError(f"kwargs.dataset {root} is a file; give a new or empty directory") from None
    if MARK in entries:
        marked = _marked_store(root / MARK)
        if marked == owner:
            return
        raise ConfigError(
            f"kwargs.dataset {root} holds the dataset of another store ({marked or 'its mark unreadable'}), "
            f"not this run's ({owner}); give a new or empty directory (finalize would replace it)"
        )
    if entries:
        raise ConfigError(
            f"kwargs.dataset {root} holds {entries[0]!r}, which no run of this store wrote; give "
            "a new or empty directory (finalize would replace data/, videos/ and meta/ there)"
        )
    root.mkdir(parents=True, exist_ok=True)
    (root / MARK).write_text(json.dumps({"store": owner}) + "\n", encoding="utf-8")


def _marked_store(mark: Path) -> str | None:
    try:
        store = json.loads(mark.read_text(encoding="utf-8")).get("store")
    except (OSError, ValueError, AttributeError):
        return None
    return store if isinstance(store, str) else None
