"""troupe in a program that set up no logging keeps its log lines off the program's stdout.

structlog, unconfigured, prints every line to stdout: a program that printed JSON there, and
used troupe's master or runtime in its process, had troupe's info lines in the middle of it.
troupe routes structlog through the standard library then (warnings on stderr, info silent);
a program that configured structlog, before or after importing troupe, keeps its own. Each case
runs in a fresh interpreter: it is what importing troupe does.
"""

from __future__ import annotations

import subprocess
import sys

TROUPE_LINES = """
import structlog
log = structlog.get_logger("troupe.runtime.tasks.master.master")
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


def test_a_program_that_configured_structlog_keeps_its_configuration() -> None:
    mine = (
        "import structlog\n"
        "structlog.configure(processors=[structlog.processors.KeyValueRenderer()],"
        " logger_factory=structlog.PrintLoggerFactory())\n"
    )
    for source in (mine + "from troupe import connect\n", "from troupe import connect\n" + mine):
        done = _run(source + TROUPE_LINES)
        assert done.returncode == 0, done.stderr
        assert "event='master_started'" in done.stdout and "event='master_beat_failed'" in done.stdout
