"""Stage classes for the tests of the direct data plane (issue 14): large payloads, checked.

Worker processes load them as ``support.direct_plane_stages:MakePayload`` and so on (``tests/``
on ``PYTHONPATH``). :class:`MakePayload` makes one payload per item, a numpy array whose bytes
follow from the item's seed; :class:`PassPayload` hands it on unchanged; :class:`CheckPayload`
makes the expected bytes again, compares, and returns something small. Each stage may append
what it saw to a JSON-lines file (``log``) shared by every replica of a run: each record is one
``os.write`` on an ``O_APPEND`` descriptor, so records from several processes never interleave.

:class:`CheckPayload` may wait at a gate (a file that does not exist yet) before it checks
anything: the items upstream then sit held in the replica that made them, where a test can
kill it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import anyio
import numpy as np

from support.hook_stages import append_record, read_records
from troupe.runtime.pipeline.stage import StageActor

__all__ = [
    "UNSENDABLE",
    "CheckPayload",
    "MakeOneUnsendable",
    "MakePayload",
    "PassPayload",
    "SlowToStart",
    "expected_payload",
    "read_records",
]

_GATE_POLL_S = 0.02
_GATE_MOST_S = 300.0  # a gate never opened errs the item rather than hang the run


def expected_payload(seed: int, nbytes: int) -> np.ndarray:
    """The payload of the item with ``seed``: ``nbytes`` pseudo-random bytes."""
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def _append(log: str, record: dict[str, Any]) -> None:
    if log:
        append_record(log, record)


class MakePayload(StageActor):
    """The first stage: the item with its payload (``nbytes`` bytes made from its seed).

    Args:
        nbytes: the payload's size in bytes.
        log: the JSON-lines file to record each item in ("" records nothing).
    """

    def __init__(self, nbytes: int, log: str = "") -> None:
        self.nbytes = nbytes
        self.log = log

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        seed = int(item["seed"])
        _append(self.log, {"stage": "make", "task_id": item["task_id"], "pid": os.getpid()})
        return {"task_id": item["task_id"], "seed": seed, "payload": expected_payload(seed, self.nbytes)}


# What :class:`MakeOneUnsendable` adds to its culprit's output: a value with no wire encoding.
UNSENDABLE = {
    "set": {"a", "b"},  # msgpack has none; the replica sees it as it weighs the output
    "lone surrogate": "\ud800",  # a str, which the weighing vouches for: found at the take
}


class MakeOneUnsendable(MakePayload):
    """:class:`MakePayload` whose item of seed ``culprit`` also holds a value that cannot be
    encoded (``UNSENDABLE[what]``) beside its payload: its output, large enough to be held for
    the next stage as the others are, cannot be handed over.

    Args:
        nbytes: the payload's size in bytes.
        culprit: the seed of the item whose output holds the value.
        what: which of ``UNSENDABLE``.
    """

    def __init__(self, nbytes: int, culprit: int, what: str) -> None:
        super().__init__(nbytes)
        self.culprit = culprit
        self.what = what

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        out = super().process(item)
        return {**out, "tags": UNSENDABLE[self.what]} if int(item["seed"]) == self.culprit else out


class PassPayload(StageActor):
    """A middle stage: the item as it came (its payload is held here for the next stage).

    Args:
        log: the JSON-lines file to record each item in, with this process's pid.
    """

    def __init__(self, log: str = "") -> None:
        self.log = log

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        _append(self.log, {"stage": "pass", "task_id": item["task_id"], "pid": os.getpid()})
        return item


class CheckPayload(StageActor):
    """The last stage: whether the payload is the one its seed makes, and a digest of it.

    Args:
        nbytes: the payload's expected size in bytes.
        log: the JSON-lines file to record each item in, with what it found.
        gate: a file path: each item waits until it exists, after recording that it waits
            ("": no gate).
    """

    def __init__(self, nbytes: int, log: str = "", gate: str = "") -> None:
        self.nbytes = nbytes
        self.log = log
        self.gate = gate

    async def process(self, item: dict[str, Any]) -> dict[str, Any]:
        if self.gate and not os.path.exists(self.gate):
            _append(self.log, {"stage": "wait", "task_id": item["task_id"], "pid": os.getpid()})
            with anyio.fail_after(_GATE_MOST_S):  # async: the replica stays live meanwhile
                while not os.path.exists(self.gate):
                    await anyio.sleep(_GATE_POLL_S)
        payload = np.asarray(item["payload"])
        intact = bool(
            payload.dtype == np.uint8
            and payload.shape == (self.nbytes,)
            and np.array_equal(payload, expected_payload(int(item["seed"]), self.nbytes))
        )
        digest = hashlib.sha256(payload.tobytes()).hexdigest()
        record = {"task_id": item["task_id"], "seed": int(item["seed"]), "intact": intact, "sha256": digest}
        _append(self.log, {"stage": "check", "pid": os.getpid(), **record})
        return record


class SlowToStart(MakePayload):
    """:class:`MakePayload` whose replica stays starting until ``gate`` exists (its ``started``
    hook waits there, so its worker does not register): a test acts while the node is still
    starting it. It records ``starting`` in ``log`` first.
    """

    def __init__(self, nbytes: int, log: str = "", gate: str = "") -> None:
        super().__init__(nbytes, log)
        self.gate = gate

    async def started(self) -> None:
        _append(self.log, {"stage": "starting", "pid": os.getpid()})
        with anyio.fail_after(_GATE_MOST_S):
            while self.gate and not os.path.exists(self.gate):
                await anyio.sleep(_GATE_POLL_S)
