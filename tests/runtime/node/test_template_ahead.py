"""A node template started ahead (``template_prestart``), as ``troupe run`` starts one at its
entry, before its own imports, and handed to the run's node (``TemplateLink(ahead=)``).

Real template processes; a real node (in this process) for the forks. What a user relies on: the
node forks its workers from the template the command started, told its name and its checks
later; and that template never outlives the command, whether no node takes it over, the node
stops before it does, or the command's end closes its socket first.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import psutil
import pytest

from support.local_node import ECHO, echo_node_config, ready_template, running_node
from support.processes import gone_within
from troupe import template_prestart
from troupe.runtime.node.template_link import TemplateLink
from troupe.runtime.testing.plugin import import_path

WITHIN_S = 60.0  # a bound on a start or a stop on a loaded machine, not on speed


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the template imports support.* as workers do


def _started_ahead(modules: list[str]) -> template_prestart.Prestarted:
    started = template_prestart.prestart(modules)
    assert started is not None
    assert template_prestart.take() is started  # this test hands it over, as the command does
    return started


async def test_a_node_forks_its_workers_from_the_template_started_ahead(tmp_path: Path) -> None:
    ahead = _started_ahead([ECHO.cls])
    link = TemplateLink("fahead", [ECHO.cls], ahead=ahead)
    async with ready_template(link) as template:
        assert template.describe()["pid"] == ahead.pid
        title = " ".join(psutil.Process(ahead.pid).cmdline())
        assert "troupe template (node fahead)" in title, "told its node's name after it started"
        async with running_node(echo_node_config(tmp_path, "fahead"), template) as node:
            worker = node.workers["w1"]
            assert worker.pid is not None and template.forks >= 1
            assert psutil.Process(worker.pid).ppid() == os.getpid()  # the node's own child
    assert gone_within(ahead.pid, WITHIN_S), "the template outlived its node's stop"


async def test_the_checks_told_later_are_answered() -> None:
    ahead = _started_ahead([])
    check = ("stages.a.actor", "support.hook_stages:NotAStage", "stage", [], {})
    link = TemplateLink("fahead", ["support.hook_stages:NotAStage"], checks=[check], ahead=ahead)
    async with ready_template(link) as template:
        found = await template.checked()
    assert found is not None and found.failure is not None
    where, error = found.failure
    assert where == "stages.a.actor" and "is not a subclass of" in error
    assert gone_within(ahead.pid, WITHIN_S)


async def test_a_check_only_template_checks_the_classes_found_here_and_leaves_the_rest() -> None:
    """``troupe run --cluster``'s template: told ``installed_only``, it checks a class whose
    module it finds (a misspelt one is named) and leaves one whose module only the cluster's
    hosts may have; it imports no class's ``preload_modules``."""
    ahead = template_prestart.prestart(["support.hook_stages:NotAStage"], check_only=True)
    assert ahead is not None and template_prestart.take() is ahead
    checks = [
        ("stages.a.actor", "support.no_such_stages:Stage", "stage", [], {}),
        ("stages.b.actor", "support.hook_stages:NotAStage", "stage", [], {}),
    ]
    link = TemplateLink("fahead", [c[1] for c in checks], checks=checks, ahead=ahead, installed_only=True)
    async with ready_template(link) as template:
        found = await template.checked()
    assert found is not None and found.failure is not None
    where, error = found.failure
    assert where == "stages.b.actor" and "is not a subclass of" in error  # a's module: not here
    assert gone_within(ahead.pid, WITHIN_S)

    ahead = template_prestart.prestart([], check_only=True)
    assert ahead is not None and template_prestart.take() is ahead
    link = TemplateLink("fahead", [checks[0][1]], checks=checks[:1], ahead=ahead, installed_only=True)
    async with ready_template(link) as template:
        found = await template.checked()
    assert found is not None and found.failure is None


async def test_a_template_ahead_that_no_node_took_over_goes_with_the_link_s_stop() -> None:
    ahead = _started_ahead([])
    link = TemplateLink("fahead", [], ahead=ahead)  # never started: the run stopped first
    await link.stop()
    assert gone_within(ahead.pid, WITHIN_S)


def test_a_template_ahead_whose_command_ended_first_exits_by_itself() -> None:
    ahead = _started_ahead([])
    ahead.sock.close()  # the command exited without a node for it
    deadline = time.monotonic() + WITHIN_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(ahead.pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)  # a bounded poll of our own child
    ahead.discard()
    raise AssertionError("the template waited on for a node that will never come")


def test_discard_kills_and_reaps_it() -> None:
    ahead = _started_ahead([])
    ahead.discard()
    with pytest.raises(ChildProcessError):
        os.waitpid(ahead.pid, os.WNOHANG)  # reaped already: no zombie left


async def test_a_template_whose_link_is_cancelled_is_killed_and_reaped() -> None:
    """A Ctrl-C cancels the run's tasks before anything stops the template: it must not be left
    for the parent-death signal, and a zombie for init, once the command exits."""
    ahead = _started_ahead([])
    link = TemplateLink("fahead", [], ahead=ahead)
    with anyio.fail_after(WITHIN_S):
        async with anyio.create_task_group() as tg:
            await link.start(tg)
            while not link.describe()["ready"]:
                await anyio.sleep(0.01)  # a bounded poll of in-process state
            tg.cancel_scope.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(ahead.pid, os.WNOHANG)  # noqa: ASYNC222  # WNOHANG: killed and reaped already
