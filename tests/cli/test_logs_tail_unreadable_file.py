"""`troupe logs tail --logs`: a log file it cannot read (a directory in its place) is said in one line,
and the other files are followed on (it was a traceback, exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_logs_tail_skips_a_directory_among_the_logs_in_one_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "bad.jsonl").mkdir()
    (logs / "n1.jsonl").write_text('{"timestamp": "2026-01-01T00:00:01Z", "event": "kept"}\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "troupe.cli.main",
            "logs",
            "tail",
            "--logs",
            str(logs),
            "--no-follow",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert out.returncode == 0, out.stderr
    assert '"kept"' in out.stdout
    assert "Traceback" not in out.stderr
    assert (
        out.stderr.count("\n") == 1 and "cannot read the log file" in out.stderr and "bad.jsonl" in out.stderr
    )
