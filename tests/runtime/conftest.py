"""Async runtime tests run under both event loops troupe supports: asyncio (debug) and uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import uvloop


def _debug_asyncio_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    return loop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """Every async test in tests/runtime runs once per loop implementation."""
    return {"asyncio": _debug_asyncio_loop, "uvloop": uvloop.new_event_loop}
