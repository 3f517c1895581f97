"""configs/slurm/troupe.sbatch, run with stand-ins for Slurm's commands (one host: ``srun`` runs
its command here, ``scontrol`` and ``getent`` name this host on loopback): a master that dies
while the job runs ends the script, non-zero, saying so. It looped until the allocation's time
limit (hours of hosts held for nothing), with a Python traceback every turn."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from troupe.runtime.testing.plugin import reap

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("bash") is None, reason="no bash"),
]

SBATCH = Path(__file__).resolve().parents[2] / "configs" / "slurm" / "troupe.sbatch"
WAIT_S = 180  # bounds on polls of a condition, never on speed
STANDS_IN = {
    "srun": '#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\nexec "$@"\n',
    "scontrol": "#!/bin/bash\necho localhost\n",
    "getent": '#!/bin/bash\necho "127.0.0.1       STREAM $2"\n',
}
JOB = '[job]\nname = "long"\nkind = "sleep"\ncount = 100000\n'  # runs for many minutes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _master_of(script: psutil.Process) -> psutil.Process:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for child in script.children(recursive=True):
            try:
                if "master" in child.cmdline() and "start" in child.cmdline():
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.1)
    raise AssertionError("the script started no master")


def test_a_master_that_dies_ends_the_script(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STANDS_IN.items():
        (bin_dir / name).write_text(text, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    keys = tmp_path / "keys"
    troupe = [sys.executable, "-m", "troupe.cli.main"]
    subprocess.run([*troupe, "keys", "generate", str(keys)], check=True, capture_output=True, timeout=120)
    (tmp_path / "job.toml").write_text(JOB, encoding="utf-8")
    node = (SBATCH.parent / "node.toml").read_text(encoding="utf-8")
    (tmp_path / "node.toml").write_text(node.replace('"outputs"', f'"{tmp_path / "out"}"'), encoding="utf-8")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_ID": "7",
        "TROUPE_KEYS": str(keys),
        "TROUPE_NODE_CONFIG": str(tmp_path / "node.toml"),
        "TROUPE_RUN_DIR": str(tmp_path / "run"),
        "TROUPE_MASTER_PORT": str(_free_port()),
        "TROUPE_NODE_PORT": str(_free_port()),
    }
    output = tmp_path / "script.out"
    with open(output, "wb") as out:
        script = subprocess.Popen(
            ["bash", str(SBATCH), str(tmp_path / "job.toml")],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started: list[psutil.Process] = []
    try:
        master = _master_of(psutil.Process(script.pid))
        deadline = time.monotonic() + WAIT_S
        while b"submitted long" not in output.read_bytes():
            assert script.poll() is None, output.read_text()
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.1)
        started = psutil.Process(script.pid).children(recursive=True)
        master.send_signal(signal.SIGKILL)
        code = script.wait(timeout=WAIT_S)
    finally:
        survivors = reap(script, started)  # type: ignore[arg-type]
    said = output.read_text()
    assert code != 0, said
    assert f"the master (pid {master.pid}) exited" in said, said
    assert "Traceback" not in said, said
    assert not survivors, survivors
