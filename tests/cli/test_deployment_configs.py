"""The deployment files in configs/ (systemd units, the Slurm script) stay runnable as written.

They are not run here (no systemd, no Slurm), but what they rely on is checked: the script's
shell syntax, the units' stop settings against the node's own stop grace, and that every
option they pass to `troupe` exists, so a renamed flag fails here and not on a cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from troupe.runtime.node.config import NodeConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SBATCH = CONFIGS / "slurm" / "troupe.sbatch"
UNITS = {"node": CONFIGS / "troupe-node.service", "master": CONFIGS / "troupe-master.service"}


def _unit(path: Path) -> dict[str, str]:
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    return dict(ln.split("=", 1) for ln in lines if "=" in ln and not ln.startswith("#"))


def _options(*command: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"},
    )
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"--[a-z][a-z-]*", out.stdout))


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_slurm_script_is_valid_bash() -> None:
    out = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_the_units_stop_gracefully_and_count_a_sigterm_stop_as_success() -> None:
    for name, path in UNITS.items():
        unit = _unit(path)
        assert unit["ExecStart"].split()[1:3] == [name, "start"], unit["ExecStart"]
        assert "--keys" in unit["ExecStart"].split()
        assert unit["SuccessExitStatus"] == "143" and unit["KillMode"] == "mixed"
        assert unit["Restart"] == "on-failure" and unit["RestartPreventExitStatus"] == "2"
        assert float(unit["TimeoutStopSec"]) > NodeConfig().stop_grace_s + 10


def test_every_option_the_deployment_files_pass_exists() -> None:
    used = {
        ("node", "start"): {"--config", "--keys", "--name", "--endpoint", "--master", "--logs"},
        ("master", "start"): {"--journal", "--new", "--endpoint", "--keys", "--logs"},
        ("master", "init"): {"--journal"},
        ("ctl", "submit"): {"--master", "--keys", "--json"},
        ("ctl", "jobs"): {"--master", "--keys", "--json", "--timeout"},
        ("ctl", "dead"): {"--master", "--keys"},
        ("keys", "generate"): {"--operator", "--reader"},
    }
    text = SBATCH.read_text() + "".join(p.read_text() for p in UNITS.values())
    for command, options in used.items():
        assert f"troupe {' '.join(command)}" in text or command == ("keys", "generate")
        missing = options - _options(*command)
        assert not missing, f"troupe {' '.join(command)} has no {sorted(missing)}"


def test_the_master_unit_never_creates_a_journal() -> None:
    """Restarted after its journal was lost (or with its disk not mounted at boot), a master
    started with --new began again on an empty queue that forgot every job."""
    unit = UNITS["master"].read_text()
    assert "--new" not in _unit(UNITS["master"])["ExecStart"].split()
    assert "troupe master init --journal" in unit  # how the journal is made, once
