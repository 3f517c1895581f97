"""The CLI's way of talking to the master: its calls, and why one was not answered. The look
at an endpoint first is :mod:`.endpoint_probe`'s, the tables its replies are shown in
:mod:`.master_tables`' (both re-exported here, where the commands import them from).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import anyio

from troupe.runtime import AskTimeout, PeerLost, TroupeError, UnknownMessageType, Unreachable
from troupe.runtime.node.config import RUN_MASTER_ENDPOINT
from troupe.runtime.security.process import installed
from troupe.runtime.tasks.master.master_config import DEFAULT_MASTER_ENDPOINT

from .cli_runtime import cli_runtime
from .endpoint_probe import (
    PROBE_S,
    Probe,
    nobody_listens,
    probe,
    reachable,
    unreachable_why,
    what_to_do,
)
from .literal import literal
from .master_tables import jobs_table, jobs_tables, live_figures, master_tables, waiting_table
from .stop_signals import say_stopping
from .zmtp_greeting import GREETING_S, Greeting, greeting, mechanism

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime

__all__ = [
    "PROBE_S",
    "SLOW_CONNECT_S",
    "Probe",
    "absent_master",
    "answered_not_as",
    "handshake_failed",
    "jobs_table",
    "jobs_tables",
    "keys_hint",
    "live_figures",
    "master_call",
    "master_status",
    "master_tables",
    "nobody_listens",
    "node_name_problem",
    "not_troupe",
    "probe",
    "reachable",
    "silence",
    "submit_job",
    "unreachable_why",
    "waiting_table",
    "what_to_do",
]

_PING_S = 2.0  # the look at what answered a control it does not know: a master, or a node


def absent_master(master: str) -> str | None:
    """Why a view leaves the master out, where one was named (``--master`` or
    ``$TROUPE_MASTER`` other than the default) and nothing listens there; None otherwise (no
    master at the default endpoint is no news: nodes run without one)."""
    if master == DEFAULT_MASTER_ENDPOINT or reachable(master):
        return None
    return f"no master answers at {master}: its view is left out"


def keys_hint() -> str:
    """What to add to "nobody answers": CURVE on one side only is silence, and so are keys of
    another cluster (which the keyed side logs as ``peer_refused``; a side without keys logs
    nothing)."""
    if installed() is not None:
        return (
            " (or it runs without CURVE keys: drop --keys; or the keys given are not authorised "
            "there: see its log)"
        )
    return "; a cluster with CURVE keys answers only with --keys DIR"


_WENT = "it went away before it answered: it stopped or died"


def _silent(exc: AskTimeout, waited_s: float, what: str = "reply") -> str:
    """Why no reply came: the master went mid-call (PeerLost), or ``waited_s`` passed."""
    return _WENT if isinstance(exc, PeerLost) else f"no {what} within {waited_s}s"


def _no_master(endpoint: str, why: str, found: Probe, timeout: float) -> str:
    if why != _WENT and (other := not_troupe(endpoint, "master", found.connect_s)) is not None:
        return other
    if why != _WENT:  # something listens there, and said nothing
        return (
            f"the master at {endpoint} did not answer ({why}): "
            f"{silence(found.connect_s, timeout)}{keys_hint()}"
        )
    return _start_one(endpoint, f"no master answers at {endpoint} ({why})")


def _start_one(endpoint: str, absent: str) -> str:
    """``absent`` (:func:`unreachable_why`'s clause), and what to do: with no --master, where
    a `troupe run` listens at its own default, point there (as ``ctl status`` does to its node)."""
    if endpoint == DEFAULT_MASTER_ENDPOINT and reachable(RUN_MASTER_ENDPOINT):
        return (
            f"{absent}; a master listens at {RUN_MASTER_ENDPOINT}, where `troupe run` starts its "
            f"own: pass --master {RUN_MASTER_ENDPOINT}"
        )
    return what_to_do(
        absent,
        "start one with `troupe master start` (or `troupe node start --with-master`), "
        "or pass --master ENDPOINT",
    )


SILENT = "it accepts connections, so it runs, but it is busy, paused (SIGSTOP) or hung; see its log"
"""Why a process that listens did not answer: not a reason to start another."""


def handshake_failed(endpoint: str, what: str, connect_s: float, exc: Exception) -> str:
    """Why the handshake with the ``what`` at ``endpoint`` failed: no ZeroMQ peer there
    (:func:`not_troupe`); one that runs without CURVE keys where this command has some (its
    greeting offers NULL: it was told of a rotated key, report kl 5); else ``exc``'s words."""
    other = not_troupe(endpoint, what, connect_s)
    if other is not None:
        return other
    keys = installed()
    if keys is not None and mechanism(endpoint, connect_s) == "NULL":
        return (
            f"the {what} at {endpoint} runs without CURVE keys (its handshake offers none), and this "
            f"command uses the keys in {keys.directory}: leave out --keys (and $TROUPE_KEYS) to talk "
            f"to it, or start that {what} with the cluster's keys"
        )
    return str(exc)


def not_troupe(endpoint: str, what: str, connect_s: float = 0.0) -> str | None:
    """Why the silent process at ``endpoint`` is no troupe ``what`` (node, master), from the
    first bytes it sends a raw connection (:mod:`zmtp_greeting`); None where it greets as a
    ZeroMQ peer does (a troupe process, busy or hung: :data:`SILENT`) or nothing can be told."""
    heard = greeting(endpoint, connect_s)
    if heard is Greeting.OTHER:
        return (
            f"what listens at {endpoint} answers, but is no troupe {what}: it does not speak "
            f"ZeroMQ (an HTTP server? a node's --metrics port?); pass the {what}'s endpoint"
        )
    if heard is Greeting.NONE:
        return (
            f"what listens at {endpoint} accepts connections, but sent no ZeroMQ greeting within "
            f"{GREETING_S + 2 * connect_s:.1f} s: it is no troupe {what} (an HTTP server? a node's "
            f"--metrics port?), or a troupe process paused (SIGSTOP); pass the {what}'s "
            "endpoint, or see that process's log"
        )
    return None


SLOW_CONNECT_S = 0.2
"""A connect that took this long crossed a slow link (a LAN's takes a millisecond, a continent's
tens): the silence that follows may be the link's, and :func:`silence` says so first."""
_ROUND_TRIPS = 6  # a new connection's before its first reply: TCP's, CURVE's handshake, the ask


def silence(connect_s: float, timeout: float) -> str:
    """Why a process that listens did not answer within ``timeout``: :data:`SILENT`, led by the
    link where the CLI's connect to it took ``connect_s``, :data:`SLOW_CONNECT_S` or more.

    Over a link of a second's round trip a new connection with CURVE keys answers its first ask
    after about seven seconds: the default 5 s blamed a hung process, or the keys.
    """
    if connect_s < SLOW_CONNECT_S:
        return SILENT
    longer = math.ceil(max(2 * timeout, 3 * _ROUND_TRIPS * connect_s) / 10) * 10
    return (
        f"the link to it may be slow: the connect alone took {connect_s:.1f} s, and a new "
        f"connection needs about {_ROUND_TRIPS} round trips before its first reply (TCP's and "
        f"CURVE's handshakes, then the ask): try --timeout {longer}; if it still does not "
        f"answer, {SILENT}"
    )


async def master_call(endpoint: str, msg_type: str, payload: Any = None, timeout: float = 10.0) -> Any:
    """Send one control message to the master and return its reply.

    Raises:
        Unreachable: nothing listens at ``endpoint``.
        AskTimeout: it did not answer in time.
        TroupeError: the master refused (unknown job, bad job file...), with its reason.
    """
    found = probe(endpoint, "master")
    if found.absent is not None:
        raise Unreachable(_start_one(endpoint, found.absent))
    async with cli_runtime() as runtime:
        try:
            return await runtime.control(endpoint, msg_type, payload, timeout=timeout)
        except AskTimeout as exc:
            if exc.from_reply:  # the master answered: an ask of its own timed out
                raise _masters_own(endpoint, msg_type, exc) from None
            raise type(exc)(_no_master(endpoint, _silent(exc, timeout), found, timeout)) from None
        except Unreachable as exc:  # a handshake failed for keys: unless no ZeroMQ peer listens
            raise Unreachable(handshake_failed(endpoint, "master", found.connect_s, exc)) from None
        except UnknownMessageType:  # a node given as --master: it knows no jobs, no submit
            older = await _answers_as_master(runtime, endpoint)
            raise (_older_master if older else _not_a_master)(endpoint, msg_type) from None


def _masters_own(endpoint: str, msg_type: str, exc: AskTimeout) -> TroupeError:
    """The master's answer to ``msg_type`` was that an ask of its own (of a node) timed out: it
    answers, so it is not the busy or hung master a timeout of the CLI's own ask would mean."""
    return TroupeError(
        f"the master at {endpoint} answered {msg_type!r} with an error of its own (it runs; an "
        f"ask it made timed out): {exc}; see `troupe ctl status` and the master's log"
    )


async def _answers_as_master(runtime: Runtime, endpoint: str) -> bool:
    """Whether ``endpoint`` answers a ping as a master does (``{master, pid}``)."""
    try:
        reply = await runtime.control(endpoint, "ping", None, timeout=_PING_S)
    except TroupeError:
        return False
    return isinstance(reply, dict) and "master" in reply


def _not_a_master(endpoint: str, msg_type: str) -> UnknownMessageType:
    return UnknownMessageType(
        f"{endpoint} is not a master: it has no {msg_type!r} (a node? --master takes the "
        "master's endpoint, --node a node's)"
    )


def _older_master(endpoint: str, msg_type: str) -> UnknownMessageType:
    """A master of a troupe from before ``msg_type`` (``retry_dead``, say): said as such, where
    "not a master" sent its operator looking for another endpoint."""
    return UnknownMessageType(
        f"the master at {endpoint} has no {msg_type!r}: it runs an older troupe than this command; "
        "upgrade it (README: Upgrading a cluster)"
    )


async def node_name_problem(master: str, name: str, endpoint: str, timeout: float = 2.0) -> str | None:
    """Why a node named ``name`` at ``endpoint`` must not join ``master``: the master runs
    under that name, or another node answers under it and the master has it alive (the second
    node of a name took the first one's workers at the master; either one shares a log file,
    ``<name>.jsonl``, with the first). None when no other does, or when the master cannot say
    now (the node waits for it then, as it does anyway)."""
    if not reachable(master):
        return None
    try:
        async with cli_runtime() as runtime:
            status = await runtime.control(master, "status", None, timeout=timeout)
            if isinstance(status, dict) and status.get("master") == name:
                return (
                    f"node name {name!r} is the name of the master at {master}: both would log "
                    f"to one {name}.jsonl; give this node another --name"
                )
            nodes = status.get("nodes", []) if isinstance(status, dict) else []
            for node in nodes:
                other = node.get("endpoint") if isinstance(node, dict) else None
                if node.get("node") != name or not node.get("alive") or not other or other == endpoint:
                    continue
                try:
                    reply = await runtime.control(other, "ping", None, timeout=timeout)
                except TroupeError:
                    return None  # it is gone: the master will have it dead soon
                if isinstance(reply, dict) and reply.get("node") == name:
                    return (
                        f"node name {name!r} is taken: the node at {other} (pid {reply.get('pid')}) runs "
                        f"under it, joined to {master}; give this node another --name"
                    )
    except TroupeError:
        return None
    return None


def answered_not_as(endpoint: str, what: str) -> TroupeError:
    """``ENDPOINT answered, but not as WHAT``: something answered, and not as the CLI expects
    (a node given as --master; a reply of another shape, ``reply_shape.py``)."""
    return TroupeError(f"{endpoint} answered, but not as {what}")


async def master_status(endpoint: str, timeout: float) -> dict[str, Any]:
    """The master's ``status`` reply.

    Raises:
        TroupeError: as ``master_call``; or what answered is no master (a node given as
            --master), said in one line.
    """
    reply = await master_call(endpoint, "status", None, timeout)
    if not (isinstance(reply, dict) and "master" in reply and "jobs" in reply):
        raise answered_not_as(endpoint, "a master (a node? --master takes the master's endpoint)")
    # The code each runs (runtime/code_identity.py): null where an older master or node did not
    # say it, in --json as in the tables, rather than a key that is there or not.
    reply.setdefault("code", None)
    for node in reply.get("nodes") or ():
        if isinstance(node, dict):
            node.setdefault("code", None)
    return reply


async def submit_job(endpoint: str, payload: dict[str, Any], timeout: float) -> Any:
    """Submit a job: check that the master answers, then wait up to ``timeout`` for it.

    The check is a ping, bounded by ``timeout`` too: over a slow link a new connection's first
    reply takes seconds (CURVE's handshake), and a cap of 5 s failed submits that ``--timeout
    60`` would have let through. A very large job takes the master a while to check and
    journal; a timeout of the submit then means that it is still writing, not that nobody
    answers (asked again on the connection made, a ping says which). Submitting the same job
    again is safe: the master answers ``already: true`` for the same id with the same content.

    Raises:
        Unreachable: nothing listens at ``endpoint``.
        AskTimeout: no master answered the ping, or the submit's reply did not come in time
            (the message says which, and what to do).
        TroupeError: the master refused the job, with its reason.
    """
    found = probe(endpoint, "master")
    if found.absent is not None:
        raise Unreachable(_start_one(endpoint, found.absent))
    job = payload.get("job_id") or (payload.get("job") or {}).get("job", {}).get("name")
    async with cli_runtime() as runtime:
        try:
            pong = await runtime.control(endpoint, "ping", None, timeout=timeout)
        except AskTimeout as exc:
            why = _silent(exc, timeout, "reply to a ping")
            raise type(exc)(_no_master(endpoint, why, found, timeout)) from None
        if not (isinstance(pong, dict) and "master" in pong):  # a node answers a ping too
            raise _not_a_master(endpoint, "submit")
        sent_at = anyio.current_time()
        lost = False
        try:
            return await runtime.control(endpoint, "submit", payload, timeout=timeout)
        except PeerLost:
            lost = True  # the connection ended before the reply: the master died, or restarted
        except AskTimeout:
            pass
        except anyio.get_cancelled_exc_class():  # Ctrl-C: the submit is out, and may be taken
            say_stopping(
                literal(
                    f"the submit of job {job} was sent: the master may have it (`troupe ctl jobs` "
                    "shows it); submitting the same file again is safe"
                )
            )
            raise
        again = (
            "submitting the same file again is safe: the master says when it already has it, "
            "and its journal holds all of a job or none of it"
        )
        # Said as it is known: the seconds waited (a lost connection ends the wait early), and
        # that the master may or may not have the job (it journals a job whole, or not at all).
        waited = anyio.current_time() - sent_at
        what = (
            f"the connection to the master at {endpoint} ended {waited:.1f}s into the submit of job {job!r}"
            if lost
            else f"the master at {endpoint} has not answered the submit of job {job!r} in {waited:.1f}s"
        )
        try:  # on the connection the first ping made: a round trip, not a handshake
            await runtime.control(endpoint, "ping", None, timeout=min(timeout, 5.0))
        except AskTimeout:
            raise AskTimeout(
                f"{what}, nor a ping since: it may have stopped (see its log) or still be taking in a "
                f"very large job, and may or may not have the job; once it answers, check with "
                f"`troupe ctl jobs` ({again})"
            ) from None
        if lost:
            raise AskTimeout(
                f"{what}; it answers again (restarted?) and may or may not have the job: check with "
                f"`troupe ctl jobs` ({again})"
            )
        raise AskTimeout(
            f"the master at {endpoint} answers, but is still writing job {job!r} after "
            f"{waited:.1f}s; check with `troupe ctl jobs` ({again})"
        )
