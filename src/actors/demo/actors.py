"""Small actors that show troupe working: ``troupe demo`` and the tests use them."""

from __future__ import annotations

import os
from typing import Any

import anyio

from troupe.runtime import Actor, handles

__all__ = ["Counter", "Echo", "Gate", "Greeter", "Opener", "Relay"]


class Echo(Actor):
    """Answers every ``echo`` with its payload; ``fail`` raises; ``sum`` adds up an array."""

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload

    @handles("fail")
    def fail(self, payload: Any) -> None:
        raise ValueError(f"asked to fail: {payload}")

    @handles("sum")
    def total(self, payload: Any) -> float:
        import numpy as np  # only this handler needs it: a plain echo worker stays small

        return float(np.asarray(payload).sum())

    @handles("pid")
    def pid(self, _: Any) -> int:
        return os.getpid()

    @handles("sleep")
    async def sleep(self, seconds: float) -> float:
        await anyio.sleep(float(seconds))
        return float(seconds)


_gate_open: anyio.Event | None = None  # made in started(), inside the worker's event loop


class Gate(Actor):
    """Holds every ``pass`` message until an Opener in the same process opens it.

    With a tiny mailbox this shows backpressure: while closed, messages pile up to the bound.
    """

    mailbox_capacity = 4

    def __init__(self) -> None:
        self.passed: list[Any] = []

    async def started(self) -> None:
        global _gate_open
        _gate_open = anyio.Event()

    @handles("pass")
    async def pass_(self, payload: Any) -> None:
        assert _gate_open is not None
        await _gate_open.wait()
        self.passed.append(payload if not isinstance(payload, (bytes, bytearray)) else len(self.passed))

    @handles("passed")
    def count(self, _: Any) -> int:
        return len(self.passed)


class Opener(Actor):
    """Opens the Gate of its process (a second actor, so it is not queued behind the gate)."""

    @handles("open")
    def open(self, _: Any) -> bool:
        assert _gate_open is not None
        _gate_open.set()
        return True


class Counter(Actor):
    """Counts ``add`` tells; ``get`` returns the count."""

    def __init__(self, start: int = 0) -> None:
        self.count = start

    @handles("add")
    def add(self, payload: Any) -> None:
        self.count += int(payload or 1)

    @handles("get")
    def get(self, _: Any) -> int:
        return self.count


class Greeter(Actor):
    """Greets by name."""

    def __init__(self, greeting: str = "hello") -> None:
        self.greeting = greeting

    @handles("greet")
    def greet(self, payload: Any) -> str:
        return f"{self.greeting}, {payload}"


class Relay(Actor):
    """Forwards ``relay`` payloads to another actor by name and returns its answer."""

    def __init__(self, target: str = "echo") -> None:
        self.target = target

    @handles("relay")
    async def relay(self, payload: Any) -> Any:
        return await self.ref(self.target).ask("echo", payload, timeout=10.0)
