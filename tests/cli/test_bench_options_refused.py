"""`troupe bench` refuses a bad option in one line, exit 2, before it measures anything: a
--median-ms that is nan (a 70-line traceback), inf or 1e300 (a hang), negative (an efficiency
below 0) or 0 (silently the default); a count past its upper bound (--repeat 1000000000 ran
as long); a scale past its bounds (it printed nothing for seconds, then
started a simulator process per 250 workers); a --synthetic below 1 (a traceback after a minute of measuring);
a heartbeat --interval or --timeout that is not a positive number, or a timeout not above the
interval (pydantic's traceback)."""

from __future__ import annotations

import pytest

from support.cli_session import troupe_in_session

_MS = "a number of milliseconds above 0 and at most 60,000"
_S = "a number of seconds above 0 and at most 60"
REFUSAL_S = 60  # a refusal comes before anything is measured; a bound only, should it measure after all


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["scale", "--median-ms", "nan"], f"error: --median-ms must be {_MS}, got nan"),
        (["scale", "--median-ms", "inf"], f"error: --median-ms must be {_MS}, got inf"),
        (["scale", "--median-ms", "-5"], f"error: --median-ms must be {_MS}, got -5.0"),
        (["scale", "--median-ms", "0"], f"error: --median-ms must be {_MS}, got 0.0"),
        (["scale", "--median-ms", "1e300"], f"error: --median-ms must be {_MS}, got 1e+300"),  # ran for good
        (["scale", "--median-ms", "60001"], f"error: --median-ms must be {_MS}, got 60001.0"),
        (["pipeline", "--synthetic", "0"], "--synthetic"),
        (["scale", "--workers", "100000000", "--tasks", "1"], "--workers"),  # 400,000 processes
        (["scale", "--workers", "5000", "--tasks", "5000"], "is 25,000,000 tasks; at most 10,000,000"),
        (["recovery", "--interval", "0"], f"error: --interval must be {_S}, got 0.0"),
        (["recovery", "--timeout", "nan"], f"error: --timeout must be {_S}, got nan"),
        (["recovery", "--timeout", "1e9"], f"error: --timeout must be {_S}, got 1000000000.0"),
        # Every count has an upper bound too: a billion rounds ran as long as a huge median.
        (["messaging", "--repeat", "101"], "--repeat"),
        (["pipeline", "--scenes", "10001"], "--scenes"),
        (["pipeline", "--synthetic", "1000001"], "--synthetic"),
        (["pipeline", "--cpu", "100001"], "--cpu"),
        (["train", "--steps", "100001"], "--steps"),
        (["train", "--inflight", "65"], "--inflight"),
        (["train", "--actors", "65"], "--actors"),
        (["train", "--repeat", "101"], "--repeat"),
        (["train", "--group-size", "1025"], "--group-size"),
        (["recovery", "--repeat", "101"], "--repeat"),
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
