"""A one-host run checks its stage classes in the template it starts first, then forks every
replica from that template.

What a user relies on: a class that cannot run is refused with the same one line as before,
naming the file and the stage, before anything is made in ``out``; a module that ends the
interpreter as it imports is still reported with its last words; a good pipeline's replicas are
forked from the template that checked them, not from a second one, and no child process is
started just to import the classes once more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import structlog

from support.processes import gone_within
from troupe import ConfigError, run_pipeline_sync
from troupe.runtime.core import loading
from troupe.runtime.testing.plugin import import_path

PIPELINE = """
[pipeline]
name = "early"
items = 3

[[stages]]
name = "a"
actor = "{actor}"
"""


def _toml(tmp_path: Path, actor: str) -> Path:
    path = tmp_path / "early.toml"
    path.write_text(PIPELINE.format(actor=actor), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the template imports support.* as workers do


@pytest.fixture
def child_checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The checks this process ran in a child of its own (the template's answer spares them)."""
    calls: list[Any] = []
    real = loading._child_env  # what every check's child is started with, sync or async

    def spy(checks: Any) -> dict[str, str]:
        calls.append(checks)
        return real(checks)

    monkeypatch.setattr(loading, "_child_env", spy)
    return calls


@pytest.fixture
def run_logs_to_out() -> Iterator[None]:
    """Logging as a program that set none up has it: the run then logs to ``out/logs``."""
    structlog.reset_defaults()
    try:
        yield
    finally:
        structlog.reset_defaults()
        for handler in list(logging.getLogger().handlers):  # the file under this test's tmp_path
            logging.getLogger().removeHandler(handler)
            handler.close()


def _events(out: Path) -> list[dict[str, Any]]:
    lines = (out / "logs" / "local.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.usefixtures("run_logs_to_out")
def test_replicas_are_forked_from_the_template_that_checked_their_classes(
    tmp_path: Path, child_checks: list[Any]
) -> None:
    out = tmp_path / "out"
    result = run_pipeline_sync(_toml(tmp_path, "support.gc_probe:FrozenStage"), out=out)

    assert result.counts()["ok"] == 3
    assert all(o["frozen"] > 10_000 for o in result.outputs.values()), result.outputs  # forked
    assert child_checks == []
    events = [e["event"] for e in _events(out)]
    assert events.count("template_started") == 1, "the node forked from the run's template"
    assert events.index("template_ready") < events.index("journal_opened"), "checked before out was used"


def test_a_finished_run_is_answered_without_importing_its_classes(
    tmp_path: Path, child_checks: list[Any]
) -> None:
    toml, out = _toml(tmp_path, "support.gc_probe:FrozenStage"), tmp_path / "out"
    run_pipeline_sync(toml, out=out)
    assert run_pipeline_sync(toml, out=out).already_complete
    assert child_checks == [], "nothing will run: neither a template nor a child imports the classes"


@pytest.mark.parametrize(
    ("actor", "why"),
    [
        pytest.param(
            "support.no_such_early:Stage",
            "cannot import 'support.no_such_early:Stage': No module named 'support.no_such_early'",
            id="module-missing",
        ),
        pytest.param(
            "support.hook_stages:NotAStage",
            "'support.hook_stages:NotAStage' is not a subclass of troupe.runtime.pipeline.stage.StageActor",
            id="not-a-stage",
        ),
    ],
)
def test_a_class_the_template_refuses_is_one_line_and_nothing_is_made(
    tmp_path: Path, child_checks: list[Any], actor: str, why: str
) -> None:
    toml, out = _toml(tmp_path, actor), tmp_path / "out"
    with pytest.raises(ConfigError) as refused:
        run_pipeline_sync(toml, out=out)
    assert str(refused.value) == f"{toml}: stages.a.actor: {why}"
    assert child_checks == [], "the template said why"
    assert not out.exists()


def test_a_kwarg_the_class_does_not_take_is_refused_by_the_template_and_nothing_is_made(
    tmp_path: Path, child_checks: list[Any]
) -> None:
    toml, out = tmp_path / "typo.toml", tmp_path / "out"
    toml.write_text(
        PIPELINE.format(actor="troupe.actors.bench.synthetic:CostStage") + "kwargs = { cost = 0.01 }\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as refused:
        run_pipeline_sync(toml, out=out)
    said = str(refused.value)
    assert said.startswith(f"{toml}: stages.a.kwargs: troupe.actors.bench.synthetic:CostStage: "), said
    assert "takes no argument 'cost' (did you mean 'cost_s'?)" in said and "\n" not in said
    assert child_checks == [], "the template said why"
    assert not out.exists()


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(
            "import sys\nsys.exit('no GPU here')\n", "(exit status 1): 'no GPU here'", id="its-words"
        ),
        pytest.param("import os\nos._exit(3)\n", "(exit status 3), without a word on stderr", id="silent"),
    ],
)
def test_a_module_that_ends_the_template_is_reported_by_the_child_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, child_checks: list[Any], body: str, said: str
) -> None:
    (tmp_path / "troupe_test_early_exits.py").write_text(body)
    monkeypatch.chdir(tmp_path)
    toml, out = _toml(tmp_path, "troupe_test_early_exits:Stage"), tmp_path / "out"
    with pytest.raises(ConfigError) as refused:
        run_pipeline_sync(toml, out=out)
    assert f"stages.a.actor: importing it ended the process {said}" in str(refused.value)
    assert len(child_checks) == 1, "the template could not say, the child did"
    assert not out.exists()


def test_a_sigkilled_run_takes_its_early_template_with_it(tmp_path: Path) -> None:
    """The template a run starts before its node is the run's child with the node's guarantee:
    it dies with the run, whatever state the run is in (here: killed while it waits for it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "run", "--out", str(tmp_path / "out"), "--items", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        template = _wait_for_template(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert gone_within(template.pid, GONE_WITHIN_S), "the template outlived its run"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


GONE_WITHIN_S = 15.0  # a bound on a poll of the process table, not on speed


def _wait_for_template(pid: int) -> psutil.Process:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(child.cmdline())  # its title, once it has named itself
                if "troupe.runtime.node.template" in cmd or "troupe template" in cmd:
                    return child
        time.sleep(0.01)
    raise AssertionError("the run started no template within 60 s")


def test_a_sigkilled_run_takes_the_supervisor_its_template_forked_with_it(tmp_path: Path) -> None:
    """The run's node forks its supervisor from the template, ready by then: that supervisor,
    like every replica, dies with the run however the run ends (here: SIGKILLed mid-run)."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe.cli.main", "run", "--out", str(out), "--items", "200"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        supervisor = _wait_for_event(out, "supervisor_spawned")
        assert supervisor["how"] == "fork"
        _wait_for_event(out, "stage_started")
        children = psutil.Process(proc.pid).children(recursive=True)
        assert supervisor["supervisor_pid"] in {c.pid for c in children}
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        left = [c.pid for c in children if not gone_within(c.pid, GONE_WITHIN_S)]
        assert not left, f"outlived their SIGKILLed run: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_for_event(out: Path, event: str) -> dict[str, Any]:
    """The first ``event`` line of the run's log, polled for up to a minute."""
    log_file = out / "logs" / "local.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log_file.exists():
            for line in log_file.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record.get("event") == event:
                        return dict(record)
        time.sleep(0.05)
    raise AssertionError(f"the run logged no {event} within 60 s")
