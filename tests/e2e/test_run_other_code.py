"""``troupe run`` resuming a folder another troupe code made: one line on the terminal (on stderr
with --json), both codes in run.json once this code may have made something there, and no second
word once it did (report up 5: an older troupe's interrupted run, resumed by today's, mixed two
encoders' episodes silently; report rg 6: a run stopped before it made anything was recorded).

The other code is written into the record, as an older install would have left it; the pipeline
is the synthetic CostStage one at a millisecond per item, so a run is quick, or one whose stages
hold their items at gates (files), for a test to stop a run before its last stage or kill it
right after a commit there.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from support.port_range import test_endpoint
from support.run_resume_helpers import Command, running
from support.synthetic_runs import synthetic_pipeline, troupe_run
from troupe.runtime.pipeline.run_code import this_code
from troupe.runtime.testing.plugin import import_path

pytestmark = pytest.mark.e2e

OLDER = {"version": "0.0.9", "digest": "0123abcd"}


def _begun_by_older_code(out: Path) -> None:
    """The record as an older troupe left it when its run was stopped before it finished."""
    record_path = out / ".troupe" / "run.json"
    record = json.loads(record_path.read_text(encoding="utf-8"))
    record_path.write_text(json.dumps({**record, "complete": None, "made_by": [OLDER]}), encoding="utf-8")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_resumed_under_other_code_says_so_in_one_line(tmp_path: Path, as_json: bool) -> None:
    toml, out = synthetic_pipeline(tmp_path), tmp_path / "out"
    json_flag = ("--json",) if as_json else ()
    first = troupe_run(toml, out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "was made by" not in first.stdout + first.stderr
    _begun_by_older_code(out)

    resumed = troupe_run(toml, out, *json_flag)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    said = resumed.stderr if as_json else resumed.stdout
    now = this_code()
    lines = [ln for ln in said.splitlines() if "was made by" in ln]
    assert lines == [
        f"--out {out.resolve()} was made by troupe 0.0.9 (code 0123abcd); this is troupe "
        f"{now['version']} (code {now['digest']}): what this run makes there will be this code's and "
        "may differ from what is there already (an encoder's settings, say), so the folder mixes "
        "both; --fresh makes everything again with this one"
    ], said
    if as_json:
        assert json.loads(resumed.stdout)["already_complete"] is False  # stdout: the JSON alone
    record = json.loads((out / ".troupe" / "run.json").read_text(encoding="utf-8"))
    # Said, yet nothing made: every item was done before, and no stage finalises (report rg 6).
    assert record["made_by"] == [OLDER]

    again = troupe_run(toml, out, *json_flag)  # finished by this code: nothing more to say
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "was made by" not in again.stdout + again.stderr


GATED = """\
[pipeline]
name = "gated"
items = 3

[[stages]]
name = "plan"
actor = "support.hook_stages:GatedStage"
kwargs = {{ log = "{log}", held = "{plan_held}", gate = "{plan_gate}" }}

[[stages]]
name = "store"
actor = "support.hook_stages:GatedOutputStage"
kwargs = {{ log = "{log}", outputs = "{outputs}", held = "{store_held}", gate = "{store_gate}" }}
"""


class _Gated:
    """The gated pipeline's files: ``plan`` holds each item until ``plan_gate`` exists (having
    written ``plan_held``); ``store`` commits each item's file in ``outputs``, then holds its
    answer until ``store_gate`` exists (having written ``store_held``)."""

    def __init__(self, tmp_path: Path) -> None:
        self.toml, self.out = tmp_path / "gated.toml", tmp_path / "out"
        names = ("log", "plan_held", "plan_gate", "store_held", "store_gate")
        self.files = {name: tmp_path / name for name in names}
        self.outputs = tmp_path / "outputs"  # the store's committed files, outside --out
        self.toml.write_text(
            GATED.format(**{k: str(v) for k, v in self.files.items()}, outputs=self.outputs), encoding="utf-8"
        )

    def args(self) -> list[str]:
        return [
            "run",
            str(self.toml),
            "--out",
            str(self.out),
            "--endpoint",
            test_endpoint(),
            "--master",
            test_endpoint(),
        ]

    def stop_held_in_plan(self, cmd: Command) -> None:
        """Ctrl-C ``cmd`` once an item is held in plan, before any reached the store."""
        held, release = self.files["plan_held"], self.files["plan_held"].with_suffix(".released")
        assert cmd.ctrl_c_while_held("an item held in plan", held, release, 120) == 130, cmd.text()[-3000:]
        held.unlink()

    def made_by(self) -> list[dict[str, Any]]:
        made: list[dict[str, Any]] = json.loads((self.out / ".troupe" / "run.json").read_text())["made_by"]
        return made


@pytest.fixture
def gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _Gated:
    monkeypatch.setenv("PYTHONPATH", import_path())  # the workers import support.hook_stages
    return _Gated(tmp_path)


@pytest.mark.timeout(400)
def test_a_run_of_other_code_stopped_before_it_made_anything_is_not_recorded(
    tmp_path: Path, gated: _Gated
) -> None:
    """Report rg 6: a run under other code stopped before its first commit stood in made_by,
    and every later run said the folder "mixes both". Now it says its line as it starts and
    records nothing; a run that goes on to commit records its code."""
    with running(gated.args(), tmp_path, "begun") as begun:  # begins the folder, makes nothing
        gated.stop_held_in_plan(begun)
    assert gated.made_by() == []  # nothing made there yet
    _begun_by_older_code(gated.out)

    with running(gated.args(), tmp_path, "stopped") as stopped:
        gated.stop_held_in_plan(stopped)
    assert "was made by troupe 0.0.9 (code 0123abcd)" in _flat(stopped), stopped.text()[-3000:]
    assert not gated.outputs.exists() or not any(gated.outputs.iterdir())
    assert gated.made_by() == [OLDER]  # as it was: the stopped run made nothing

    gated.files["plan_gate"].write_text("")
    gated.files["store_gate"].write_text("")
    with running(gated.args(), tmp_path, "made") as made:
        assert made.wait(timeout=300) == 0, made.text()[-3000:]
    assert "was made by troupe 0.0.9 (code 0123abcd); this is" in _flat(made), made.text()[-3000:]
    assert len(list(gated.outputs.iterdir())) == 3
    assert gated.made_by() == [OLDER, this_code()]


@pytest.mark.timeout(400)
def test_a_run_of_other_code_killed_right_after_its_first_commit_is_recorded(
    tmp_path: Path, gated: _Gated
) -> None:
    """SIGKILL once the store committed an item, before the run heard of it: the code was
    recorded before the item went to the store, so the folder says it mixes both."""
    gated.files["plan_gate"].write_text("")
    with running(gated.args(), tmp_path, "begun") as begun:
        begun.wait_until("a committed item", gated.files["store_held"].exists)
        begun.signal(signal.SIGKILL, group=True)
        assert begun.wait() == -signal.SIGKILL
    now = this_code()
    assert gated.made_by() == [now]
    _begun_by_older_code(gated.out)
    gated.files["store_held"].unlink()

    with running(gated.args(), tmp_path, "killed") as killed:
        killed.wait_until("a committed item", gated.files["store_held"].exists)
        killed.signal(signal.SIGKILL, group=True)
        assert killed.wait() == -signal.SIGKILL
    assert gated.made_by() == [OLDER, now]

    gated.files["store_gate"].write_text("")
    with running(gated.args(), tmp_path, "rerun") as rerun:  # this code made the last: no word
        assert rerun.wait(timeout=300) == 0, rerun.text()[-3000:]
    assert "was made by" not in _flat(rerun), rerun.text()[-3000:]
    assert gated.made_by() == [OLDER, now]


def _flat(cmd: Command) -> str:
    """What ``cmd`` printed, its lines joined (a long one wraps at the terminal's width)."""
    return " ".join(cmd.text().split())
