"""A runtime for programs that are not workers: the CLI, tests, a trainer's driver script.

``connect`` gives a runtime with no actors of its own whose names resolve through a node, so a
plain script can ``ask`` any actor of the cluster.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from troupe.runtime.errors import AskTimeout, ConfigError, TroupeError, Unreachable
from troupe.runtime.security.process import KEYS_ENV, installed, keys_for
from troupe.runtime.transports.endpoint_form import check_endpoint
from troupe.runtime.wire.codec import Codec

from .directory import Directory
from .ref import ActorAddress
from .runtime import Runtime, process_runtime

__all__ = ["answers", "connect"]


@asynccontextmanager
async def connect(
    node_endpoint: str,
    node: str = "",
    name: str | None = None,
    keys: str | os.PathLike[str] | None = None,
    identity: str | None = None,
    env_keys: bool = True,
    codec: Codec | None = None,
    bind: str = "tcp://127.0.0.1:*",
) -> AsyncIterator[Runtime]:
    """Open a client runtime that resolves names through the node at ``node_endpoint``.

    Args:
        node_endpoint: the node's control endpoint.
        node: the node's name, when known (fills in ``process/actor`` addresses).
        name: this client's process name (default ``client-<pid>``).
        keys: a CURVE keys directory, for a cluster with keys: the client presents its
            operator key (else its reader key, else the cluster's). Default: the process's
            keys if it installed some, else ``$TROUPE_KEYS`` if set, else no CURVE.
        identity: the pair of ``keys`` to present and serve with (``cluster``, a name such as
            ``operator-alice``); default the client's choice, as described for ``keys``.
        env_keys: False where the node was started keyless by this process (a one-host
            ``troupe run``'s, the demo's): ``$TROUPE_KEYS`` is then some cluster's, and a CURVE
            client of a keyless node waits out every call in silence.
        codec: the client's wire codec, its message limits (default: 64 MiB, 1024 frames); a
            pipeline's engine takes the pipeline's ``max_message_mb``.
        bind: where the client's own mailbox listens, for peers that call it back (a cluster
            run's master: ``pipeline/run_keys.py``); default a free loopback port.

    Raises:
        ConfigError: ``node_endpoint`` is no endpoint to connect to (``tcp://HOST:PORT``); the
            keys cannot be loaded (or libzmq lacks CURVE).
    """
    _check_connectable(node_endpoint)
    given = keys
    if keys is None and installed() is None and env_keys:
        keys = os.environ.get(KEYS_ENV) or None
    security = keys_for(keys, identity) if keys is not None else None
    box: list[Runtime] = []
    directory = Directory(node)

    async def lookup(address: ActorAddress) -> tuple[ActorAddress, str]:
        try:
            reply = await box[0].control(node_endpoint, "resolve", {"address": str(address)})
        except AskTimeout as exc:
            if not directory.silence_hint or type(exc) is not AskTimeout:  # PeerLost: it answered
                raise
            raise AskTimeout(f"{exc}{directory.silence_hint}") from None
        except Unreachable as exc:  # a handshake refused for keys: say whose they are
            if not directory.silence_hint:  # no keys: nothing of keys to say
                raise
            where, without = _keys_origin(given, keys)
            raise Unreachable(
                f"{exc} (this client uses CURVE with {where}: {without} for a node without keys)"
            ) from None
        return ActorAddress.parse(reply["address"]), reply["endpoint"]

    directory.lookup = lookup
    if security is not None or installed() is not None:
        directory.silence_hint = _keys_hint(given, keys)
    runtime = process_runtime(
        node or "client",
        name or f"client-{os.getpid()}",
        directory=directory,
        bind=bind,
        drain_timeout=0.5,
        security=security,
        codec=codec,
    )
    box.append(runtime)
    async with runtime:
        yield runtime


def _keys_hint(given: object, keys: object) -> str:
    """What a CURVE client's "no answer" adds: a node without keys answers a CURVE client with
    silence, as one whose keys directory lacks this client's key does (it logs peer_refused)."""
    where, without = _keys_origin(given, keys)
    return (
        f" (or it runs without CURVE keys, and this client uses CURVE with {where}: {without} for "
        "a node without keys; or the keys are not authorised there: see its log)"
    )


def _keys_origin(given: object, keys: object) -> tuple[str, str]:
    """Where a CURVE client's keys came from, and how to go without them: ``$TROUPE_KEYS``
    from an operator's shell profile was used without a word."""
    if given is not None:
        return f"keys={str(given)!r}", "drop keys="
    if keys is not None:
        return f"${KEYS_ENV} ({keys})", "connect(..., env_keys=False), or unset it"
    return "this process's own keys", "connect from a process without keys"


def _check_connectable(endpoint: object) -> None:
    """Refuse an endpoint no connect can reach, at the call: ``127.0.0.1:7470`` ended as
    ``Unreachable: ... Invalid argument``, a caller's mistake said as the network's.

    Raises:
        ConfigError: it is not ``tcp://HOST:PORT`` (nor ``ipc://PATH``, ``inproc://NAME``), or
            names a wildcard (``*``), which only a bind takes.
    """
    if not isinstance(endpoint, str):
        shown = type(endpoint).__name__
        raise ConfigError(f"connect(): the node's endpoint must be a str like tcp://HOST:PORT, got {shown}")
    try:
        check_endpoint(endpoint)
    except ValueError as exc:
        raise ConfigError(f"connect(): {exc}") from None
    parts = urlsplit(endpoint)
    if parts.scheme == "tcp" and "*" in parts.netloc:
        raise ConfigError(
            f"connect(): endpoint {endpoint!r} names a wildcard (*): give the node's tcp://HOST:PORT"
        )


async def answers(runtime: Runtime, endpoint: str, timeout: float) -> bool:
    """Whether a process listens at ``endpoint``: it answers a ``ping`` within ``timeout``. An
    error reply is an answer too (a run's runtime has no ``ping``): it is there."""
    try:
        await runtime.control(endpoint, "ping", None, timeout=timeout)
    except (AskTimeout, Unreachable):
        return False
    except TroupeError:
        return True
    return True
