"""Control payloads read at the boundary: every malformed field is one bad_request naming it."""

from __future__ import annotations

from typing import Any

import pytest

from troupe.runtime.core.control_payloads import (
    ControlPayload,
    address_field,
    validated,
)
from troupe.runtime.errors import BadRequest, ProtocolError
from troupe.runtime.node.config import ActorSpec


def test_fields_of_the_right_type_are_returned() -> None:
    p = ControlPayload("x", {"s": "a", "i": 3, "f": 2, "m": {"k": "v"}, "l": [1], "hp": ["127.0.0.1", 9]})
    assert (p.require("s", str), p.require("i", int), p.require("f", float)) == ("a", 3, 2)
    assert p.map_of_str("m") == {"k": "v"} and p.require("l", list) == [1]
    assert p.host_port("hp") == ("127.0.0.1", 9)
    assert p.optional("absent", int, 5) == 5 and p.map_of_str("absent", required=False) == {}


def test_nil_payload_is_an_empty_map() -> None:
    p = ControlPayload("ping", None)
    assert p.optional("x", str) is None
    with pytest.raises(BadRequest, match="missing field 'x'"):
        p.require("x", str)


@pytest.mark.parametrize(
    ("payload", "read", "match"),
    [
        ("text", lambda p: None, "payload must be a map, got 'text'"),
        ({}, lambda p: p.require("name", str), "control 'c': missing field 'name' \\(str\\)"),
        ({"n": True}, lambda p: p.require("n", int), "field 'n' must be int, got True \\(bool\\)"),
        ({"n": 1.5}, lambda p: p.require("n", int), "field 'n' must be int, got 1.5"),
        ({"f": "1"}, lambda p: p.require("f", float), "field 'f' must be number, got '1'"),
        ({"o": 3}, lambda p: p.optional("o", str), "field 'o' must be str, got 3"),
        ({"m": {"a": 1}}, lambda p: p.map_of_str("m"), "field 'm' must map str to str, has 'a': 1"),
        ({"a": ["h"]}, lambda p: p.host_port("a"), "field 'a' must be \\[host, port\\]"),
        ({"a": ["h", "1"]}, lambda p: p.host_port("a"), "field 'a' must be \\[host, port\\]"),
    ],
)
def test_malformed_fields_are_bad_requests_naming_field_and_value(
    payload: Any, read: Any, match: str
) -> None:
    with pytest.raises(BadRequest, match=match) as info:
        read(ControlPayload("c", payload))
    assert info.value.code == "bad_request" and isinstance(info.value, ProtocolError)


def test_validated_names_the_failing_field() -> None:
    assert validated(ActorSpec, {"name": "a", "class": "m:C"}, "spawn").name == "a"
    with pytest.raises(BadRequest, match=r"control 'actor_spawned': field 'actor.class': Field required"):
        validated(ActorSpec, {"name": "a"}, "actor_spawned", "actor")


@pytest.mark.parametrize("text", ["a/b/c/d", "a//b", ""])
def test_address_field_refuses_what_is_no_address(text: str) -> None:
    with pytest.raises(BadRequest, match="field 'address'"):
        address_field(ControlPayload("resolve", {"address": text}), "address")


def test_a_host_and_port_must_be_an_ip_address_and_a_port() -> None:
    """A supervisor's heartbeat address: a name or an impossible port failed later, in every
    heartbeat's sendto (OverflowError), instead of at the control."""
    for bad in (["h", 9], ["127.0.0.1", 0], ["127.0.0.1", 65536], ["256.1.1.1", 9]):
        with pytest.raises(BadRequest, match="'hp' must be \\[host, port\\] with"):
            ControlPayload("x", {"hp": bad}).host_port("hp")
