"""`troupe logs tail`'s readable form keeps a record on its line, and shows an exception as a
traceback (report ob 4: a newline in an error text started a line of its own, which could pass
for a record; ``log.exception``'s record was a Python repr of frame dicts with their locals)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from troupe.cli.log_filters import format_line, readable

FORGED = "2026-12-06T22:00:00Z critical n1 node node_stopped"


def _rec(**fields: object) -> str:
    base = {"timestamp": "2026-01-01T00:00:01Z", "level": "warning", "node": "n1", "event": "e"}
    return json.dumps({**base, **fields})


def test_a_newline_in_a_value_does_not_start_a_line() -> None:
    text = format_line(_rec(error=f"boom\n{FORGED}", **{"odd\nkey": "v\r"}))
    assert "\n" not in text and "\r" not in text
    assert text.endswith(f"error=boom\\n{FORGED} odd\\nkey=v\\r")
    assert "\n" not in readable(_rec(event=f"e\n{FORGED}")).plain


def test_a_traceback_follows_its_record_indented() -> None:
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\nRuntimeError: boom\n' + FORGED
    first, *rest = format_line(_rec(traceback=tb, task_id="t1")).split("\n")
    assert first.endswith("e task_id=t1")
    assert rest[0] == "    Traceback (most recent call last):"
    assert all(line.startswith("    ") for line in rest) and rest[-1] == "    " + FORGED


def test_an_exception_s_frames_are_shown_as_a_traceback() -> None:
    stacks = [
        {
            "exc_type": "ValueError",
            "exc_value": "bad",
            "exc_notes": [],
            "is_cause": False,
            "frames": [{"filename": "s.py", "lineno": 9, "name": "process", "locals": {"item": "secret"}}],
        },
        {
            "exc_type": "ZeroDivisionError",
            "exc_value": "division by zero",
            "is_cause": True,
            "frames": [{"filename": "s.py", "lineno": 7, "name": "ratio"}],
        },
    ]
    first, *rest = format_line(_rec(event="caught", exception=stacks)).split("\n")
    assert first.endswith("caught")
    assert [line.removeprefix("    ") for line in rest] == [
        "Traceback (most recent call last):",
        '  File "s.py", line 7, in ratio',
        "ZeroDivisionError: division by zero",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "s.py", line 9, in process',
        "ValueError: bad",
    ]


_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import structlog
    from troupe.runtime.logs import configure_logging

    configure_logging("n1", "w1", Path(sys.argv[1]), console=False)
    def process(item):
        return 1 / 0
    try:
        process({"payload": "item-payload-secret"})
    except ZeroDivisionError:
        structlog.get_logger("probe").exception("caught_and_logged")
    """
)


def test_a_logged_exception_keeps_no_frame_locals(tmp_path: Path) -> None:
    """Locals put an item's payload (and objects' reprs) into the log."""
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr
    (line,) = (tmp_path / "n1.jsonl").read_text().splitlines()
    assert "item-payload-secret" not in line
    (stack,) = json.loads(line)["exception"]
    assert stack["exc_type"] == "ZeroDivisionError" and stack["frames"][-1]["name"] == "process"
    assert "ZeroDivisionError: division by zero" in format_line(line)
