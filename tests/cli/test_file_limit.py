"""A low open-files limit: the soft one is raised to the hard one before anything starts, and a
hard one too low for a run is refused in one line, exit 2. Under ``ulimit -Sn 64`` ``troupe run``
printed thirty lines of replicas that could not start, then a traceback; under a hard 32, only
libzmq's abort."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from troupe.runtime.transports.loopback import free_endpoint

BOUND_S = 120.0  # against a hang only
ENTRY = "from troupe.cli.entry import main; main()"
PIPELINE = """
[pipeline]
name = "files"
items = 2

[[stages]]
name = "a"
actor = "troupe.actors.bench.synthetic:CostStage"
kwargs = { cost_s = 0.0 }
"""


def _limited(soft: int, hard: int | None = None) -> Callable[[], None]:
    def limit() -> None:
        _, was = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, was if hard is None else hard))

    return limit


def _run(tmp_path: Path, limit: Callable[[], None]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "files.toml").write_text(PIPELINE, encoding="utf-8")
    args = ["run", "files.toml", "--out", "out", "--endpoint", free_endpoint(), "--master", free_endpoint()]
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # killed with all it started, should it hang
        preexec_fn=limit,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        out, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_low_soft_limit_is_raised_and_the_run_runs(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 256:
        pytest.skip(f"the hard open-files limit here is {hard}: a run needs 256")
    done = _run(tmp_path, _limited(64))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 ok" in done.stdout and "Too many open files" not in done.stderr, done.stderr[-3000:]


def test_a_hard_limit_too_low_is_refused_in_one_line(tmp_path: Path) -> None:
    done = _run(tmp_path, _limited(64, 64))
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip() == (
        "error: this shell allows 64 open files (its hard limit, ulimit -Hn); troupe run needs about 256: "
        "raise it with ulimit -n 1024 (above the hard limit: as root, or in /etc/security/limits.conf)"
    )
    assert not (tmp_path / "out").exists()  # nothing started
