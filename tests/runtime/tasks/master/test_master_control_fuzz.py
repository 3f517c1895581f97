"""Every control message the master answers, fuzzed with hypothesis (tests/support/
control_fuzz.py): any payload gets a reply or a clear error, never a crash or a hang; afterwards
the master still serves a valid request, and its journal still opens.

The master runs in-process over the in-memory transport, on a portal's event loop shared by
the examples, so that hundreds of payloads take seconds. The control names come from the
master itself: a control added later is fuzzed without a change here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.control_fuzz import REGRESSIONS, answer, field_names, payloads
from troupe.runtime.tasks.master import controls as master_controls
from troupe.runtime.tasks.master.journal_open import open_journal
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig
from troupe.runtime.transports.base import MemoryHub

FUZZ = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# The fields of the master's typed controls, and of a job (what ``submit`` carries).
CONTROL_FIELDS = [
    f.name
    for obj in vars(master_controls).values()
    if isinstance(obj, type) and is_dataclass(obj)
    for f in fields(obj)
]
JOB_FIELDS = ["job", "name", "kind", "count", "seed_start", "max_attempts", "tasks", "seeds", "params"]
NAMES = field_names([*CONTROL_FIELDS, *JOB_FIELDS])
STOPPING = {"shutdown"}  # fuzzed last, on a master of its own: they end it


class Served:
    def __init__(self, portal: BlockingPortal, master: Master, journal: Path) -> None:
        self.portal = portal
        self.master = master
        self.journal = journal

    def handler(self, control: str) -> Any:
        assert self.master.runtime is not None
        return self.master.runtime.control_handlers[control]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with _master(tmp_path_factory.mktemp("master-fuzz")) as s:
        yield s


def _start(path: Path) -> tuple[Master, Any]:
    journal, book = open_journal(path, new=True)
    master = Master(MasterConfig(tick_s=0.01), journal, book, transport=MemoryHub().transport(name="master"))
    return master, journal


class _master:
    """A master serving on a blocking portal; its journal is closed on exit."""

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "journal.db"

    def __enter__(self) -> Served:
        self._portal_cm = start_blocking_portal()
        portal = self._portal_cm.__enter__()
        self.master, self._journal = _start(self.path)
        self._run = portal.start_task_soon(self.master.run)
        portal.call(_ready, self.master)
        return Served(portal, self.master, self.path)

    def __exit__(self, *exc: object) -> None:
        try:
            self.master.stop()
            self._run.result(timeout=30)
        finally:
            self._journal.close()
            self._portal_cm.__exit__(None, None, None)


async def _ready(master: Master) -> None:
    with anyio.fail_after(30):
        await master.ready.wait()


@FUZZ
@given(data=st.data())
def test_every_master_control_answers_any_payload_with_a_reply_or_a_clear_error(
    served: Served, data: st.DataObject
) -> None:
    """Each example sends every control its own payload: a control registered later is
    fuzzed as well, with no list here to update."""
    assert served.master.runtime is not None
    handlers = served.master.runtime.control_handlers
    assert len(handlers) > 3 and set(handlers) >= STOPPING, sorted(handlers)
    for control in sorted(set(handlers) - STOPPING):
        payload = data.draw(payloads(NAMES), label=control)
        served.portal.call(answer, control, handlers[control], payload)


def test_the_master_still_serves_after_the_fuzzing(served: Served) -> None:
    assert served.portal.call(answer, "ping", served.handler("ping"), None) == "reply"
    job = {"job": {"job": {"name": "after", "kind": "k", "count": 2}}, "source": "fuzz"}
    reply = served.portal.call(served.handler("submit"), job)
    assert reply["job_id"]
    status = served.portal.call(served.handler("status"), None)
    assert isinstance(status, dict)


@pytest.mark.parametrize("control", sorted(STOPPING))
@settings(FUZZ, max_examples=20)
@given(payload=payloads(NAMES))
def test_a_stopping_control_answers_any_payload_and_the_journal_opens_after(
    tmp_path_factory: pytest.TempPathFactory, control: str, payload: Any
) -> None:
    with _master(tmp_path_factory.mktemp("master-stop")) as s:
        s.portal.call(answer, control, s.handler(control), payload)
    journal, _ = open_journal(s.journal)  # closed cleanly: it opens again
    journal.close()


@pytest.mark.parametrize("payload", REGRESSIONS, ids=lambda p: type(p).__name__)
def test_every_master_control_answers_the_payloads_fuzzing_once_crashed_it_on(
    served: Served, payload: Any
) -> None:
    assert served.master.runtime is not None
    handlers = served.master.runtime.control_handlers
    for control in sorted(set(handlers) - STOPPING):
        served.portal.call(answer, control, handlers[control], payload)
