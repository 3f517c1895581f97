"""Runtime tests run under both event loops troupe supports: asyncio (debug) and uvloop."""

from __future__ import annotations

import asyncio

import pytest
import uvloop


@pytest.fixture(scope="session", params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Every async runtime test runs once per loop implementation."""
    if request.param == "uvloop":
        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()
