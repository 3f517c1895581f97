"""The messaging benchmark's Source runs a whole measurement in one handler: it reports
progress as it goes, so a run longer than its worker's progress timeout (a slow or busy
machine, CURVE) is not killed as hung mid-measurement."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from troupe.runtime.testing import plugin as troupe_testing
from troupe.runtime.testing.plugin import Cluster

pytestmark = pytest.mark.e2e

troupe_cluster = troupe_testing.troupe_cluster

# Short enough that a measurement outlasts it soon; not so short that a worker starved of CPU
# for half a second by a loaded machine (CI beside other runs) is taken for hung.
PROGRESS_S = 1.5
CONFIG = f"""
[supervision]
interval_s = 0.1
heartbeat_timeout_s = 5
progress_timeout_s = {PROGRESS_S}

[[workers]]
name = "src"
actors = [{{ name = "source", class = "troupe.cli.bench.actors:Source" }}]

[[workers]]
name = "dst"
actors = [{{ name = "sink", class = "troupe.cli.bench.actors:Sink" }}]
"""
RUN_S = 4 * PROGRESS_S  # the last run lasts at least this long


@pytest.mark.parametrize("request_type", ["asks", "tells"])
async def test_a_run_longer_than_the_progress_timeout_is_not_killed(
    troupe_cluster: Any, request_type: str
) -> None:
    cluster: Cluster = troupe_cluster(CONFIG, "bench-progress")
    async with cluster.client() as rt:
        source = rt.ref("src/source")
        spec = {"target": "dst/sink", "kind": "small", "window": 1}
        n, took = 1024, 0.0
        with anyio.fail_after(300):  # a bound on a hang, not on speed
            while took < RUN_S:  # longer runs until one lasts RUN_S, however fast the machine
                n *= 4
                t0 = time.monotonic()
                assert await source.ask(request_type, {**spec, "n": n}, timeout=600) > 0
                took = time.monotonic() - t0
    status = await cluster.status()
    assert status["supervision"]["kills"] == {}, status["supervision"]["kills"]


@pytest.mark.parametrize("request_type", ["asks", "tells"])
async def test_a_sink_that_answers_late_does_not_get_its_source_killed(
    troupe_cluster: Any, request_type: str
) -> None:
    """A sink starved of CPU (a loaded machine) answered the source's first ask two progress timeouts
    late: the source, waiting on it with no message sent, was killed as making no progress ("PeerLost:
    ask 'tells' to bench-progress/src/source: ... its process died"). It says progress while it waits."""
    config = CONFIG.replace("troupe.cli.bench.actors:Sink", "support.slow_sink:SlowSink")
    cluster: Cluster = troupe_cluster(config, "bench-late-sink")
    async with cluster.client() as rt:
        spec = {"target": "dst/sink", "kind": "small", "window": 1, "n": 64}
        with anyio.fail_after(300):  # a bound on a hang, not on speed
            assert await rt.ref("src/source").ask(request_type, spec, timeout=600) > 0
    status = await cluster.status()
    assert status["supervision"]["kills"] == {}, status["supervision"]["kills"]
