"""Small actors that show troupe working: ``troupe demo`` and the tests use them."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from troupe.runtime import Actor, handles

__all__ = ["Counter", "Echo", "Greeter", "Relay"]


class Echo(Actor):
    """Answers every ``echo`` with its payload; ``fail`` raises; ``sum`` adds up an array."""

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload

    @handles("fail")
    def fail(self, payload: Any) -> None:
        raise ValueError(f"asked to fail: {payload}")

    @handles("sum")
    def total(self, payload: np.ndarray) -> float:
        return float(np.asarray(payload).sum())

    @handles("pid")
    def pid(self, _: Any) -> int:
        return os.getpid()


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
