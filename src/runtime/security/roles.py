"""Who may send what, once CURVE has said who a peer is.

With keys, every message a mailbox receives carries its sender's user id (the ZeroMQ
``User-Id`` the authenticator set: ``cluster``, ``operator:alice``, ``reader:bob``); the
transport puts it in the message's route, third after the mailbox and the connection.
``cluster`` (master, nodes, workers) and ``operator`` peers may send anything. ``reader`` peers
may send the read-only control messages below and nothing else: no message to an actor, no
control message that changes anything. The list names what is allowed, so a control added
later is refused to readers until someone decides it is harmless. Without keys, routes carry
no user id and everything is allowed, as before.
"""

from __future__ import annotations

from typing import Any

from troupe.runtime.errors import DeliveryError

from .keys import READER

__all__ = ["READ_ONLY_CONTROLS", "NotPermitted", "actor_message_refusal", "control_refusal", "peer_user"]

READ_ONLY_CONTROLS = frozenset(
    {"ping", "status", "jobs", "dead", "resolve", "wait_job", "supervision", "faults", "log_recent"}
)
"""Control messages that only read; a reader key may send these."""


class NotPermitted(DeliveryError, PermissionError):
    """The sender's key does not allow this message (a reader key sent a mutating control)."""

    code = "not_permitted"


def peer_user(route: Any) -> str | None:
    """The user id a message's route carries (CURVE on), else None."""
    if type(route) is tuple and len(route) > 2:
        user = route[2]
        return user if isinstance(user, str) else None
    return None


def _is_reader(user: str) -> bool:
    return user == READER or user.startswith(READER + ":")


def control_refusal(route: Any, msg_type: str) -> NotPermitted | None:
    """Why the sender may not send control ``msg_type``, or None when it may."""
    user = peer_user(route)
    if user is None or not _is_reader(user) or msg_type in READ_ONLY_CONTROLS:
        return None
    return NotPermitted(f"{msg_type} needs an operator key; this peer has a reader key ({user})")


def actor_message_refusal(route: Any, target: str) -> NotPermitted | None:
    """Why the sender may not message actor ``target``, or None when it may."""
    user = peer_user(route)
    if user is None or not _is_reader(user):
        return None
    return NotPermitted(
        f"messages to actors need an operator key; this peer has a reader key ({user}), "
        f"refused for {target!r}"
    )
