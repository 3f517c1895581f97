"""Fuzzing control handlers with hypothesis: payloads of every shape a peer can send, and the
check that a handler answers each with a reply or a clear error (a TroupeError, which travels
with its own code), never a crash of its own (KeyError, TypeError... as ``remote_error``) nor a
hang. Shared by the node's and the master's control fuzz tests."""

from __future__ import annotations

import re
import reprlib
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
from hypothesis import strategies as st

import troupe.runtime
from troupe.runtime.errors import TroupeError
from troupe.runtime.wire.codec import Codec

__all__ = ["HANDLER_BOUND_S", "REGRESSIONS", "answer", "field_names", "payloads"]

HANDLER_BOUND_S = 10.0  # a handler that takes longer than this on a bad payload hangs

_FIELD_CALL = re.compile(r"""\.(?:require|optional|map_of_str|host_port)\(\s*["'](\w+)["']""")
_GET_CALL = re.compile(r"""payload\.get\(\s*["'](\w+)["']""")


def field_names(extra: Iterable[str] = ()) -> list[str]:
    """Every field name a control handler of the runtime reads from its payload (found in the
    source, so that a new control's fields are fuzzed too), with ``extra``."""
    root = Path(troupe.runtime.__file__).parent
    names: set[str] = set(extra)
    for path in root.rglob("*.py"):
        text = path.read_text()
        names.update(_FIELD_CALL.findall(text))
        names.update(_GET_CALL.findall(text))
    return sorted(names)


_ints = st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.sampled_from(
    [0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**64 - 1, -(2**63)]
)
_floats = st.floats() | st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -0.0])
_texts = st.text(max_size=30) | st.sampled_from(
    ["", "x" * 100_000, "../../etc/passwd", "a/b/c/d", "tcp://127.0.0.1:1", "*", "\x00", "é" * 50]
)
_scalars = st.none() | st.booleans() | _ints | _floats | _texts | st.binary(max_size=30)


# The deepest nesting a payload can arrive with: msgpack's unpacker stops at 1024 levels.
MAX_DEPTH = 1023


def _deep(depth: int) -> Any:
    value: Any = "bottom"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def payloads(names: list[str]) -> st.SearchStrategy[Any]:
    """Msgpack-able payloads: maps whose keys are mostly the handlers' own field names (so that
    validation gets past the first field), with values of every type, nested deep or not,
    and non-maps."""
    assert names, "no field names found: the control handlers read none?"
    keys = st.sampled_from(names) | st.text(max_size=12) | st.integers(-5, 5)
    values = st.recursive(
        _scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.sampled_from(names) | st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    ) | st.integers(100, MAX_DEPTH).map(_deep)
    return st.dictionaries(keys, values, max_size=8) | values


def _short(value: Any) -> str:
    """A bounded repr: payloads nest deeper than ``repr`` can go."""
    return reprlib.repr(value)


async def answer(name: str, handler: Callable[[Any], Awaitable[Any]], payload: Any) -> str:
    """Run ``handler`` on ``payload`` as the router would: return ``"reply"`` or the code of
    the clear error; fail on any other exception, on a reply that cannot travel, or a hang."""
    try:
        with anyio.fail_after(HANDLER_BOUND_S):
            result = await handler(payload)
    except TroupeError as exc:
        assert str(exc), f"control {name!r}: an error without a message for {_short(payload)}"
        return str(exc.code)
    except TimeoutError:
        raise AssertionError(f"control {name!r} hung on payload {_short(payload)}") from None
    except Exception as exc:
        raise AssertionError(
            f"control {name!r} crashed with {type(exc).__name__}: {_short(exc)} on payload {_short(payload)}"
        ) from exc
    Codec(256 * 2**20).encode_reply(1, "fuzz", result)  # the reply must be able to travel
    return "reply"


def _regressions() -> list[Any]:
    deep = _deep(MAX_DEPTH - 3)
    return [
        deep,  # repr() of it raised RecursionError in the bad_request message (control_payloads)
        {"job_id": deep, "node": deep, "name": deep, "job": deep},
    ]


# Payloads the fuzzing found a handler crashing on, once fixed: every control is given each.
REGRESSIONS = _regressions()
