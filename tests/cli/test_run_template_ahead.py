"""``troupe run`` starts its node's template at the command's entry (``troupe.cli.entry``),
before the command's own imports, and the run's node takes it over.

Through the console script's entry, as a user runs it. What a user relies on: the run forks
from that template and reports the whole command's time beside the run's own; and the template
never outlives the command: refused, interrupted while it imports, or SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from support.cli_scripts import INTERRUPT_AT_COMMAND_IMPORT
from support.processes import gone_within
from troupe.actors.datagen.embedded_pipeline import DEFAULT_PIPELINE
from troupe.cli.entry import stage_classes

WITHIN_S = 60.0  # a bound on a hang or a poll of the process table, not on speed

# The console script's entry, with the template it starts ahead printed first (its pid).
ENTRY = """
import sys
import troupe.template_prestart as ahead

real = ahead.prestart

def told(modules, check_only=False):
    started = real(modules, check_only)
    print(started.pid if started else "none", flush=True)
    return started

ahead.prestart = told
{before}
from troupe.cli.entry import main
main()
"""


def _entry(*args: str, before: str = "") -> list[str]:
    return [sys.executable, "-c", ENTRY.format(before=before), *args]


def test_the_run_forks_from_the_template_its_command_started_and_reports_the_command_s_time(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        _entry("run", "--out", str(out), "--items", "2", "--json"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pid_line, _, report = done.stdout.partition("\n")
    figures = json.loads(report)
    assert figures["items"]["ok"] == 2
    assert figures["command_s"] >= figures["wall_s"] > 0
    assert 0 <= figures["command_startup_share"] <= 1
    lines = [json.loads(line) for line in (out / "logs" / "local.jsonl").read_text().splitlines()]
    started = [line for line in lines if line["event"] == "template_started"]
    assert [s["template_pid"] for s in started] == [int(pid_line)], "the node took the command's template"
    assert started[0]["ahead_s"] > 0
    assert any(line["event"] == "worker_spawned" for line in lines)
    assert gone_within(int(pid_line), WITHIN_S)


def test_a_refused_run_leaves_no_template(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    done = subprocess.run(
        _entry("run", "--out", str(not_a_dir)), capture_output=True, text=True, timeout=WITHIN_S, check=False
    )
    assert done.returncode == 2 and "is a file, not a directory" in done.stderr + done.stdout
    pid = int(done.stdout.partition("\n")[0])
    assert not psutil.pid_exists(pid), "the command reaped the template it did not use"


def test_a_ctrl_c_while_the_command_imports_leaves_no_template(tmp_path: Path) -> None:
    done = subprocess.run(
        _entry("run", "--out", str(tmp_path / "out"), before=INTERRUPT_AT_COMMAND_IMPORT),
        capture_output=True,
        text=True,
        timeout=WITHIN_S,
        check=False,
    )
    assert done.returncode == 130 and done.stderr == "", done.stderr
    assert not psutil.pid_exists(int(done.stdout.strip()))


def test_a_sigkilled_command_takes_its_template_with_it(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        _entry("run", "--out", str(tmp_path / "out"), "--items", "200"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        template = psutil.Process(pid)
        deadline = time.monotonic() + WITHIN_S
        while "troupe template" not in " ".join(template.cmdline()):  # it guards itself by then
            assert time.monotonic() < deadline, "the template never named itself"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=WITHIN_S)
        assert gone_within(pid, WITHIN_S), "the template outlived its SIGKILLed command"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_classes_come_from_the_pipeline_file_or_the_default(tmp_path: Path) -> None:
    default = [s["actor"] for s in DEFAULT_PIPELINE["stages"]]
    assert stage_classes([]) == default
    assert stage_classes(["--out", "x", "--items", "3"]) == default
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[pipeline]\nname = "p"\n[[stages]]\nname = "a"\nactor = "pkg.mod:A"\n')
    assert stage_classes([str(pipeline), "--out", "x"]) == ["pkg.mod:A"]


def test_no_classes_where_the_file_cannot_tell(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[[stages]\nactor = ")
    train = tmp_path / "train.toml"
    train.write_text('[train]\nsteps = 2\n[[stages]]\nactor = "pkg.mod:A"\n')
    assert stage_classes([str(broken)]) == []
    assert stage_classes([str(train)]) == [], "a training run starts no pipeline template"
    assert stage_classes([str(tmp_path / "missing.toml")]) == []
    assert stage_classes([str(train), str(broken)]) == []
