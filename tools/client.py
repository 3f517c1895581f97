"""The CLI's way of talking to nodes: one control message at a time, errors made readable."""

from __future__ import annotations

import ipaddress
import math
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import typer
from rich.console import Console

from troupe.runtime import AskTimeout, ConfigError, PeerLost, TroupeError, Unreachable
from troupe.runtime.errors import leaf_errors
from troupe.runtime.node.config import (
    DEFAULT_NODE_ENDPOINT,
    RUN_MASTER_ENDPOINT,
    RUN_NODE_ENDPOINT,
    check_endpoint,
)
from troupe.runtime.process_identity import user_name
from troupe.runtime.start_limits import limit_reached

from .cli_runtime import cli_runtime
from .literal import literal, markup
from .master_client import (
    PROBE_S,
    handshake_failed,
    keys_hint,
    not_troupe,
    probe,
    reachable,
    silence,
    what_to_do,
)
from .stop_signals import StopSignals, exit_status

__all__ = ["control", "endpoint_option", "err_console", "fail", "node_status", "run_async", "seconds_option"]

T = TypeVar("T")

err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` as one error line and return the Exit to raise.

    The message is shown as given: it often quotes the user (a TOML key, a path), and text
    like ``[/x]`` must not be read as rich markup nor wrapped onto a second line.
    """
    err_console.print(markup("[bold red]error:[/] ", literal(message)), highlight=False, soft_wrap=True)
    return typer.Exit(code)


def endpoint_option(param: typer.CallbackParam, value: str | None) -> str | None:
    """The callback of an endpoint option (``--node``, ``--master``): one that is not
    tcp://HOST:PORT (a port past 65535, a missing slash) is refused in one line, exit 2, before
    anything connects (it crashed the connect with a traceback)."""
    if value is None:
        return None
    option = param.opts[0] if param.opts else param.name
    try:
        check_endpoint(value)
    except ValueError as exc:
        raise fail(f"{option}: {exc}", 2) from None
    unresolved = _unresolved_host(value)
    if unresolved is not None:  # it said "no node answers", as if the host were down
        raise fail(f"{option}: {value}: {unresolved}", 2)
    return value


def _unresolved_host(endpoint: str) -> str | None:
    """Why the host of a tcp ``endpoint`` names no address (a typo in a host name), or None."""
    parts = urlsplit(endpoint)
    host = parts.hostname
    if parts.scheme != "tcp" or not host or host in ("*", "localhost"):
        return None
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"the host name {host!r} does not resolve ({exc}); check its spelling"
    return None


def within(unit: str, most: float = math.inf) -> Callable[[typer.CallbackParam, float | None], float | None]:
    """The callback of a float option: a finite number above 0 (and at most ``most`` ``unit``,
    where given), else one line, exit 2. It names the bound the value broke: ``inf`` is above
    0, but not finite (``bench scale --median-ms 1e300`` was taken, and slept)."""
    bound = (
        f"a finite number of {unit} above 0"
        if most == math.inf
        else f"a number of {unit} above 0 and at most {most:,g}"
    )

    def check(param: typer.CallbackParam, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and 0 < value <= most):
            name = param.opts[0] if param.opts else param.name
            raise fail(f"{name} must be {bound}, got {value}", 2)
        return value

    return check


# A seconds option (--timeout): --timeout -1 waited no time and blamed the node for not answering.
seconds_option = within("seconds")


def run_async(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    reader: bool = False,
    done_if_returned: bool = False,
) -> T:
    """Run ``fn`` on uvloop; troupe errors become one clear line and exit status 1 (2 for bad
    input), also when a task group wrapped them, and so does a lone failed process or thread
    start (a process or memory limit reached: ``start_limits.limit_reached``), exit 1.

    SIGINT, SIGTERM or SIGHUP cancels ``fn``, which stops what it started in its clean-up (so
    ``fn`` closes what it opened itself), then the process exits 130, 143 or 129 at once; a
    second Ctrl-C or SIGTERM kills this process's whole tree and exits at once
    (:mod:`troupe.cli.stop_signals`).

    ``reader``: the command has nothing to stop (it follows or shows what others do): a signal
    ends it without the "stopping gracefully" line. ``done_if_returned``: ``fn`` returns a value
    only once its work is done (a stop that stops it raises): where it returns although a signal
    came, the signal came too late to stop anything (``troupe run`` whose dataset was complete
    when it came), and the command ends as it would have without it; a signal after that, as
    the process winds down, is ignored (exit 0).
    """
    signals = StopSignals(quiet=reader)
    box: list[T] = []
    failure: list[BaseException] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            work = anyio.CancelScope()
            await tg.start(signals.watch, work)
            try:
                with work:
                    box.append(await fn(*args))
                    signals.work_done = done_if_returned  # a signal from now on is ignored
            except BaseException as exc:  # raised as it is, not wrapped in this group's
                failure.append(exc)
            tg.cancel_scope.cancel()  # stop watching
        if failure:
            raise failure[0]

    try:
        anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
    except KeyboardInterrupt:  # Ctrl-C before the watcher was listening
        raise typer.Exit(exit_status(signal.SIGINT)) from None
    except BaseException as exc:
        if signals.exit_status is not None:  # a failure of the stop itself: the signal says why
            signals.exit()
        leaves = leaf_errors(exc)
        exits = [e for e in leaves if isinstance(e, typer.Exit)]
        if exits:  # a command's own fail(...) from inside a task group
            raise exits[0] from None
        limit = limit_reached(leaves[0]) if len(leaves) == 1 else None
        if limit is not None:  # a process or thread limit reached: a hundred lines of traceback
            raise fail(limit) from None
        if not all(isinstance(e, TroupeError) for e in leaves):
            raise
        error = next((e for e in leaves if isinstance(e, ConfigError)), leaves[0])
        raise fail(str(error), 2 if isinstance(error, ConfigError) else 1) from None
    # Stopped, ``fn`` returned nothing (its scope took the stop), unless it had done its work
    # before the stop could stop it.
    if signals.exit_status is not None and not (box and done_if_returned):
        signals.exit()
    return box[0]


async def control(endpoint: str, msg_type: str, payload: Any = None, timeout: float = 5.0) -> Any:
    """Send one control message to the node at ``endpoint`` and return its reply.

    Nothing listening is reported at once: ZeroMQ would retry a refused connection quietly
    until the timeout, so a plain TCP connect (answered by the kernel, busy node or not) is
    tried first.

    Raises:
        Unreachable: nothing listens at ``endpoint``.
        TroupeError: with a message that says what to do when no node answers.
    """
    found = await anyio.to_thread.run_sync(probe, endpoint, "node", PROBE_S)
    if (absent := found.absent) is not None:
        if endpoint == DEFAULT_NODE_ENDPOINT and await anyio.to_thread.run_sync(
            reachable, RUN_NODE_ENDPOINT, PROBE_S
        ):  # no --node, and a `troupe run` started its own node: what a user who ran one looks for
            other = await _other_user_s(RUN_NODE_ENDPOINT)
            if other is not None:  # on a shared host: not the caller's run, whatever it is called
                raise Unreachable(
                    f"no node answers at {endpoint}; a node of user {other} listens at "
                    f"{RUN_NODE_ENDPOINT} (their `troupe run`'s): a run of yours that found it "
                    "taken said where its node listens; pass that as --node"
                )
            raise Unreachable(
                f"no node answers at {endpoint}; a node listens at {RUN_NODE_ENDPOINT}, where "
                f"`troupe run` starts its own: pass --node {RUN_NODE_ENDPOINT} (and --master "
                f"{RUN_MASTER_ENDPOINT} for its master's view)"
            )
        raise Unreachable(what_to_do(absent, "start one with `troupe node start` or pass --node ENDPOINT"))
    async with cli_runtime() as runtime:
        try:
            return await runtime.control(endpoint, msg_type, payload, timeout=timeout)
        except PeerLost:  # it was there, and went before it answered
            raise PeerLost(
                f"the node at {endpoint} went away before it answered (it stopped or died); start "
                "it again with `troupe node start` or pass --node ENDPOINT"
            ) from None
        except Unreachable as exc:  # a handshake failed for keys: unless no ZeroMQ peer listens
            why = await anyio.to_thread.run_sync(handshake_failed, endpoint, "node", found.connect_s, exc)
            raise Unreachable(why) from None
        except AskTimeout:
            other = await anyio.to_thread.run_sync(not_troupe, endpoint, "node", found.connect_s)
            if other is not None:
                raise AskTimeout(other) from None
            raise AskTimeout(
                f"the node at {endpoint} did not answer within {timeout}s: "
                f"{silence(found.connect_s, timeout)}{keys_hint()}"
            ) from None


async def _other_user_s(endpoint: str) -> str | None:
    """The user the node at ``endpoint`` runs as, where it is not this process's (its ``ping``
    says); None where it is ours, or cannot say (an older node, no answer in a second)."""
    try:
        async with cli_runtime() as runtime:
            reply = await runtime.control(endpoint, "ping", None, timeout=1.0)
    except TroupeError:
        return None
    user = reply.get("user") if isinstance(reply, dict) else None
    return user if isinstance(user, str) and user != user_name() else None


async def node_status(endpoint: str, timeout: float) -> dict[str, Any]:
    """The node's ``status`` reply.

    Raises:
        TroupeError: as ``control``; or what answered is no node (a master given as --node):
            said in one line, where the reply's missing fields made a KeyError.
    """
    reply = await control(endpoint, "status", None, timeout)
    if not (isinstance(reply, dict) and "node" in reply and "workers" in reply):
        raise TroupeError(f"{endpoint} answered, but not as a node{_as_master(reply)}")
    return reply


def _as_master(reply: Any) -> str:
    if isinstance(reply, dict) and "master" in reply:
        return ": it is a master (give it as --master; --node takes a node's endpoint)"
    return " (--node takes a node's endpoint)"
