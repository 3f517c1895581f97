"""With keys, a heartbeat counts only if the cluster signed it: over real UDP on 127.0.0.1."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from troupe.runtime.security.keys import generate_keys, load_keys
from troupe.runtime.security.process import install
from troupe.runtime.supervision.heartbeat import (
    HeartbeatReceiver,
    HeartbeatSender,
    encode_beat,
    process_mac_key,
    sign_beat,
    verify_beat,
)
from troupe.runtime.supervision.liveness import Beat
from troupe.runtime.supervision.status import WorkerStatus

WAIT_S = 30.0  # bound of every poll, never of how fast a beat is


@pytest.fixture
def key(tmp_path: Path) -> bytes:
    generate_keys(tmp_path)
    derived = load_keys(tmp_path).heartbeat_key()
    assert derived is not None
    return derived


def _receive(rx: HeartbeatReceiver, until: int) -> list[Beat]:
    """Beats until ``until`` datagrams were read (kept or dropped), within WAIT_S."""
    got: list[Beat] = []
    deadline = time.monotonic() + WAIT_S
    while rx.statistics().received + rx.statistics().dropped < until:
        assert time.monotonic() < deadline, f"only {rx.statistics()} of {until} datagrams within {WAIT_S}s"
        select.select([rx], [], [], 0.05)
        got += rx.recv_all()
    return got


def test_a_signed_beat_is_kept_and_unsigned_or_forged_ones_are_dropped_and_counted(key: bytes) -> None:
    beat = encode_beat(WorkerStatus("w1", pid=5).snapshot())
    forged = sign_beat(encode_beat(WorkerStatus("w1", pid=6).snapshot()), b"k" * 32)
    tampered = bytearray(sign_beat(beat, key))
    tampered[10] ^= 1
    with (
        HeartbeatReceiver(mac_key=key) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
        capture_logs() as logs,
    ):
        for data in (beat, forged, bytes(tampered), b"short", sign_beat(beat, key)):
            tx.sendto(data, rx.address)
        got = _receive(rx, 5)
    assert [b.snapshot.pid for b in got] == [5]  # only the signed one
    stats = rx.statistics()
    assert stats.received == 1 and stats.dropped == stats.bad_mac == 4
    dropped = [e for e in logs if e["event"] == "heartbeat_dropped"]
    assert dropped and dropped[0]["error_code"] == "bad_mac" and dropped[0]["log_level"] == "warning"
    assert len(dropped) == 1  # one line per sender per interval, however many come


def test_a_sender_with_the_key_keeps_its_worker_alive(key: bytes) -> None:
    with (
        HeartbeatReceiver(mac_key=key) as rx,
        HeartbeatSender(WorkerStatus("w1", pid=7), rx.address, interval_s=0.02, mac_key=key),
    ):
        got = _receive(rx, 3)
    assert len(got) >= 3 and {b.snapshot.pid for b in got} == {7}
    assert rx.statistics().bad_mac == 0


def test_without_keys_beats_are_unsigned_as_before(key: bytes) -> None:
    beat = encode_beat(WorkerStatus("w1", pid=5).snapshot())
    assert process_mac_key() is None
    with HeartbeatReceiver() as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.sendto(beat, rx.address)
        tx.sendto(sign_beat(beat, key), rx.address)  # a MAC where none is expected: not a beat
        got = _receive(rx, 2)
    assert [b.snapshot.pid for b in got] == [5] and rx.statistics().bad_mac == 0


def test_sender_and_receiver_take_the_process_keys_by_default(tmp_path: Path) -> None:
    generate_keys(tmp_path)
    keys = load_keys(tmp_path)
    install(keys)
    try:
        assert process_mac_key() == keys.heartbeat_key()
        with (
            HeartbeatReceiver() as rx,
            HeartbeatSender(WorkerStatus("w1", pid=8), rx.address, interval_s=0.02),
        ):
            got = _receive(rx, 2)
    finally:
        install(None)
    assert {b.snapshot.pid for b in got} == {8} and rx.statistics().bad_mac == 0


def test_verify_needs_the_whole_mac(key: bytes) -> None:
    beat = encode_beat(WorkerStatus("w1").snapshot())
    signed = sign_beat(beat, key)
    assert verify_beat(signed, key) == beat
    assert verify_beat(signed[:-1], key) is None and verify_beat(signed[-32:], key) is None


@pytest.fixture(autouse=True)
def _no_keys_left() -> Iterator[None]:
    yield
    install(None)
