"""An actor class whose module hangs as it imports.

A run names it while it waits, gives up after the template's ``ready_s`` with one line naming
the stage, and a Ctrl-C stops it at once. Before, such a run said nothing for two minutes (the
template's ready timeout), then checked the classes again in a child that hung for ten more,
and a first Ctrl-C waited for that child. ``node start``'s own check names the class after 30 s
and every minute, and its ten-minute guard kills the child.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import anyio
import pytest

from support.processes import gone_within
from troupe import ConfigError
from troupe.runtime.core import loading
from troupe.runtime.core.loading import check_node_actors, check_stage_actors_async
from troupe.runtime.node.config import load_node_config
from troupe.runtime.pipeline.config import PipelineConfig, load_pipeline
from troupe.runtime.pipeline.early_template import early_template
from troupe.runtime.pipeline.runner import run_pipeline

HANGS = """
import os, pathlib, time
pathlib.Path(os.environ["TROUPE_TEST_HANG_MARK"]).write_text(str(os.getpid()))
time.sleep(600)
"""
PIPELINE = """
[pipeline]
name = "hangs"
items = 2

[[stages]]
name = "a"
actor = "troupe_test_hangs:Stage"
"""
CLASS = "troupe_test_hangs:Stage"
WITHIN_S = 60.0  # a bound on a hang, not on speed


@pytest.fixture
def mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipeline whose one class hangs as it imports, having written its process's pid here."""
    (tmp_path / "troupe_test_hangs.py").write_text(HANGS, encoding="utf-8")
    (tmp_path / "hangs.toml").write_text(PIPELINE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "hanging.pid"
    monkeypatch.setenv("TROUPE_TEST_HANG_MARK", str(path))
    return path


def _cfg(tmp_path: Path) -> PipelineConfig:
    return load_pipeline(tmp_path / "hangs.toml")


async def _pid_written(mark: Path) -> int:
    with anyio.fail_after(WITHIN_S):
        while not mark.exists() or not mark.read_text():
            await anyio.sleep(0.05)
    return int(mark.read_text())


async def test_the_run_names_the_import_it_waits_on_and_a_cancel_takes_the_template(
    tmp_path: Path, mark: Path
) -> None:
    seen: list[tuple[str | None, float]] = []
    named = anyio.Event()

    def importing(now: str | None, waited_s: float) -> None:
        seen.append((now, waited_s))
        if now == CLASS:
            named.set()

    with anyio.fail_after(WITHIN_S):
        async with anyio.create_task_group() as tg:
            run = partial(run_pipeline, tmp_path / "hangs.toml", tmp_path / "out", on_importing=importing)
            tg.start_soon(run)
            await named.wait()
            pid = await _pid_written(mark)
            tg.cancel_scope.cancel()  # what a Ctrl-C does to the run
    assert gone_within(pid, WITHIN_S, reaped=True), "the template hanging in the import went with the run"
    waits = [w for _, w in seen]
    assert waits == sorted(waits) and waits[-1] > 0


async def test_an_import_still_going_after_ready_s_fails_the_run_naming_the_stage(
    tmp_path: Path, mark: Path
) -> None:
    with anyio.fail_after(WITHIN_S * 2), pytest.raises(ConfigError) as refused:
        async with early_template(_cfg(tmp_path), "n", "hangs.toml", ready_s=15.0):
            pass
    said = str(refused.value)
    assert said.startswith(f"hangs.toml: stages.a.actor: importing '{CLASS}' took over 15 s"), said
    assert "would hang every replica" in said
    assert gone_within(int(mark.read_text()), WITHIN_S, reaped=True)


PRELOADS_HANG = """
from troupe.runtime.pipeline.stage import StageActor


class Stage(StageActor):
    preload_modules = ("troupe_test_hangs",)

    def process(self, item):
        return item
"""


async def test_a_preload_still_importing_after_ready_s_fails_the_run_naming_it(
    tmp_path: Path, mark: Path
) -> None:
    """The class imports (its light template checks it, and the run goes on), but what it
    names in ``preload_modules`` hangs: the run stops with the same line as for a class."""
    (tmp_path / "troupe_test_preloads_hang.py").write_text(PRELOADS_HANG, encoding="utf-8")
    cfg = PipelineConfig.model_validate(
        {"name": "hangs", "items": 2, "stages": [{"name": "a", "actor": "troupe_test_preloads_hang:Stage"}]}
    )
    with anyio.fail_after(WITHIN_S * 2), pytest.raises(ConfigError) as refused:
        async with early_template(cfg, "n", "hangs.toml", ready_s=15.0) as template:
            assert await template.checked() is not None, "checked by the light template"
            await anyio.sleep(WITHIN_S * 2)  # the run, which the hang ends
    said = str(refused.value)
    assert said.startswith("hangs.toml: stages' classes: importing 'troupe_test_hangs' took over 15 s"), said
    assert "is a module a stage's class preloads" in said
    assert gone_within(int(mark.read_text()), WITHIN_S, reaped=True)


async def test_a_cancel_kills_the_child_check_hanging_in_an_import(tmp_path: Path, mark: Path) -> None:
    with anyio.fail_after(WITHIN_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(check_stage_actors_async, _cfg(tmp_path), "hangs.toml")
            pid = await _pid_written(mark)
            assert pid != os.getpid()
            tg.cancel_scope.cancel()
    assert gone_within(pid, WITHIN_S, reaped=True), "the check's child went with the cancelled check"


NODE = """
[[workers]]
name = "w"
actors = [{ name = "h", class = "troupe_test_hangs:Stage" }]
"""


def test_a_node_s_class_check_names_the_hanging_class_then_gives_up_and_kills_its_child(
    tmp_path: Path, mark: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loading, "_FIRST_NOTE_S", 1.0)
    monkeypatch.setattr(loading, "_EVERY_NOTE_S", 1.0)
    monkeypatch.setattr(loading, "_IMPORT_GUARD_S", 15)
    (tmp_path / "node.toml").write_text(NODE, encoding="utf-8")
    notes: list[str] = []
    with pytest.raises(ConfigError) as refused:
        check_node_actors(load_node_config(tmp_path / "node.toml"), "node.toml", on_slow=notes.append)
    assert str(refused.value).startswith("node.toml: importing the actor classes took over 15 s")
    # Said while it waited, once the child had named the class it imports.
    assert notes[-1].startswith("node.toml: workers.w.actors.h.class is importing for "), notes
    assert gone_within(int(mark.read_text()), WITHIN_S, reaped=True), "the guard killed the child"
