"""A file of the current folder named as a package troupe's processes import (``torch.py``),
which ``PYTHONPATH`` puts ahead of the installed one, is named in one line, exit 2, before
anything starts: it ran in every worker, which failed on an AttributeError deep in troupe. ev 5"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli_session import troupe_in_session
from troupe.runtime.transports.loopback import free_endpoint

REFUSAL_S = 120  # a refusal comes before anything starts; a bound only, should it start after all


@pytest.mark.parametrize("command", ["run", "node"])
def test_a_shadowing_file_of_the_current_folder_is_refused_by_name(tmp_path: Path, command: str) -> None:
    here = tmp_path / "here"
    here.mkdir()
    (here / "torch.py").write_text("print('my experiment')\n")
    if command == "run":
        args = ["run", "--items", "1", "--out", str(tmp_path / "out"), "--master", free_endpoint()]
    else:
        args = ["node", "start", "--logs", str(tmp_path / "out")]
    done = troupe_in_session(
        *args, "--endpoint", free_endpoint(), timeout=REFUSAL_S, cwd=here, env={"PYTHONPATH": str(here)}
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == (
        f"error: ./torch.py in the current folder {here} shadows the installed torch, which troupe's "
        "processes import (the folder is on PYTHONPATH, ahead of the installed packages): rename it\n"
    )
    assert not (tmp_path / "out").exists()
