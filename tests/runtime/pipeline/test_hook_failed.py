"""A stage hook that raised, or whose replica ended in it: the run's error says where its
traceback is (the run's log, which had none), or why a replica ends in a hook."""

from __future__ import annotations

from structlog.testing import capture_logs

from troupe.runtime.errors import PeerLost, RemoteError
from troupe.runtime.pipeline.hook_calls import _hook_failed

TRACEBACK = 'Traceback (most recent call last):\n  File "stages.py", line 9, in finalize\nRuntimeError: no\n'


def test_a_hook_that_raised_leaves_its_traceback_in_the_run_log() -> None:
    raised = RemoteError("builtins.RuntimeError", "no", TRACEBACK, "local/p-sink-1/stage")
    with capture_logs() as logs:
        failed = _hook_failed("sink", "finalize", raised)
    said = str(failed)
    assert said.startswith("stage sink: finalize failed: builtins.RuntimeError: no")
    assert "the run log's stage_hook_failed line" in said
    assert [(e["event"], e["stage"], e["hook"], e["traceback"]) for e in logs] == [
        ("stage_hook_failed", "sink", "finalize", TRACEBACK)
    ]


def test_a_replica_that_ended_in_its_hook_is_said_with_the_likely_cause() -> None:
    lost = PeerLost("ask 'stage_start' to local/p-gen-0/stage: the connection ended before the reply came")
    said = str(_hook_failed("gen", "start", lost))
    assert "the replica's process ended in its start hook" in said
    assert "progress_timeout_s" in said and "self.progress()" in said
