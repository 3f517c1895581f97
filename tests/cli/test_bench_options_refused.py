"""`troupe bench` refuses a bad option in one line, exit 2, before it measures anything: a
--median-ms that is nan (a 70-line traceback), inf (a hang), negative (an efficiency below 0)
or 0 (silently the default); a scale past its bounds (it printed nothing for seconds, then
started a simulator process per 250 workers); a --synthetic below 1 (a traceback after a minute of measuring);
a heartbeat --interval or --timeout that is not a positive number, or a timeout not above the
interval (pydantic's traceback)."""

from __future__ import annotations

import pytest

from support.cli_session import troupe_in_session

REFUSAL_S = 60  # a refusal comes before anything is measured; a bound only, should it measure after all


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["scale", "--median-ms", "nan"], "error: --median-ms must be a number of milliseconds > 0, got nan"),
        (["scale", "--median-ms", "inf"], "error: --median-ms must be a number of milliseconds > 0, got inf"),
        (["scale", "--median-ms", "-5"], "error: --median-ms must be a number of milliseconds > 0, got -5.0"),
        (["scale", "--median-ms", "0"], "error: --median-ms must be a number of milliseconds > 0, got 0.0"),
        (["pipeline", "--synthetic", "0"], "--synthetic"),
        (["scale", "--workers", "100000000", "--tasks", "1"], "--workers"),  # 400,000 processes
        (["scale", "--workers", "5000", "--tasks", "5000"], "is 25,000,000 tasks; at most 10,000,000"),
        (["recovery", "--interval", "0"], "error: --interval must be a number of seconds > 0, got 0.0"),
        (["recovery", "--timeout", "nan"], "error: --timeout must be a number of seconds > 0, got nan"),
        (
            ["recovery", "--interval", "1", "--timeout", "0.5"],
            "error: --interval 1 / --timeout 0.5: heartbeat_timeout_s must be greater than interval_s",
        ),
    ],
)
def test_a_bad_bench_option_is_refused_before_measuring(args: list[str], said: str) -> None:
    done = troupe_in_session("bench", *args, "--json", timeout=REFUSAL_S)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
