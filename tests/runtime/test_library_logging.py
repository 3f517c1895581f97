"""troupe in a program's process leaves the program's logging as it set it up (ap 7).

Importing troupe configured structlog for the whole process: a program on structlog's defaults
lost its info lines, and its warnings came out as JSON on stderr. troupe now configures nothing
there: its own lines go to the standard library's loggers under ``troupe`` (the program's
handlers and levels decide; none: warnings on stderr, info silent, nothing on stdout), and the
program's structlog is the program's, configured or not. Each case runs in a fresh interpreter:
it is what importing troupe does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TROUPE_LINES = """
from troupe.runtime.library_logging import get_logger
log = get_logger("troupe.runtime.tasks.master.master")  # what the master's module logs with
log.info("master_started", endpoint="mem://m")
log.warning("master_beat_failed", master="mem://m")
print('{"program": "output"}')
"""


def _run(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)


def test_a_program_that_set_up_no_logging_gets_only_its_own_stdout() -> None:
    done = _run("from troupe import connect\n" + TROUPE_LINES)  # what a program imports
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"program": "output"}\n'  # no info line in the program's output
    assert "master_beat_failed" in done.stderr and "master_started" not in done.stderr


def test_a_program_on_structlogs_defaults_keeps_them() -> None:
    done = _run(
        "import structlog\n"
        "log = structlog.get_logger('myapp')\n"
        "log.info('before troupe')\n"
        "from troupe import connect, run_pipeline_sync\n"
        "log.info('after the import')\n"
        "structlog.get_logger('myapp').warning('a warning')\n"
        "print('configured', structlog.is_configured())\n"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()  # structlog's default: readable lines on stdout, info included
    assert [line.split("] ")[-1].strip() for line in lines[:3]] == [
        "before troupe",
        "after the import",
        "a warning",
    ]
    assert "[info     ]" in lines[1] and "[warning  ]" in lines[2]
    assert lines[3] == "configured False" and done.stderr == ""


def test_a_program_that_configured_structlog_keeps_its_configuration() -> None:
    mine = (
        "import structlog\n"
        "structlog.configure(processors=[structlog.processors.KeyValueRenderer()],"
        " logger_factory=structlog.PrintLoggerFactory())\n"
        "kept = structlog.get_config()\n"
        "structlog.get_logger('myapp').info('mine')\n"
    )
    for source in (mine + "from troupe import connect\n", "from troupe import connect\n" + mine):
        done = _run(source + TROUPE_LINES + "assert structlog.get_config() == kept\n")
        assert done.returncode == 0, done.stderr
        assert done.stdout == "event='mine'\n" + '{"program": "output"}\n'
        assert "master_beat_failed" in done.stderr  # troupe's through the standard library


def test_troupes_lines_reach_the_programs_handlers_named_by_their_module_and_line() -> None:
    done = _run(
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout,"
        " format='%(name)s %(filename)s:%(lineno)d %(levelname)s %(message)s')\n"
        "from troupe.runtime.library_logging import get_logger\n"
        "log = get_logger('troupe.runtime.tasks.master.master')\n"
        "log.info('master_started', endpoint='mem://m')\n"
        "log.bind(job='j1').warning('job_held')\n"
        "print(type(logging.getLogger('myapp')).__name__)\n"
    )
    assert done.returncode == 0, done.stderr
    started, held, logger_class = done.stdout.splitlines()
    assert started.startswith("troupe.runtime.tasks.master.master <string>:5 INFO {")
    assert '"event": "master_started"' in started and '"endpoint": "mem://m"' in started
    assert (
        held.startswith("troupe.runtime.tasks.master.master <string>:6 WARNING {") and '"job": "j1"' in held
    )
    assert logger_class == "Logger"  # the program's loggers are the standard library's own


def test_every_module_of_troupe_takes_its_logger_from_get_logger() -> None:
    """structlog's own logger in a module of troupe would put its lines on a program's structlog
    (on stdout, with its defaults) and leave them out of a run's file."""
    taken = re.compile(r"structlog\.(?:stdlib\.)?get_logger\(")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("src", "tools")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "library_logging.py"  # the factory itself
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if taken.search(line)
    ]
    assert found == [], "use troupe.runtime.library_logging.get_logger(__name__)"
