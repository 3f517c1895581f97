"""The heartbeat monitor, driven with explicit times."""

from __future__ import annotations

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.supervision.liveness import (
    Beat,
    Kill,
    KillReason,
    LivenessEvent,
    LivenessMonitor,
    LivenessPolicy,
    Register,
    Resumed,
    SuspectBeat,
    Tick,
    Unregister,
    reorder_window,
)
from troupe.runtime.supervision.status import StatusSnapshot, WorkerState

Timeline = list[tuple[float, LivenessEvent]]

POLICY = LivenessPolicy(interval_s=0.5, heartbeat_timeout_s=3.0, progress_timeout_s=30.0)


class Worker:
    """Builds the beats of one worker incarnation, with increasing seq numbers."""

    def __init__(self, worker_id: str = "w1", pid: int = 100) -> None:
        self.worker_id, self.pid = worker_id, pid
        self.seq = 0
        self.handled = 0
        self.progress = 0

    def beat(
        self, state: WorkerState = WorkerState.BUSY, *, pid: int | None = None, backlog: int = 0
    ) -> Beat:
        self.seq += 1
        return Beat(
            StatusSnapshot(
                self.worker_id,
                self.pid if pid is None else pid,
                state,
                "work" if state is WorkerState.BUSY else None,
                self.handled,
                self.progress,
                None,
                self.seq,
                backlog,
            )
        )


def run(monitor: LivenessMonitor, events: Timeline) -> list[tuple[float, Kill]]:
    """Feed (time, event) pairs in order; return each kill with the time it was made."""
    kills = []
    for now, event in events:
        kills += [(now, k) for k in monitor.handle(event, now)]
    return kills


def ticks(start: float, stop: float, step: float = 0.5) -> Timeline:
    n = round((stop - start) / step)
    return [(start + i * step, Tick()) for i in range(n + 1)]


def registered(w: Worker, kind: str = "k", policy: LivenessPolicy = POLICY) -> LivenessMonitor:
    monitor = LivenessMonitor({kind: policy})
    monitor.handle(Register(w.worker_id, w.pid, kind), 0.0)
    return monitor


@pytest.mark.parametrize("offset", [0.0, 0.13, 0.37, 0.49])
def test_hung_worker_is_killed_within_timeout_plus_one_interval(offset: float) -> None:
    """A worker whose beats stop at t is killed by t + heartbeat_timeout + interval (inv. 5)."""
    w = Worker()
    monitor = registered(w)
    last_beat = 2.0 + offset
    events = [(t, w.beat()) for t in (0.5, 1.0, 1.5, 2.0)] + [(last_beat, w.beat())]
    kills = run(monitor, events + ticks(2.5, 10.0))
    [(when, kill)] = kills
    assert last_beat + 3.0 <= when <= last_beat + 3.0 + 0.5
    assert (kill.worker_id, kill.pid, kill.reason) == ("w1", 100, KillReason.NO_HEARTBEAT)
    assert kill.reason == "no_heartbeat"
    assert kill.last_status is not None and kill.last_status.seq == w.seq
    assert kill.silent_s >= 3.0


def test_worker_that_never_beats_is_killed_after_the_startup_timeout() -> None:
    """A registered worker that never sends a beat is killed once the startup timeout passes."""
    w = Worker()
    slow_start = LivenessPolicy(heartbeat_timeout_s=3.0, startup_timeout_s=20.0)
    assert run(registered(w, policy=slow_start), ticks(0.0, 19.5)) == []
    [(when, kill)] = run(registered(w, policy=slow_start), ticks(0.0, 25.0))
    assert when == 20.0 and kill.last_status is None
    [(when, _)] = run(registered(w), ticks(0.0, 10.0))
    assert when == 3.0


# rs 3: the whole node stopped at 10.2 (its supervisor with it) and continued at 18.2; the
# supervisor's tick planned for 10.5 came at 18.2, and no worker had beaten since the resume.
PAUSED_AT, RESUMED_AT = 10.2, 18.2


def _paused_node() -> tuple[LivenessMonitor, Worker, Timeline]:
    """A monitor whose idle worker beat and was ticked every half second up to the pause, the
    worker, and the events of the resume: the gap since the last tick, said by the driver, and
    the late tick."""
    w = Worker()
    monitor = registered(w)
    before: Timeline = []
    for i in range(1, 21):
        before += [(i * 0.5, w.beat(WorkerState.IDLE)), (i * 0.5, Tick())]
    assert run(monitor, before) == []
    return monitor, w, [(RESUMED_AT, Resumed(RESUMED_AT - 10.0)), (RESUMED_AT, Tick())]


def test_a_paused_node_kills_no_healthy_worker_on_its_resume() -> None:
    """The silence of a whole paused node, its supervisor included, is nobody's: a worker that
    beats again after the resume is not killed, though it went 8 s without a beat."""
    monitor, w, resume = _paused_node()
    after: Timeline = []
    for i in range(1, 20):
        now = RESUMED_AT + 0.1 + i * 0.5
        after += [(now, w.beat(WorkerState.IDLE)), (now, Tick())]
    assert run(monitor, resume + after) == []
    assert monitor.resume_after_s == 1.5  # half the 3 s heartbeat timeout


def test_a_worker_silent_after_the_resume_is_killed_one_timeout_later() -> None:
    """A worker that stays silent once its node is continued is hung after all: killed one
    heartbeat timeout after the resume, its silence counted as the supervisor heard it."""
    monitor, _, resume = _paused_node()
    [(when, kill)] = run(monitor, resume + ticks(RESUMED_AT + 0.5, RESUMED_AT + 10.0))
    assert kill.reason is KillReason.NO_HEARTBEAT
    assert when == RESUMED_AT + 3.0
    assert kill.silent_s == 3.0  # the 8 s of pause are not counted


def test_a_pause_does_not_count_against_a_busy_workers_progress() -> None:
    """The progress clock moves on by the gap too: a worker busy without progress 25 s before
    the pause has 5 s left after it, and is killed for no_progress only then."""
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 51):  # busy, no progress, from 0.5 to 25.0
        events += [(i * 0.5, w.beat()), (i * 0.5, Tick())]
    events += [(40.0, Resumed(15.0)), (40.0, Tick())]
    for i in range(1, 40):
        events += [(40.0 + i * 0.5, w.beat()), (40.0 + i * 0.5, Tick())]
    [(when, kill)] = run(monitor, events)
    assert kill.reason is KillReason.NO_PROGRESS
    assert when == 45.5  # 30 s busy without progress, as heard: 0.5-25.0, then 40.0-45.5


def test_slow_but_progressing_worker_is_never_killed() -> None:
    """A busy worker that makes progress just inside the progress timeout lives for ever."""
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 1001):
        now = i * 0.5
        if i % 58 == 0:  # progress every 29 s, under the 30 s timeout
            w.progress += 1
        events += [(now, w.beat()), (now, Tick())]
    assert run(monitor, events) == []


def test_busy_worker_without_progress_is_killed_for_no_progress() -> None:
    """Beats that keep coming without progress while busy end in a no_progress kill."""
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 200):
        events += [(i * 0.5, w.beat()), (i * 0.5, Tick())]
    [(when, kill)] = run(monitor, events)
    assert kill.reason is KillReason.NO_PROGRESS
    assert when == 30.5  # first beat at 0.5 starts the clock
    assert kill.silent_s == 30.0


def test_idle_worker_never_trips_the_progress_clock() -> None:
    """An idle worker beating for an hour without progress is not killed."""
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 7200):
        events += [(i * 0.5, w.beat(WorkerState.IDLE)), (i * 0.5, Tick())]
    assert run(monitor, events) == []


def test_progress_clock_starts_when_a_busy_spell_starts() -> None:
    """After a long idle time, a new busy spell gets the full progress timeout."""
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 200):
        events += [(i * 0.5, w.beat(WorkerState.IDLE)), (i * 0.5, Tick())]
    for i in range(200, 400):
        events += [(i * 0.5, w.beat(WorkerState.BUSY)), (i * 0.5, Tick())]
    [(when, kill)] = run(monitor, events)
    assert kill.reason is KillReason.NO_PROGRESS
    assert when == 99.5 + 30.0  # the last idle beat was at 99.5


def test_idle_worker_with_messages_waiting_and_no_progress_is_killed() -> None:
    """Messages wait in the mailboxes, none is handled, the beats go on: hung (no_progress).

    What the worker reports as idle when one actor is stuck on an await with messages queued
    behind it while another actor of the process finished its last message.
    """
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 200):
        events += [(i * 0.5, w.beat(WorkerState.IDLE, backlog=3)), (i * 0.5, Tick())]
    [(when, kill)] = run(monitor, events)
    assert kill.reason is KillReason.NO_PROGRESS
    assert when == 30.5  # first beat at 0.5 starts the clock
    assert kill.last_status is not None and kill.last_status.backlog == 3


def test_a_backlog_that_is_being_handled_is_progress() -> None:
    """A worker with messages always waiting lives as long as it handles some in time."""
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 2001):
        if i % 58 == 0:  # a message handled every 29 s, under the 30 s timeout
            w.handled += 1
        events += [(i * 0.5, w.beat(WorkerState.IDLE, backlog=1000)), (i * 0.5, Tick())]
    assert run(monitor, events) == []


def test_the_progress_clock_starts_when_messages_start_waiting() -> None:
    """After a long idle time with empty mailboxes, a backlog gets the full progress timeout."""
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 200):
        events += [(i * 0.5, w.beat(WorkerState.IDLE)), (i * 0.5, Tick())]
    for i in range(200, 400):
        events += [(i * 0.5, w.beat(WorkerState.IDLE, backlog=1)), (i * 0.5, Tick())]
    [(when, kill)] = run(monitor, events)
    assert kill.reason is KillReason.NO_PROGRESS
    assert when == 99.5 + 30.0  # the last beat with empty mailboxes was at 99.5


def test_a_stopping_worker_with_a_backlog_is_not_judged_on_progress() -> None:
    """Shutdown drains or fails what is queued; the heartbeat clock still applies."""
    w = Worker()
    monitor = registered(w)
    events: Timeline = []
    for i in range(1, 400):
        events += [(i * 0.5, w.beat(WorkerState.STOPPING, backlog=5)), (i * 0.5, Tick())]
    assert run(monitor, events) == []
    assert monitor.statistics(200.0).workers["w1"].backlog == 5


def test_disabled_progress_timeout_never_kills_for_no_progress() -> None:
    """progress_timeout_s=None turns the progress check off for a kind."""
    w = Worker()
    policy = LivenessPolicy(progress_timeout_s=None)
    monitor = registered(w, policy=policy)
    events: Timeline = []
    for i in range(1, 1000):
        events += [(i * 0.5, w.beat()), (i * 0.5, Tick())]
    assert run(monitor, events) == []


def test_policies_apply_per_kind() -> None:
    """Workers of different kinds are judged by their own kind's timeouts, others by default."""
    monitor = LivenessMonitor(
        {"fast": LivenessPolicy(interval_s=0.1, heartbeat_timeout_s=1.0)},
        default=LivenessPolicy(heartbeat_timeout_s=5.0),
    )
    monitor.handle(Register("a", 1, "fast"), 0.0)
    monitor.handle(Register("b", 2, "other"), 0.0)
    assert monitor.tick_interval_s == 0.1
    kills = run(monitor, ticks(0.0, 6.0, 0.1))
    assert [(round(t, 1), k.worker_id) for t, k in kills] == [(1.0, "a"), (5.0, "b")]


def test_killed_worker_is_killed_once_and_not_resurrected_by_late_beats() -> None:
    """After a Kill, later ticks make no second Kill and late beats are ignored."""
    w = Worker()
    monitor = registered(w)
    assert len(run(monitor, ticks(0.0, 4.0))) == 1
    assert run(monitor, [(4.1, w.beat()), *ticks(4.5, 20.0)]) == []
    stats = monitor.statistics(20.0)
    assert stats.workers["w1"].killed
    assert stats.workers["w1"].last_beat_age_s is None
    assert stats.ignored_beats == 1
    assert dict(stats.kills_by_reason) == {"no_heartbeat": 1}


def test_reregistration_with_a_new_pid_restarts_watching_and_ignores_the_old_pid() -> None:
    """A restart (Register with a new pid) is watched afresh; beats of the old pid are ignored."""
    old, new = Worker(pid=100), Worker(pid=200)
    monitor = registered(old)
    assert len(run(monitor, ticks(0.0, 3.0))) == 1
    monitor.handle(Register("w1", 200, "k"), 3.5)
    events = [(t, old.beat()) for t in (4.0, 4.5, 5.0, 6.0, 6.4)] + [(4.0, new.beat())]
    kills = run(monitor, events + ticks(4.0, 10.0))
    [(when, kill)] = kills
    assert (when, kill.pid) == (7.0, 200)
    assert monitor.statistics(10.0).ignored_beats == 5


def test_beats_from_unknown_workers_and_old_datagrams_are_ignored() -> None:
    """A beat from an unregistered worker creates nothing, and an older seq refreshes nothing."""
    w, stranger = Worker(), Worker("ghost")
    monitor = registered(w)
    monitor.handle(stranger.beat(), 0.5)
    early = w.beat()
    late = w.beat()
    monitor.handle(late, 1.0)
    monitor.handle(early, 3.9)  # reordered: refreshes nothing, so the kill still comes at 4.0
    stats = monitor.statistics(1.0)
    assert set(stats.workers) == {"w1"} and stats.ignored_beats == 2
    [(when, _)] = run(monitor, ticks(1.0, 5.0))
    assert when == 4.0


def forged(w: Worker, seq: int) -> Beat:
    """A beat with the worker's id and pid that it never sent (unsigned beats: no keys)."""
    return Beat(StatusSnapshot(w.worker_id, w.pid, WorkerState.IDLE, None, 0, 0, None, seq, 0))


def beating(w: Worker, start: float, stop: float) -> Timeline:
    """The worker's real beats, one per interval, with a tick after each."""
    events: Timeline = []
    for t, tick in ticks(start, stop):
        events += [(t, w.beat(WorkerState.IDLE)), (t, tick)]
    return events


def test_one_forged_beat_far_ahead_does_not_silence_the_real_sender() -> None:
    """A datagram with seq 2**62 made every real beat after it look old: the supervisor killed
    the worker for silence (no_heartbeat) while it beat on. Its next real beat, far below, is
    taken again, and reported once."""
    w = Worker()
    monitor = registered(w)
    before = beating(w, 0.5, 2.0)
    kills = run(monitor, [*before, (2.1, forged(w, 2**62)), *beating(w, 2.5, 30.0)])
    assert kills == []
    assert monitor.take_suspect_beats() == [SuspectBeat("w1", 100, 5, 2**62)]
    run(monitor, [(30.1, forged(w, 2**62)), *beating(w, 30.5, 31.0)])  # again: no second report
    assert monitor.take_suspect_beats() == []
    assert monitor.statistics(31.0).workers["w1"].last_beat_age_s == 0.0


@pytest.mark.parametrize("ahead", range(1, 12))
def test_a_forged_beat_a_little_ahead_hides_fewer_real_beats_than_the_timeout(ahead: int) -> None:
    """Just ahead of the real sequence, a forged beat makes the next real beats look like late
    datagrams (ignored), but fewer of them than a heartbeat timeout holds."""
    w = Worker()
    monitor = registered(w)
    events = [*beating(w, 0.5, 2.0), (2.1, forged(w, w.seq + ahead)), *beating(w, 2.5, 20.0)]
    assert run(monitor, events) == []
    assert monitor.statistics(20.0).workers["w1"].last_beat_age_s == 0.0


def test_a_worker_that_stops_after_a_forged_beat_is_still_killed() -> None:
    w = Worker()
    monitor = registered(w)
    [(when, kill)] = run(monitor, [*beating(w, 0.5, 2.0), (2.1, forged(w, 2**62)), *ticks(2.5, 10.0)])
    assert kill.reason is KillReason.NO_HEARTBEAT and 5.1 <= when <= 5.6
    assert kill.last_status is not None and kill.last_status.seq == 2**62  # the record shows it


def test_the_reorder_window_is_half_a_timeout_of_beats_and_at_least_one() -> None:
    assert reorder_window(POLICY) == 3
    assert reorder_window(LivenessPolicy(interval_s=1.0, heartbeat_timeout_s=1.5)) == 1
    assert reorder_window(LivenessPolicy(interval_s=0.1, heartbeat_timeout_s=10.0)) == 50


def test_unregistered_worker_is_no_longer_watched() -> None:
    """Unregister stops the clocks: a stopped worker is never killed."""
    w = Worker()
    monitor = registered(w)
    monitor.handle(Unregister("w1"), 1.0)
    monitor.handle(Unregister("never-there"), 1.0)
    assert run(monitor, ticks(1.0, 100.0)) == []
    assert monitor.statistics(100.0).workers == {}
    assert monitor.next_deadline() is None


def test_statistics_report_ages_and_state() -> None:
    """statistics(now) reports each worker's beat and progress ages and last state."""
    w = Worker()
    monitor = registered(w)
    monitor.handle(w.beat(WorkerState.BUSY), 1.0)
    monitor.handle(w.beat(WorkerState.BUSY), 2.0)
    entry = monitor.statistics(2.5).workers["w1"]
    assert (entry.state, entry.last_beat_age_s, entry.last_progress_age_s) == (
        WorkerState.BUSY,
        0.5,
        1.5,
    )
    assert (entry.pid, entry.kind, entry.killed) == (100, "k", False)


def test_next_deadline_is_the_earliest_kill_time() -> None:
    """next_deadline() gives the earliest moment a Tick could kill, over both clocks."""
    w = Worker()
    monitor = registered(w, policy=LivenessPolicy(heartbeat_timeout_s=3.0, progress_timeout_s=2.0))
    assert monitor.next_deadline() == 3.0
    monitor.handle(w.beat(WorkerState.BUSY), 1.0)
    assert monitor.next_deadline() == 3.0  # progress clock: 1.0 + 2.0
    monitor.handle(w.beat(WorkerState.IDLE), 1.5)
    assert monitor.next_deadline() == 4.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval_s": 0},
        {"interval_s": 1.0, "heartbeat_timeout_s": 1.0},
        {"heartbeat_timeout_s": float("nan")},
        {"progress_timeout_s": -1},
        {"startup_timeout_s": 0},
        {"interval_s": True},
    ],
)
def test_bad_policy_is_refused_with_config_error(kwargs: dict[str, float]) -> None:
    """A policy with a non-positive value, or a timeout not above the interval, is refused."""
    with pytest.raises(ConfigError, match="must be"):
        LivenessPolicy(**kwargs)
