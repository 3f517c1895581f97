"""Heartbeat datagrams over real UDP on 127.0.0.1, sent by a real thread."""

from __future__ import annotations

import itertools
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import msgpack
import pytest
from structlog.testing import capture_logs

from troupe.runtime.errors import BadFrame, ConfigError, VersionMismatch
from troupe.runtime.supervision.heartbeat import (
    BEAT_MAGIC,
    DROPPED_LOG_INTERVAL_S,
    HeartbeatReceiver,
    HeartbeatSender,
    decode_beat,
    encode_beat,
)
from troupe.runtime.supervision.liveness import Beat
from troupe.runtime.supervision.status import StatusSnapshot, WorkerState, WorkerStatus


@pytest.fixture
def receiver() -> Iterator[HeartbeatReceiver]:
    with HeartbeatReceiver() as rx:
        yield rx


def collect(
    rx: HeartbeatReceiver,
    until: Callable[[list[tuple[float, Beat]]], bool],
    timeout_s: float = 3.0,
) -> list[tuple[float, Beat]]:
    """Receive (arrival time, beat) pairs until ``until`` holds or the deadline passes."""
    got: list[tuple[float, Beat]] = []
    deadline = time.monotonic() + timeout_s
    while not until(got):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        select.select([rx], [], [], min(left, 0.05))
        now = time.monotonic()
        got += [(now, b) for b in rx.recv_all()]
    return got


def test_encode_decode_round_trip() -> None:
    """A snapshot survives encoding and decoding unchanged."""
    snap = StatusSnapshot("w1", 1234, WorkerState.BUSY, "render:t1", 7, 99, "frame 3", 12)
    assert decode_beat(encode_beat(snap)) == Beat(snap)


def test_the_backlog_travels_and_a_beat_without_it_reads_as_none_waiting() -> None:
    """The beat carries the messages waiting; a ten-item beat of an older worker means 0."""
    snap = StatusSnapshot("w1", 7, WorkerState.IDLE, None, 3, 0, None, 9, backlog=42)
    assert decode_beat(encode_beat(snap)).snapshot == snap
    old = msgpack.packb([BEAT_MAGIC, 1, "w1", 7, "idle", None, 3, 0, None, 9])
    assert decode_beat(old).snapshot.backlog == 0
    with pytest.raises(BadFrame, match="backlog"):
        decode_beat(msgpack.packb([BEAT_MAGIC, 1, "w1", 7, "idle", None, 3, 0, None, 9, -1]))


def test_the_status_record_reports_its_probes_backlog_and_survives_a_failing_probe() -> None:
    """The beat thread asks the probe each snapshot; a probe that raises keeps the last count."""
    status = WorkerStatus("w1", pid=5)
    assert status.snapshot().backlog == 0
    counts = iter([4, 2])

    def probe() -> int:
        n = next(counts, None)
        if n is None:
            raise RuntimeError("dictionary changed size during iteration")
        return n

    status.backlog_probe = probe
    assert [status.snapshot().backlog for _ in range(3)] == [4, 2, 2]


def test_long_texts_are_cut_to_fit_one_datagram() -> None:
    """A huge progress note is cut to 256 characters rather than breaking the datagram."""
    snap = StatusSnapshot("w1", 1, WorkerState.BUSY, "c" * 10_000, 0, 0, "n" * 100_000, 0)
    data = encode_beat(snap)
    assert len(data) < 1024
    beat = decode_beat(data)
    assert beat.snapshot.progress_note == "n" * 256 and beat.snapshot.current == "c" * 256


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"not msgpack at all",
        msgpack.packb({"magic": BEAT_MAGIC}),
        msgpack.packb(["xxxx", 1, "w1", 1, "busy", None, 0, 0, None, 0]),
        msgpack.packb([BEAT_MAGIC, 1, "w1", 1, "busy", None, 0, 0, None]),
        msgpack.packb([BEAT_MAGIC, 1, "", 1, "busy", None, 0, 0, None, 0]),
        msgpack.packb([BEAT_MAGIC, 1, "w1", -1, "busy", None, 0, 0, None, 0]),
        msgpack.packb([BEAT_MAGIC, 1, "w1", True, "busy", None, 0, 0, None, 0]),
        msgpack.packb([BEAT_MAGIC, 1, "w1", 1, "asleep", None, 0, 0, None, 0]),
        msgpack.packb([BEAT_MAGIC, 1, "w1", 1, "busy", 5, 0, 0, None, 0]),
        msgpack.packb([BEAT_MAGIC, 1, "w1", 1, "busy", None, 0.5, 0, None, 0]),
        msgpack.packb([BEAT_MAGIC, 1, "w1", 1, "busy", None, 0, 0, b"bin", 0]),
        msgpack.packb([BEAT_MAGIC, 1, "w1", 1, "busy", None, 0, 0, None, 0]) + b"\x00",
        b"\xdd\xff\xff\xff\xff",
    ],
)
def test_malformed_datagrams_are_refused_as_bad_frames(data: bytes) -> None:
    """Anything but a well-formed version-1 heartbeat raises BadFrame, nothing else."""
    with pytest.raises(BadFrame):
        decode_beat(data)


def test_other_format_version_is_a_version_mismatch() -> None:
    """A heartbeat of another format version is refused with VersionMismatch."""
    with pytest.raises(VersionMismatch, match="same troupe version"):
        decode_beat(msgpack.packb([BEAT_MAGIC, 2, "w1", 1, "busy", None, 0, 0, None, 0]))


def test_beats_from_a_sender_thread_arrive_at_the_receiver(receiver: HeartbeatReceiver) -> None:
    """A started sender delivers the worker's status to the receiver every interval."""
    status = WorkerStatus("w1")
    status.begin_message("plan", task_id="t9")
    status.progress(2, note="halfway")
    with HeartbeatSender(status, receiver.address, interval_s=0.02) as sender:
        got = collect(receiver, lambda g: len(g) >= 3)
    assert len(got) >= 3
    snaps = [b.snapshot for _, b in got]
    assert [s.seq for s in snaps] == sorted(s.seq for s in snaps)
    assert snaps[0].current == "plan:t9" and snaps[0].progress_note == "halfway"
    assert snaps[0].state is WorkerState.BUSY and snaps[0].progress_count == 2
    assert sender.beats_sent >= 3 and sender.sends_failed == 0
    assert receiver.statistics().received == len(got)


def test_garbage_is_dropped_with_a_log_line_and_good_beats_still_arrive(
    receiver: HeartbeatReceiver,
) -> None:
    """The receiver logs and drops garbage datagrams, never raises, and keeps the valid ones."""
    good = encode_beat(WorkerStatus("w1", pid=5).snapshot())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx, capture_logs() as logs:
        for data in (b"\x00garbage", good, msgpack.packb([BEAT_MAGIC, 9]), b"", good):
            tx.sendto(data, receiver.address)
        got = collect(receiver, lambda g: len(g) >= 2)
        got += [(0.0, b) for b in receiver.recv_all()]  # the last garbage may trail the beats
        sender = f"127.0.0.1:{tx.getsockname()[1]}"
    assert [b.snapshot.pid for _, b in got] == [5, 5]
    assert receiver.statistics().dropped == 3
    [dropped] = [e for e in logs if e["event"] == "heartbeat_dropped"]  # one sender: one line
    assert dropped["error_code"] == "bad_frame" and dropped["log_level"] == "warning"
    assert dropped["sender"] == sender


def test_a_flood_of_garbage_makes_one_line_per_sender_per_interval() -> None:
    """20,000 malformed datagrams made 3,784 warning lines (1.1 MB of log, the rest lost in the
    socket's buffer); now each sender gets one line per DROPPED_LOG_INTERVAL_S, and its next
    line says how many went unlogged meanwhile."""
    now = [0.0]
    n = 50
    with (
        HeartbeatReceiver(clock=lambda: now[0]) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as one,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as two,
        capture_logs() as logs,
    ):
        for i in range(n):
            for tx in (one, two):
                tx.sendto(b"\x93garbage%d" % i, rx.address)
        drain(rx, lambda: rx.statistics().dropped == 2 * n)
        first = [e for e in logs if e["event"] == "heartbeat_dropped"]
        now[0] += DROPPED_LOG_INTERVAL_S
        one.sendto(msgpack.packb([BEAT_MAGIC, 9]), rx.address)
        drain(rx, lambda: rx.statistics().dropped == 2 * n + 1)
        first_sender, second_sender = (f"127.0.0.1:{s.getsockname()[1]}" for s in (one, two))
    assert {e["sender"] for e in first} == {first_sender, second_sender} and len(first) == 2
    assert all(e["unlogged"] == 0 and e["error_code"] == "bad_frame" for e in first)
    later = [e for e in logs if e["event"] == "heartbeat_dropped"][2:]
    assert [(e["sender"], e["unlogged"], e["error_code"]) for e in later] == [
        (first_sender, n - 1, "version_mismatch")
    ]
    assert later[0]["dropped"] == 2 * n + 1


def drain(rx: HeartbeatReceiver, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Read datagrams until ``done`` holds (bounded)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, rx.statistics()
        select.select([rx], [], [], 0.05)
        rx.recv_all()


def test_sending_where_nobody_listens_never_raises_and_logs_once() -> None:
    """Failing sends are counted and logged once; the beat thread keeps running."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        silent_port = s.getsockname()[1]
    status = WorkerStatus("w1")
    with capture_logs() as logs:
        quiet = HeartbeatSender(status, ("127.0.0.1", silent_port), interval_s=0.01)
        broken = HeartbeatSender(status, ("127.0.0.1", 0), interval_s=0.01)  # EINVAL on send
        with quiet, broken:
            deadline = time.monotonic() + 3.0
            while broken.sends_failed < 5 and time.monotonic() < deadline:
                select.select([], [], [], 0.01)
    assert broken.sends_failed >= 5 and broken.beats_sent == 0
    assert quiet.beats_sent >= 1
    failed = [e for e in logs if e["event"] == "heartbeat_send_failed"]
    assert len(failed) == 1 and failed[0]["addr"] == "127.0.0.1:0"


def test_sender_refuses_bad_interval_and_double_start() -> None:
    """A non-positive interval is a ConfigError; starting twice is a RuntimeError."""
    with pytest.raises(ConfigError, match="interval_s"):
        HeartbeatSender(WorkerStatus("w1"), ("127.0.0.1", 9), interval_s=0)
    sender = HeartbeatSender(WorkerStatus("w1"), ("127.0.0.1", 9), interval_s=1.0)
    sender.start()
    try:
        with pytest.raises(RuntimeError, match="twice"):
            sender.start()
    finally:
        sender.stop()


def test_beats_keep_flowing_during_a_pure_python_busy_loop(receiver: HeartbeatReceiver) -> None:
    """A worker thread spinning in Python does not silence 50 ms heartbeats: five busy beats arrive while it
    spins."""
    status = WorkerStatus("w1")
    enough = threading.Event()

    def busy() -> None:
        status.begin_message("spin")
        end = time.monotonic() + 30.0  # a bound, in case no beat ever comes
        while not enough.is_set() and time.monotonic() < end:
            status.progress()
        status.end_message()

    def five_busy(got: list[tuple[float, Beat]]) -> bool:
        if sum(b.snapshot.state is WorkerState.BUSY for _, b in got) >= 5:
            enough.set()
        return enough.is_set()

    with HeartbeatSender(status, receiver.address, interval_s=0.05):
        worker = threading.Thread(target=busy)
        worker.start()
        try:
            got = collect(receiver, five_busy, timeout_s=30.0)
        finally:
            enough.set()
            worker.join(30.0)
    during = [b for _, b in got if b.snapshot.state is WorkerState.BUSY]
    assert len(during) >= 5
    marks = [b.snapshot.progress_mark for b in during]
    assert marks == sorted(marks) and marks[-1] > marks[0]


_HANGING_WORKER = textwrap.dedent(
    """
    import sys, time
    from troupe.runtime.chaos.faults import hang_with_gil
    from troupe.runtime.supervision.heartbeat import HeartbeatSender
    from troupe.runtime.supervision.status import WorkerStatus

    status = WorkerStatus("hung")
    sender = HeartbeatSender(status, ("127.0.0.1", int(sys.argv[1])), interval_s=0.02)
    sender.start()
    sys.stdin.readline()  # the test has seen beats: hang now
    status.begin_message("simulate")
    hang_with_gil(float(sys.argv[2]))
    status.end_message()
    sys.stdin.readline()  # the test has seen beats again
    sender.stop()
    """
)


HANG_S = 1.0


def test_no_beat_goes_out_while_a_c_call_holds_the_gil(receiver: HeartbeatReceiver) -> None:
    """A worker stuck in a C call holding the GIL sends nothing: a gap of the hang's length."""
    with subprocess.Popen(
        [sys.executable, "-c", _HANGING_WORKER, str(receiver.address[1]), str(HANG_S)],
        stdin=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdin is not None
            before = collect(receiver, lambda g: len(g) >= 3, timeout_s=10.0)
            assert len(before) >= 3
            proc.stdin.write("go\n")
            proc.stdin.flush()
            after = collect(
                receiver,
                lambda g: (
                    sum(b.snapshot.state is WorkerState.IDLE for _, b in g) >= 3
                    and g[-1][1].snapshot.messages_handled == 1
                ),
                timeout_s=10.0,
            )
            proc.stdin.write("done\n")
            proc.stdin.flush()
            assert proc.wait(10.0) == 0
        finally:
            proc.kill()
            proc.wait(10.0)
    times = [t for t, _ in before + after]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) >= HANG_S / 2  # arrival times: a busy box may read the last beat before it late
    # The beats either side of the gap show the worker went in busy and came out having handled
    # the message: the silence is the hang, not a slow start.
    i = gaps.index(max(gaps))
    seqs = [b.snapshot.seq for _, b in before + after]
    assert seqs[i + 1] == seqs[i] + 1  # nothing was sent (and lost) during the gap
