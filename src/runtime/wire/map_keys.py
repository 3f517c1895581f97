"""The map key rule on the sending side: a value whose maps hold a key the reader refuses.

Map keys are str, int or bin (docs/PROTOCOL.md, section 6). msgpack's packer packs any key (a
tuple as an array, None, a float, a bool) and calls no hook for keys, so only the reader
refuses it, with the whole message: for a stage's batch reply, every item of the batch. A
sender that must not lose more than the one value walks it with :func:`refused_key` first;
the codec itself does not, as that would walk every payload of every message.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["key_refusal", "refused_key"]

# Values that hold no map: not walked into (the common leaves of an output).
_LEAVES = frozenset({str, int, float, bool, bytes, type(None)})


def _sendable_key(key: Any) -> bool:
    """Whether ``key`` reaches the reader as a str, int or bin: those, their subclasses (packed
    as their base) save bool, and a numpy scalar of one (the codec packs its ``item()``)."""
    if isinstance(key, (str, bytes)) or (isinstance(key, int) and not isinstance(key, bool)):
        return True
    np = sys.modules.get("numpy")  # no numpy imported: the key cannot be a numpy one
    return np is not None and isinstance(key, np.integer)


def refused_key(value: Any) -> tuple[Any] | None:
    """The first map key in ``value``, at any depth, that the reader refuses, as a 1-tuple
    (the key may be None); None where every key is sendable. Each container is walked once,
    so a value that holds itself ends (the codec then refuses it for its depth)."""
    stack = [value]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if id(node) in seen:
                continue
            seen.add(id(node))
            for key, item in node.items():
                if type(key) is not str and not _sendable_key(key):
                    return (key,)
                if type(item) not in _LEAVES:
                    stack.append(item)
        elif isinstance(node, (list, tuple)):
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.extend(item for item in node if type(item) not in _LEAVES)
    return None


def key_refusal(key: Any) -> str:
    """What a refused map ``key`` is told as, by its sender and by its reader: its repr cut to
    60 characters (a reason may go back to the peer and into the log)."""
    shown = repr(key)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"map key {shown} of type {type(key).__name__} refused: keys are str, int or bin"
