"""The CLI's way of talking to nodes: one control message at a time, errors made readable."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import typer
from rich.console import Console

from troupe.runtime import AskTimeout, ConfigError, Runtime, TroupeError
from troupe.runtime.zmq_transport import ZmqTransport

__all__ = ["control", "err_console", "fail", "run_async"]

T = TypeVar("T")

err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` as an error and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def run_async(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``fn`` on uvloop; troupe errors become one clear line and exit status 1."""
    try:
        return anyio.run(fn, *args, backend="asyncio", backend_options={"use_uvloop": True})
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    except TroupeError as exc:
        raise fail(str(exc)) from None


async def control(endpoint: str, msg_type: str, payload: Any = None, timeout: float = 5.0) -> Any:
    """Send one control message to the node at ``endpoint`` and return its reply.

    Raises:
        TroupeError: with a message that says what to do when no node answers.
    """
    async with Runtime("cli", f"cli-{os.getpid()}", ZmqTransport(), drain_timeout=0.1) as runtime:
        try:
            return await runtime.control(endpoint, msg_type, payload, timeout=timeout)
        except AskTimeout:
            raise AskTimeout(
                f"no node answers at {endpoint} within {timeout}s; start one with "
                "`troupe node start` or pass --node ENDPOINT"
            ) from None
