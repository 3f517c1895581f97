"""Which handshakes a peer hung up on say that the server key this process holds is not the
peer's (zmq_peer_loss.py): two in a row, with no completed handshake between, and each after; not
one alone (a peer that stopped mid-handshake), not a handshake that timed out (a paused peer);
without CURVE keys, that the peer uses them. The monitor's events are given here as libzmq reports them (the
real ones are seen in tests/runtime/security/test_curve_transport.py)."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import zmq

from troupe.runtime.transports.zmq_peer_loss import HUNG_UP_IN_A_ROW, PeerLossWatch

SERVER_KEY = Path("/keys/cluster.key")
PEER = "tcp://10.0.0.1:7480"


def _watch(told: list[str], server_key: Path | None = SERVER_KEY) -> tuple[PeerLossWatch, Any]:
    watch = PeerLossWatch(lambda w: None, lambda w, why, given_up: told.append(why), server_key=server_key)
    return watch, SimpleNamespace(peer=PEER)


def _hung_up(watch: PeerLossWatch, w: Any, error: int = errno.EPIPE) -> None:
    watch.heard(w, zmq.EVENT_CONNECTED, 20)
    watch.heard(w, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, error)
    watch.heard(w, zmq.EVENT_DISCONNECTED, 20)


def test_a_peer_that_hangs_up_twice_in_a_row_is_told_naming_the_key_file() -> None:
    told: list[str] = []
    watch, w = _watch(told)
    _hung_up(watch, w)
    assert told == []  # once: a peer that stopped mid-handshake
    _hung_up(watch, w, errno.ECONNRESET)
    _hung_up(watch, w)
    assert HUNG_UP_IN_A_ROW == 2 and len(told) == 2, told  # the second, and each after
    assert told[0].startswith(f"the CURVE handshake with {PEER} failed: it hung up on every try")
    assert f"not the one in {SERVER_KEY} (rotated? another cluster's?" in told[0]


def test_a_completed_handshake_between_starts_the_count_again() -> None:
    told: list[str] = []
    watch, w = _watch(told)
    _hung_up(watch, w)
    watch.heard(w, zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)  # the peer restarted, and let this process in
    watch.heard(w, zmq.EVENT_DISCONNECTED, 20)
    _hung_up(watch, w)
    assert told == []


def test_a_handshake_that_timed_out_is_no_hang_up() -> None:
    """A paused peer (SIGSTOP) accepts and says nothing: the handshake times out (EAGAIN), which
    the CLI words as a silent process, not as keys."""
    told: list[str] = []
    watch, w = _watch(told)
    for _ in range(3):
        _hung_up(watch, w, errno.EAGAIN)
    _hung_up(watch, w)
    assert told == []


def test_without_keys_hang_ups_in_a_row_name_the_keys_this_process_lacks() -> None:
    """A keyless process whose peer uses CURVE: the peer hangs up on its handshake, try after
    try; its asks waited out their deadlines in silence (report dt 2)."""
    told: list[str] = []
    watch, w = _watch(told, server_key=None)
    _hung_up(watch, w)
    assert told == []  # once: a peer that stopped mid-handshake
    _hung_up(watch, w)
    assert len(told) == 1, told
    assert told[0].startswith(f"the process at {PEER} hung up on every handshake"), told
    assert "give this process the cluster's keys directory: --keys DIR, or $TROUPE_KEYS" in told[0]


def test_a_refused_client_key_is_told_at_once() -> None:
    told: list[str] = []
    watch, w = _watch(told)
    watch.heard(w, zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)
    assert len(told) == 1 and "refused this process's CURVE key (not authorised there" in told[0]


def test_a_peer_without_curve_is_told_at_once_and_the_connection_given_up() -> None:
    """Where this side sees the mismatch of mechanisms first, libzmq never tries that connection
    again: the transport is told to forget it, so that its next send tries (and is told) again."""
    told: list[tuple[str, bool]] = []
    watch = PeerLossWatch(lambda w: None, lambda w, why, given_up: told.append((why, given_up)), SERVER_KEY)
    watch.heard(
        SimpleNamespace(peer=PEER),
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
    )
    assert len(told) == 1 and told[0][1] is True, told
    assert told[0][0].startswith(f"the process at {PEER} runs without CURVE keys"), told


def test_a_keyless_process_whose_peer_uses_curve_is_told_at_once_and_the_connection_given_up() -> None:
    told: list[tuple[str, bool]] = []
    watch = PeerLossWatch(lambda w: None, lambda w, why, given_up: told.append((why, given_up)))
    watch.heard(
        SimpleNamespace(peer=PEER),
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
        zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
    )
    assert len(told) == 1 and told[0][1] is True, told
    assert told[0][0].startswith(f"the process at {PEER} uses CURVE keys"), told
