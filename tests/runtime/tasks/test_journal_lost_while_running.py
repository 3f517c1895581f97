"""A master whose journal file is deleted, replaced or cut short while it runs stops, saying so
(it went on acknowledging writes into a file no restart would find, and its next start said the
journal does not exist). A real master in memory on a real journal file."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from troupe.runtime.errors import JournalError
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.transports.base import MemoryHub

WAIT_S = 30  # a bound on the watch's next look (every second), not on speed


def _delete(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _replace(path: Path) -> None:
    other = path.with_name("other.db")
    other.write_bytes(path.read_bytes())
    os.replace(other, path)


def _cut(path: Path) -> None:
    os.truncate(path, 0)


@pytest.mark.parametrize(
    ("damage", "said"),
    [(_delete, "was deleted"), (_replace, "was replaced by another file"), (_cut, "was cut short")],
)
async def test_the_master_stops_saying_what_happened_to_its_journal(
    tmp_path: Path, damage: Callable[[Path], None], said: str
) -> None:
    path = tmp_path / "journal.db"
    journal, book = open_journal(path, new=True)
    master = Master(MasterConfig(tick_s=0.01), journal, book, transport=MemoryHub().transport(name="master"))
    try:
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    with pytest.raises(JournalError) as err:
                        await master.run()
                    assert f"journal {path} {said}" in str(err.value) and "while the master ran" in str(
                        err.value
                    )
                    assert "Restore the journal from a backup, or start a new one (--new)" in str(err.value)

                tg.start_soon(run)
                await master.ready.wait()
                damage(path)
    finally:
        journal.close()
