"""A module whose import waits for a gate file (``$TROUPE_TEST_GATE``), as torch's import takes
a second: what a template still imports while its light sibling serves. Bounded: an import
never waits past ``WAIT_S``."""

from __future__ import annotations

import os
import time
from pathlib import Path

WAIT_S = 120.0  # a bound on the test's gate, not on speed

_gate = os.environ.get("TROUPE_TEST_GATE")
if _gate:
    _deadline = time.monotonic() + WAIT_S
    while not Path(_gate).exists() and time.monotonic() < _deadline:
        time.sleep(0.01)
