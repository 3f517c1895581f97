"""An ``--out`` whose name troupe cannot write as UTF-8 is refused in a whole sentence that says
why (finding au 2): a name of UTF-8 bytes, under a locale that reads names as ASCII, was called
"not valid UTF-8", and the advice stopped at "give a path whose name is"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from troupe.cli.preflight import writable_problem

PROBE = "import sys; from pathlib import Path; from troupe.cli.preflight import writable_problem; "
PROBE += "sys.stdout.buffer.write(str(writable_problem(Path(sys.argv[1]), '--out')).encode())"


def test_a_name_of_bytes_no_utf8_reads_is_refused_in_a_whole_sentence(tmp_path: Path) -> None:
    said = writable_problem(tmp_path / os.fsdecode(b"o\xff"), "--out")
    assert said is not None
    assert said.startswith(f"--out {tmp_path}/o\\xff: not valid UTF-8;"), said
    assert said.endswith("give a path whose name is valid UTF-8"), said


def test_a_utf8_name_under_an_ascii_locale_is_refused_naming_the_locale(tmp_path: Path) -> None:
    name = str(tmp_path / "o\u00fc")  # UTF-8 on disk: this process reads names as UTF-8
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, os.fsencode(name)],
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
    )
    said = done.stdout.decode("utf-8", "replace").strip()
    assert said.startswith(f"--out {name}: this process reads file names as ascii"), said
    assert "LC_ALL=C.UTF-8" in said and "not valid UTF-8" not in said, said


def test_a_utf8_name_under_a_utf8_locale_is_no_problem(tmp_path: Path) -> None:
    assert writable_problem(tmp_path / "o\u00fc", "--out") is None
