"""Actors that report what a worker made of a received message, for the protocol client tests.

Worker processes load them as ``support.protocol_probe:ArrayProbe`` (``tests/`` on PYTHONPATH).
``ArrayProbe`` never imports torch; ``TensorProbe``'s module does, as a torch actor's would.
"""

from __future__ import annotations

import sys
from typing import Any

from troupe.runtime import Actor, handles
from troupe.runtime.wire.codec import _EXTENSIONS

__all__ = ["ArrayProbe"]


class ArrayProbe(Actor):
    """Describes the arrays it receives, and tries to write into them on request."""

    @handles("describe")
    def describe(self, payload: Any) -> dict[str, Any]:
        return {
            "type": type(payload).__name__,
            "dtype": str(getattr(payload, "dtype", "")),
            "writeable": bool(payload.flags.writeable) if hasattr(payload, "flags") else None,
        }

    @handles("write")
    def write(self, payload: Any) -> None:
        payload[...] = 0  # must fail: a received array is a read-only view of the frame

    @handles("codecs")
    def codecs(self, _: Any) -> dict[str, Any]:
        return {"torch_imported": "torch" in sys.modules, "extensions": sorted(_EXTENSIONS)}
