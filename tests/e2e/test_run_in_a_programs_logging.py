"""``run_pipeline_sync`` in a program that set up its own logging leaves that logging alone (ap 2).

The run set the program's root handlers aside for its whole length: the program's own lines (its
callbacks', its threads') went into ``out/logs/local.jsonl`` stamped ``process: run`` and not to
its handlers; and in a program that had configured structlog the run's own lines were not in
that file at all. Now the program's handler gets its own lines, and troupe's, all along; the
file holds the run's lines and none of the program's, whichever logging the program set up.
The pipeline is docs/examples/own_pipeline, with a few items.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support.processes import kill_all_in, start_script

pytestmark = pytest.mark.e2e

HANG_GUARD_S = 240  # only so a regression cannot hang the suite; nothing here measures speed
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "own_pipeline"

STDLIB = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="USERLOG %(name)s %(message)s", stream=sys.stderr)
log = logging.getLogger("myapp")
say = log.warning
"""

STRUCTLOG = """
import structlog
structlog.configure(
    processors=[structlog.processors.KeyValueRenderer(key_order=["event"])],
    logger_factory=structlog.PrintLoggerFactory(),
)
say = structlog.get_logger("myapp").warning
"""

RUN = """
from troupe import run_pipeline_sync

if __name__ == "__main__":
    say("before the run")
    result = run_pipeline_sync(
        "pipeline.toml", out="out", items=4, on_start=lambda start: say("the run started")
    )
    say("after the run %s" % sorted(result.counts().items()))
"""


def _run_program(tmp_path: Path, logging_setup: str) -> tuple[str, str, list[dict[str, object]]]:
    shutil.copytree(EXAMPLE, tmp_path, dirs_exist_ok=True)
    (tmp_path / "program.py").write_text(logging_setup + RUN, encoding="utf-8")
    proc = start_script(tmp_path, "program.py")
    try:
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        kill_all_in(tmp_path, proc)
    assert proc.returncode == 0, err[-3000:]
    lines = (tmp_path / "out" / "logs" / "local.jsonl").read_text(encoding="utf-8").splitlines()
    return out, err, [json.loads(line) for line in lines]


def _the_programs(events: list[dict[str, object]]) -> list[object]:
    return [e["event"] for e in events if "run" in str(e["event"]) or e.get("logger") == "myapp"]


def test_a_program_with_a_root_handler_keeps_it_through_the_run(tmp_path: Path) -> None:
    out, err, events = _run_program(tmp_path, STDLIB)
    said = err.splitlines()
    for line in ("before the run", "the run started", "after the run [('dead', 0)"):
        assert any(s.startswith(f"USERLOG myapp {line}") for s in said), err[-3000:]
    troupes = [s for s in said if s.startswith("USERLOG troupe.")]  # its modules' loggers
    assert any('"event": "replica_placed"' in s for s in troupes), err[-3000:]
    run_lines = [e for e in events if e["process"] == "run"]
    assert any(e["event"] == "replica_placed" for e in run_lines), events
    assert _the_programs(events) == []
    assert out == ""


def test_a_program_that_configured_structlog_gets_the_runs_lines_in_the_file(tmp_path: Path) -> None:
    out, _, events = _run_program(tmp_path, STRUCTLOG)
    said = out.splitlines()
    assert said[:2] == ["event='before the run'", "event='the run started'"], out
    assert said[2].startswith("event=\"after the run [('dead', 0)"), out
    assert len(said) == 3  # troupe's lines are not on the program's structlog
    assert any(e["event"] == "replica_placed" and e["process"] == "run" for e in events), events
    assert _the_programs(events) == []
