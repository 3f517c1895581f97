"""Heartbeats from a worker process to its node's supervisor: one UDP datagram per beat.

The sender is a daemon *thread* in the worker process, not a task on the worker's event loop,
so that a beat does not wait for a compute thread to yield. A pure-Python busy loop still
lets the beat through: CPython hands the GIL to a waiting thread every switch interval (5 ms).
A C call that holds the GIL (a simulator stuck inside an extension) stops every Python thread,
this one included, so the beats stop and the supervisor kills the process. That is the point:
a silent hang becomes a fail-stop error.

Datagram format (version 1): a msgpack array of eleven items,
``["tphb", 1, worker_id, pid, state, current, messages_handled, progress_count,
progress_note, seq, backlog]`` with ``state`` one of ``"idle"``, ``"busy"``, ``"stopping"``,
``current`` / ``progress_note`` a string (at most 256 characters) or nil, and ``backlog`` the
messages waiting in the worker's mailboxes. A ten-item beat (no ``backlog``, from an older
worker) is read as backlog 0. This is the one
place besides the codec allowed to import msgpack: the datagram is a separate, tiny format that
never travels over ZeroMQ.

The receiver never raises on garbage: a malformed datagram is logged and dropped.

With CURVE keys (DESIGN.md, Security), each datagram is the beat followed by its 32-byte
HMAC-SHA256, keyed with a key derived from the cluster's secret key (``CurveKeys.heartbeat_key``):
only a process of the cluster can sign a beat, so no other local process can keep a hung worker
alive, nor get a healthy one killed by beating for it wrongly. A receiver with a key drops (and
counts, ``bad_mac``) every datagram whose MAC is missing or wrong; without keys, beats carry no
MAC, as before. Sender and receiver take the process's keys unless told otherwise.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import msgpack

from troupe.runtime.core.peer_limits import PeerLogGate
from troupe.runtime.errors import BadFrame, ConfigError, VersionMismatch
from troupe.runtime.library_logging import get_logger
from troupe.runtime.security.process import installed

from .liveness import Beat
from .status import StatusSnapshot, WorkerState, WorkerStatus

__all__ = [
    "BEAT_MAGIC",
    "BEAT_VERSION",
    "FROM_PROCESS",
    "MAC_SIZE",
    "HeartbeatReceiver",
    "HeartbeatSender",
    "ReceiverStatistics",
    "decode_beat",
    "encode_beat",
    "process_mac_key",
    "sign_beat",
    "verify_beat",
]

log = get_logger(__name__)

BEAT_MAGIC = "tphb"
BEAT_VERSION = 1
MAX_TEXT = 256
_FIELDS = 11
_FIELDS_WITHOUT_BACKLOG = 10
_MAX_DATAGRAM = 65535
_STATES = {s.value: s for s in WorkerState}
MAC_SIZE = 32  # HMAC-SHA256
# One log line per sender per this many seconds for dropped datagrams (a bad MAC, or not a
# beat at all), however many come: a flood of garbage made a warning line each, 1.1 MB of log
# for 20,000 datagrams.
DROPPED_LOG_INTERVAL_S = 10.0
_ERROR_SHOWN = 200  # characters of a malformed datagram's error a log line shows


def process_mac_key() -> bytes | None:
    """The heartbeat MAC key of this process's keys (None without keys)."""
    keys = installed()
    return keys.heartbeat_key() if keys is not None else None


def sign_beat(beat: bytes, key: bytes) -> bytes:
    """``beat`` followed by its MAC under ``key``."""
    return beat + hmac.new(key, beat, hashlib.sha256).digest()


def verify_beat(datagram: bytes, key: bytes) -> bytes | None:
    """The beat inside a signed ``datagram``, or None when its MAC is missing or wrong."""
    if len(datagram) <= MAC_SIZE:
        return None
    beat, mac = datagram[:-MAC_SIZE], datagram[-MAC_SIZE:]
    if not hmac.compare_digest(mac, hmac.new(key, beat, hashlib.sha256).digest()):
        return None
    return beat


def _clip(text: str | None) -> str | None:
    return text if text is None or len(text) <= MAX_TEXT else text[:MAX_TEXT]


def encode_beat(snapshot: StatusSnapshot) -> bytes:
    """Encode a status snapshot as one heartbeat datagram.

    Long ``current`` and ``progress_note`` strings are cut to 256 characters so a beat always
    fits in one datagram.
    """
    s = snapshot
    beat: bytes = msgpack.packb(
        [
            BEAT_MAGIC,
            BEAT_VERSION,
            s.worker_id,
            s.pid,
            s.state.value,
            _clip(s.current),
            s.messages_handled,
            s.progress_count,
            _clip(s.progress_note),
            s.seq,
            s.backlog,
        ],
        use_bin_type=True,
    )
    return beat


def decode_beat(data: bytes) -> Beat:
    """Decode and validate one heartbeat datagram.

    Raises:
        BadFrame: the datagram is not msgpack, not a heartbeat, or has a field of the wrong type.
        VersionMismatch: it is a heartbeat of another format version.
    """
    try:
        items: Any = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types; all mean "not a heartbeat"
        raise BadFrame(f"heartbeat is not valid msgpack: {type(exc).__name__}: {exc}") from exc
    if not isinstance(items, list) or len(items) < 2 or items[0] != BEAT_MAGIC:
        raise BadFrame("datagram is not a troupe heartbeat (missing magic 'tphb')")
    if items[1] != BEAT_VERSION:
        raise VersionMismatch(
            f"heartbeat format version {items[1]!r} is not {BEAT_VERSION}; "
            "run the same troupe version on the worker and the supervisor"
        )
    if len(items) == _FIELDS_WITHOUT_BACKLOG:
        items.append(0)
    if len(items) != _FIELDS:
        raise BadFrame(f"heartbeat has {len(items)} fields, expected {_FIELDS}")
    _, _, worker_id, pid, state, current, handled, progress, note, seq, backlog = items
    if not isinstance(worker_id, str) or not worker_id:
        raise BadFrame("heartbeat worker_id must be a non-empty string")
    for name, value in (
        ("pid", pid),
        ("messages_handled", handled),
        ("progress_count", progress),
        ("seq", seq),
        ("backlog", backlog),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadFrame(f"heartbeat {name} must be an integer >= 0, got {value!r}")
    if state not in _STATES:
        raise BadFrame(f"heartbeat state must be one of {sorted(_STATES)}, got {state!r}")
    for name, value in (("current", current), ("progress_note", note)):
        if value is not None and not isinstance(value, str):
            raise BadFrame(f"heartbeat {name} must be a string or nil, got {type(value).__name__}")
    return Beat(
        StatusSnapshot(
            worker_id=worker_id,
            pid=pid,
            state=_STATES[state],
            current=current,
            messages_handled=handled,
            progress_count=progress,
            progress_note=note,
            seq=seq,
            backlog=backlog,
        )
    )


class _FromProcess:
    """The default of ``mac_key``: the process's keys decide (see ``process_mac_key``)."""


FROM_PROCESS = _FromProcess()


class HeartbeatSender:
    """A daemon thread that sends the worker's status to the supervisor every interval.

    The first beat goes out as soon as the thread starts. A failing send (nobody listening,
    buffer full) never raises out of the thread: it is logged once, and once more when sends
    work again.

    Args:
        status: the worker's status record.
        addr: the supervisor's ``(host, port)``, normally on 127.0.0.1.
        interval_s: seconds between beats.
        mac_key: sign every beat with this key (``process_mac_key()`` by default: the
            process's keys, None without them: unsigned).
    """

    def __init__(
        self,
        status: WorkerStatus,
        addr: tuple[str, int],
        interval_s: float = 0.5,
        mac_key: bytes | _FromProcess | None = FROM_PROCESS,
    ) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, int | float) or not (interval_s > 0):
            raise ConfigError(f"heartbeat interval_s must be a number > 0, got {interval_s!r}")
        self._status = status
        self._addr = addr
        self._interval_s = float(interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sent = 0
        self._failed = 0
        self._mac_key = process_mac_key() if isinstance(mac_key, _FromProcess) else mac_key

    @property
    def beats_sent(self) -> int:
        """Datagrams handed to the kernel so far."""
        return self._sent

    @property
    def sends_failed(self) -> int:
        """Beats that could not be sent."""
        return self._failed

    def start(self) -> None:
        """Start the beat thread.

        Raises:
            RuntimeError: the sender was already started.
        """
        if self._thread is not None:
            raise RuntimeError("HeartbeatSender.start() called twice; create a new sender")
        self._thread = threading.Thread(
            target=self._run, name=f"troupe-heartbeat-{self._status.worker_id}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the beat thread and wait for it up to ``timeout_s`` seconds."""
        self._stop.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("heartbeat_thread_stuck", worker_id=self._status.worker_id, timeout_s=timeout_s)

    def __enter__(self) -> HeartbeatSender:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        failing = False
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        except OSError as exc:
            # Without a socket there are no beats, so the supervisor kills this worker: a
            # fail-stop outcome, which is what a worker out of file descriptors should get.
            log.error("heartbeat_socket_failed", worker_id=self._status.worker_id, error=str(exc))
            return
        with sock:
            # Non-blocking: a full send buffer must cost a lost beat, never a stuck thread.
            sock.setblocking(False)
            while True:
                try:
                    beat = encode_beat(self._status.snapshot())
                    if self._mac_key is not None:
                        beat = sign_beat(beat, self._mac_key)
                    sock.sendto(beat, self._addr)
                    self._sent += 1
                    if failing:
                        failing = False
                        log.info("heartbeat_send_recovered", worker_id=self._status.worker_id)
                except Exception as exc:  # the beat thread must outlive any single failure
                    self._failed += 1
                    if not failing:
                        failing = True
                        log.warning(
                            "heartbeat_send_failed",
                            worker_id=self._status.worker_id,
                            addr=f"{self._addr[0]}:{self._addr[1]}",
                            error=f"{type(exc).__name__}: {exc}",
                        )
                if self._stop.wait(self._interval_s):
                    return


@dataclass(frozen=True, slots=True)
class ReceiverStatistics:
    """Counts of a heartbeat receiver."""

    received: int
    dropped: int
    bad_mac: int = 0  # of ``dropped``: unsigned, or signed with another key


class HeartbeatReceiver:
    """A non-blocking UDP socket that collects heartbeats, bound to a loopback port.

    Use ``fileno()`` to wait for readability from an event loop (``loop.add_reader``), then
    call ``recv_all()``.

    Args:
        host: the address to bind; loopback unless the cluster is secured.
        port: the port to bind; 0 picks a free one (see ``address``).
        max_batch: the most datagrams one ``recv_all()`` reads, so a flood cannot starve the
            caller's loop; the rest wait for the next call.
        mac_key: accept only beats signed with this key (``process_mac_key()`` by default: the
            process's keys; None without them: unsigned beats, as before).
        clock: monotonic seconds, for the once-per-sender log lines of dropped datagrams
            (tests pass a fake one).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch: int = 4096,
        mac_key: bytes | _FromProcess | None = FROM_PROCESS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.setblocking(False)
            self._sock.bind((host, port))
        except BaseException:
            self._sock.close()
            raise
        self._address: tuple[str, int] = self._sock.getsockname()
        self._max_batch = max_batch
        self._received = 0
        self._dropped = 0
        self._bad_mac = 0
        self._mac_key = process_mac_key() if isinstance(mac_key, _FromProcess) else mac_key
        self._bad_mac_log = PeerLogGate(DROPPED_LOG_INTERVAL_S, clock=clock)
        self._malformed_log = PeerLogGate(DROPPED_LOG_INTERVAL_S, clock=clock)

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)`` to give to senders."""
        return self._address

    def fileno(self) -> int:
        """The socket's file descriptor, readable when datagrams are waiting."""
        return self._sock.fileno()

    def recv_all(self) -> list[Beat]:
        """Read every datagram waiting (up to ``max_batch``), without blocking.

        Malformed datagrams are dropped and counted, and logged once per sender per
        ``DROPPED_LOG_INTERVAL_S``; this never raises on bad input.

        Returns:
            The valid beats, in arrival order.
        """
        beats: list[Beat] = []
        for _ in range(self._max_batch):
            try:
                data, sender = self._sock.recvfrom(_MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                # Linux may report an earlier ICMP error on a UDP socket; it is not ours to fix.
                if exc.errno == errno.ECONNREFUSED:
                    continue
                log.warning("heartbeat_recv_failed", error=str(exc))
                break
            if self._mac_key is not None:
                signed = verify_beat(data, self._mac_key)
                if signed is None:
                    self._bad_mac_dropped(sender, len(data))
                    continue
                data = signed
            try:
                beats.append(decode_beat(data))
            except (BadFrame, VersionMismatch) as exc:
                self._malformed_dropped(sender, len(data), exc)
                continue
            self._received += 1
        return beats

    def _bad_mac_dropped(self, sender: tuple[str, int], size: int) -> None:
        self._dropped += 1
        self._bad_mac += 1
        peer = f"{sender[0]}:{sender[1]}"
        if self._bad_mac_log.should_log(peer):
            log.warning(
                "heartbeat_dropped",
                sender=peer,
                size=size,
                error_code="bad_mac",
                error="heartbeat MAC missing or wrong: not signed with this cluster's keys",
                bad_mac=self._bad_mac,
                unlogged=self._bad_mac_log.take_quiet(peer),
            )

    def _malformed_dropped(self, sender: tuple[str, int], size: int, exc: BadFrame | VersionMismatch) -> None:
        self._dropped += 1
        peer = f"{sender[0]}:{sender[1]}"
        if self._malformed_log.should_log(peer):
            error = str(exc)  # it may quote the sender's values: cut
            log.warning(
                "heartbeat_dropped",
                sender=peer,
                size=size,
                error_code=exc.code,
                error=error if len(error) <= _ERROR_SHOWN else error[: _ERROR_SHOWN - 3] + "...",
                dropped=self._dropped,
                unlogged=self._malformed_log.take_quiet(peer),
            )

    def statistics(self) -> ReceiverStatistics:
        """Return the receiver's counts."""
        return ReceiverStatistics(received=self._received, dropped=self._dropped, bad_mac=self._bad_mac)

    def close(self) -> None:
        """Close the socket; idempotent."""
        self._sock.close()

    def __enter__(self) -> HeartbeatReceiver:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
