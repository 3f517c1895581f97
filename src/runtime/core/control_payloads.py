"""Control payloads read at the boundary: a missing or mistyped field is a bad request.

A control handler's first lines take what it needs from its payload through
:class:`ControlPayload`, so a client that sends a malformed payload gets the ``bad_request``
ERROR naming the control, the field and the value it sent, never the handler's own
``KeyError`` or ``TypeError`` as a ``remote_error`` (docs/PROTOCOL.md section 10).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from troupe.runtime.errors import BadRequest

from .config_messages import short_repr
from .ref import ActorAddress

__all__ = ["ControlPayload", "address_field", "clipped", "validated"]

M = TypeVar("M", bound=BaseModel)

_TYPE_NAMES = {str: "str", int: "int", float: "number", bool: "bool", dict: "map", list: "list"}


def _matches(value: Any, kind: type) -> bool:
    # type() rather than isinstance(): on the wire a bool is never an int (docs/PROTOCOL.md 6).
    if kind is float:
        return type(value) in (int, float)
    if kind is int:
        return type(value) is int
    return isinstance(value, kind)


def clipped(value: Any) -> str:
    """``value``'s repr, cut to 80 characters: what a message shows of a value a peer sent."""
    return short_repr(value, 80)


class ControlPayload:
    """The payload of one control message, as a map whose fields are checked when read.

    Args:
        control: the control message's type, named in every error.
        payload: the decoded payload; it must be a map (``nil`` counts as an empty one).

    Raises:
        BadRequest: the payload is neither a map nor nil.
    """

    __slots__ = ("control", "fields")

    def __init__(self, control: str, payload: Any) -> None:
        if payload is None:
            payload = {}
        if not isinstance(payload, dict):
            raise BadRequest(
                f"control {control!r}: the payload must be a map, got {clipped(payload)} "
                f"({type(payload).__name__})"
            )
        self.control = control
        self.fields: Mapping[str, Any] = payload

    def require(self, key: str, kind: type) -> Any:
        """The value of field ``key``, which must be present and of type ``kind``.

        ``float`` accepts any number; ``int`` refuses booleans.

        Raises:
            BadRequest: the field is missing or of another type.
        """
        if key not in self.fields:
            raise BadRequest(
                f"control {self.control!r}: missing field {key!r} "
                f"({_TYPE_NAMES.get(kind, kind.__name__)}); fields sent: {sorted(map(str, self.fields))}"
            )
        return self._checked(key, self.fields[key], kind)

    def optional(self, key: str, kind: type, default: Any = None) -> Any:
        """The value of field ``key``, or ``default`` when it is missing or nil.

        Raises:
            BadRequest: the field is present, not nil, and of another type.
        """
        value = self.fields.get(key)
        if value is None:
            return default
        return self._checked(key, value, kind)

    def map_of_str(self, key: str, required: bool = True) -> dict[str, str]:
        """Field ``key`` as a map of str to str (actor names to endpoints, say).

        Raises:
            BadRequest: missing (when ``required``), not a map, or a key or value not a str.
        """
        value = self.require(key, dict) if required else self.optional(key, dict, {})
        for k, v in value.items():
            if type(k) is not str or type(v) is not str:
                raise BadRequest(
                    f"control {self.control!r}: field {key!r} must map str to str, has "
                    f"{clipped(k)}: {clipped(v)}"
                )
        return dict(value)

    def host_port(self, key: str) -> tuple[str, int]:
        """Field ``key`` as a UDP or TCP address ``[host, port]``.

        Raises:
            BadRequest: missing, not a list of a str and an int, not an IP address, or a port
                outside 1..65535.
        """
        value = self.require(key, list)
        if len(value) != 2 or type(value[0]) is not str or type(value[1]) is not int:
            raise BadRequest(
                f"control {self.control!r}: field {key!r} must be [host, port], got {clipped(value)}"
            )
        host, port = value
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise BadRequest(
                f"control {self.control!r}: field {key!r} must be [host, port] with an IP address "
                f"for host, got {clipped(host)}"
            ) from None
        if not 0 < port < 65536:
            raise BadRequest(
                f"control {self.control!r}: field {key!r} must be [host, port] with a port from 1 "
                f"to 65535, got {port}"
            )
        return host, port

    def _checked(self, key: str, value: Any, kind: type) -> Any:
        if not _matches(value, kind):
            raise BadRequest(
                f"control {self.control!r}: field {key!r} must be "
                f"{_TYPE_NAMES.get(kind, kind.__name__)}, got {clipped(value)} "
                f"({type(value).__name__})"
            )
        return value


def validated(model: type[M], value: Any, control: str, field: str | None = None) -> M:
    """``model.model_validate(value)``, with a validation failure as a bad request.

    Args:
        model: the pydantic model the value must fit (an actor or worker spec).
        value: the payload, or one field of it.
        control: the control message's type, named in the error.
        field: the payload field ``value`` came from, if not the whole payload.

    Raises:
        BadRequest: naming the first failing field, the value sent and pydantic's reason.
    """
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in ((field,) if field else ()) + tuple(first["loc"])) or "payload"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise BadRequest(
            f"control {control!r}: field {where!r}: {first['msg']}, got {clipped(first.get('input'))}{more}"
        ) from None


def address_field(payload: ControlPayload, key: str) -> ActorAddress:
    """Field ``key`` as an actor address (``actor``, ``process/actor`` or ``node/process/actor``).

    Raises:
        BadRequest: the field is missing, not a str, or not such an address.
    """
    text = payload.require(key, str)
    try:
        return ActorAddress.parse(text)
    except ValueError as exc:
        raise BadRequest(f"control {payload.control!r}: field {key!r}: {exc}") from None
