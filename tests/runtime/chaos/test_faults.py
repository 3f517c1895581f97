"""Fault injection: spec validation, the hook's decisions, and each primitive's real effect."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from structlog.testing import capture_logs

from troupe.runtime.chaos.faults import (
    DROP,
    PROCEED,
    FaultKind,
    FaultPlan,
    FaultSpec,
    StallGate,
    apply_before_handle,
    hang_with_gil,
    slow,
)
from troupe.runtime.errors import ConfigError, FaultInjected


@contextmanager
def python_thread_gaps() -> Iterator[Callable[[], float]]:
    """Run a pure-Python background loop; yield a function giving its longest pause so far."""
    stop = threading.Event()
    longest = [0.0]

    def spin() -> None:
        last = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            longest[0] = max(longest[0], now - last)
            last = now

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield lambda: longest[0]
    finally:
        stop.set()
        thread.join(5.0)


def test_spec_from_dict_fills_defaults() -> None:
    """A minimal dict becomes a spec that applies to every actor and message, every time."""
    spec = FaultSpec.from_dict({"kind": "slow", "seconds": 0.2, "actor": "renderer"})
    assert spec == FaultSpec(FaultKind.SLOW, actor="renderer", seconds=0.2)
    assert spec.matches("renderer", "any") and not spec.matches("planner", "any")
    part = FaultSpec.from_dict({"kind": "partition", "peers": ["tcp://a:1", "tcp://b:2"]})
    assert part.peers == frozenset({"tcp://a:1", "tcp://b:2"})
    assert FaultSpec.from_dict({"kind": "stall"}).seconds is None  # stall until released


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "explode"}, "'kind' must be one of kill, crash, hang_with_gil"),
        ({}, "'kind' must be one of"),
        ({"kind": ["slow"]}, "'kind' must be one of"),
        ({"kind": "slow"}, 'seconds must be a finite number >= 0.*e.g. "seconds": 0.5'),
        ({"kind": "slow", "seconds": -1}, "seconds must be"),
        ({"kind": "hang_with_gil", "seconds": "1"}, "seconds must be"),
        ({"kind": "crash", "seconds": 1}, "field\\(s\\) seconds not allowed for kind 'crash'"),
        ({"kind": "drop", "probabilty": 0.5}, "probabilty not allowed.*allowed: .*probability"),
        ({"kind": "drop", "probability": 1.5}, "'probability' must be a number in \\[0, 1\\]"),
        ({"kind": "drop", "count": -2}, "'count' must be an integer >= 0"),
        ({"kind": "drop", "after": True}, "'after' must be an integer >= 0"),
        ({"kind": "drop", "actor": 3}, "'actor' must be a non-empty string"),
        ({"kind": "partition"}, "a partition needs 'peers'"),
        ({"kind": "partition", "peers": "tcp://a:1"}, "a partition needs 'peers'"),
        ({"kind": "partition", "peers": ["a"], "actor": "x"}, "actor not allowed"),
    ],
)
def test_bad_specs_are_refused_with_a_clear_config_error(spec: dict[str, object], message: str) -> None:
    """Each malformed spec raises ConfigError naming the spec, the field and the fix."""
    with pytest.raises(ConfigError, match=message) as info:
        FaultPlan.from_dicts([{"kind": "crash"}, spec])
    assert str(info.value).startswith("faults[1]")


def test_empty_plan_lets_everything_through() -> None:
    """With no faults the hook proceeds at once and reports nothing."""
    plan = FaultPlan()
    assert not plan.active
    assert apply_before_handle(plan, "a", "m") is PROCEED
    assert plan.statistics().fired_by_kind == {}


def test_crash_raises_fault_injected_only_for_the_selected_actor_and_type() -> None:
    """A crash fault raises FaultInjected for its actor and message type, and nothing else."""
    plan = FaultPlan.from_dicts({"kind": "crash", "actor": "enc", "message_type": "encode"})
    assert apply_before_handle(plan, "other", "encode") is PROCEED
    assert apply_before_handle(plan, "enc", "ping") is PROCEED
    with capture_logs() as logs, pytest.raises(FaultInjected, match="'enc' handling 'encode'"):
        apply_before_handle(plan, "enc", "encode")
    assert logs[0]["event"] == "fault_injected" and logs[0]["kind"] == "crash"
    assert plan.statistics().fired_by_kind == {"crash": 1}


def test_drop_with_after_and_count_loses_exactly_those_messages() -> None:
    """after=2, count=3 lets two messages through, drops three, then lets all through."""
    plan = FaultPlan.from_dicts({"kind": "drop", "after": 2, "count": 3})
    verdicts = [apply_before_handle(plan, "a", "m") for _ in range(8)]
    assert verdicts == [PROCEED] * 2 + [DROP] * 3 + [PROCEED] * 3


def test_drop_probability_is_seeded_and_roughly_right() -> None:
    """A seeded probabilistic drop replays identically and drops about p of the messages."""

    def run(seed: int) -> list[bool]:
        plan = FaultPlan.from_dicts({"kind": "drop", "probability": 0.3}, seed=seed)
        return [apply_before_handle(plan, "a", "m") is DROP for _ in range(2000)]

    first = run(7)
    assert first == run(7) and first != run(8)
    assert 450 < sum(first) < 750


def test_dropped_message_meets_no_later_fault() -> None:
    """When a drop fires, later faults in the plan are not applied to that message."""
    plan = FaultPlan.from_dicts([{"kind": "drop", "count": 1}, {"kind": "crash"}])
    assert apply_before_handle(plan, "a", "m") is DROP
    with pytest.raises(FaultInjected):
        apply_before_handle(plan, "a", "m")


def test_slow_delays_each_message_by_its_seconds() -> None:
    """A slow fault holds each message back for at least its seconds."""
    plan = FaultPlan.from_dicts({"kind": "slow", "seconds": 0.05})
    start = time.monotonic()
    assert apply_before_handle(plan, "a", "m") is PROCEED
    assert apply_before_handle(plan, "a", "m") is PROCEED
    assert time.monotonic() - start >= 0.1
    with pytest.raises(ConfigError):
        slow(-1)


def test_hang_with_gil_freezes_every_python_thread() -> None:
    """During hang_with_gil a background Python thread makes no progress at all."""
    with python_thread_gaps() as longest:
        start = time.monotonic()
        hang_with_gil(0.4)
        elapsed = time.monotonic() - start
        assert longest() >= 0.3
    assert elapsed >= 0.39


def test_stall_blocks_the_caller_but_not_other_python_threads() -> None:
    """A timed stall blocks its caller with the GIL released: other threads keep running."""
    plan = FaultPlan.from_dicts({"kind": "stall", "seconds": 1.0, "count": 1})
    with python_thread_gaps() as longest:
        start = time.monotonic()
        assert apply_before_handle(plan, "a", "m") is PROCEED
        elapsed = time.monotonic() - start
    assert elapsed >= 0.99
    # Holding the GIL would freeze the other thread for the whole stall; measured against the
    # stall itself in the same run, not a fixed bound that a loaded scheduler could overrun.
    assert longest() < 0.5 * elapsed
    assert apply_before_handle(plan, "a", "m") is PROCEED  # count=1: the second one passes


def test_untimed_stall_lasts_until_released() -> None:
    """A stall without seconds holds its handler until release_stalls(), then lets all pass."""
    plan = FaultPlan.from_dicts({"kind": "stall", "actor": "a"})
    done = threading.Event()

    def handler() -> None:
        apply_before_handle(plan, "a", "m")
        done.set()

    thread = threading.Thread(target=handler, daemon=True)
    thread.start()
    assert not done.wait(0.1)  # the gate is closed, so this can only time out
    plan.release_stalls()
    assert done.wait(5.0)
    thread.join(5.0)
    assert apply_before_handle(plan, "a", "m") is PROCEED  # open for good
    assert plan.statistics().stalls_released


def test_stall_gate_times_out_while_closed_and_release_is_idempotent() -> None:
    """A closed gate's wait returns False after its timeout; release twice is harmless."""
    gate = StallGate()
    assert gate.wait(0.01) is False
    gate.release()
    gate.release()
    assert gate.wait(0.0) is True and gate.wait(None) is True


def test_partition_is_a_flag_for_the_transport() -> None:
    """A partition marks its peers as cut off until heal(); it never affects handlers."""
    plan = FaultPlan.from_dicts({"kind": "partition", "peers": ["tcp://10.0.0.2:5600"]})
    assert plan.is_partitioned("tcp://10.0.0.2:5600")
    assert not plan.is_partitioned("tcp://10.0.0.3:5600")
    assert not plan.active and apply_before_handle(plan, "a", "m") is PROCEED
    plan.heal()
    assert not plan.is_partitioned("tcp://10.0.0.2:5600")
    assert plan.statistics().partitioned_peers == frozenset()


def test_kill_fault_sigkills_the_process() -> None:
    """A kill fault ends the process with SIGKILL at the matching message, not before."""
    script = textwrap.dedent(
        """
        from troupe.runtime.chaos.faults import FaultPlan, apply_before_handle
        plan = FaultPlan.from_dicts({"kind": "kill", "after": 1})
        apply_before_handle(plan, "a", "m")
        print("survived first", flush=True)
        apply_before_handle(plan, "a", "m")
        print("survived second", flush=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == -signal.SIGKILL
    assert "survived first" in result.stdout and "survived second" not in result.stdout
