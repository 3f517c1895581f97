"""Every log line is strict JSON: a NaN or an infinity is written as a string (report ob 6: a
line with ``NaN`` was refused by JavaScript, Go's encoding/json and the log shippers built on it).

The lines are written by a real process (configuring logging here would change this test
process's logging for the tests after it), then read back refusing anything but JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from troupe.runtime.log_json import strict_json

_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import structlog
    from troupe.runtime.logs import configure_logging

    configure_logging("n1", "w1", Path(sys.argv[1]), console=False)
    structlog.get_logger("probe").info(
        "custom_metric", value=float("nan"), inf=float("inf"), nested={"low": [float("-inf"), 1.5]}
    )
    """
)


def _refuse(constant: str) -> Any:
    raise ValueError(f"not JSON: {constant}")


def test_a_nan_or_an_infinity_is_written_as_a_string(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr
    (line,) = (tmp_path / "n1.jsonl").read_text().splitlines()
    rec = json.loads(line, parse_constant=_refuse)
    assert (rec["value"], rec["inf"], rec["nested"]) == ("NaN", "Infinity", {"low": ["-Infinity", 1.5]})


def test_a_line_without_them_is_written_as_json_writes_it() -> None:
    rec = {"event": "e", "x": 1.5, "ok": True, "names": ["a", "b"]}
    assert strict_json(rec) == json.dumps(rec)
