"""A path the output's encoding cannot carry (an umlaut under ``PYTHONIOENCODING=ascii``) is
printed escaped, and the command ends as it would have: it ended in a UnicodeEncodeError
traceback, ``troupe run`` after its run had finished."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BOUND_S = 120  # against a hang only


def test_a_command_printing_a_non_ascii_path_to_an_ascii_stdout_escapes_it(tmp_path: Path) -> None:
    where = tmp_path / "schlüssel"
    done = subprocess.run(
        [sys.executable, "-m", "troupe.cli.main", "keys", "generate", str(where)],
        capture_output=True,
        timeout=BOUND_S,
        env={**os.environ, "PYTHONIOENCODING": "ascii", "COLUMNS": "200"},
        check=False,
    )
    out, err = done.stdout.decode("ascii"), done.stderr.decode("ascii")
    assert done.returncode == 0 and "Traceback" not in err, err
    assert f"wrote {tmp_path}/schl\\xfcssel/cluster.key_secret" in out, out
    assert (where / "cluster.key_secret").is_file()
