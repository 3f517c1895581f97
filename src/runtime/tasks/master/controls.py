"""The master's control payloads, decoded at the boundary into typed, frozen messages.

Each control the master answers (see :mod:`troupe.runtime.tasks.master.master` for the list)
has one class here; its ``decode`` reads the payload through
:class:`~troupe.runtime.core.control_payloads.ControlPayload`, so a payload that is not a map,
lacks a field or mistypes one is answered with the ``bad_request`` ERROR naming the control, the
field and the value sent, never a ``remote_error`` wrapping a ``KeyError`` from deep inside.
Handlers take what they need from these messages only.

Numbers: a ``float`` field takes any number, an ``int`` field refuses booleans and floats. An
optional field that is missing or nil takes its default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from troupe.runtime.core.control_payloads import ControlPayload, address_field, clipped
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.errors import BadRequest
from troupe.runtime.node.config import MAX_TAGS, check_name, check_tag
from troupe.runtime.tasks.state import MAX_PREFETCH

__all__ = [
    "MAX_RESOURCES",
    "MAX_WAIT_JOB_S",
    "CancelControl",
    "DeadControl",
    "DoneTasksControl",
    "NodeBeatControl",
    "NodeControl",
    "OwnerControl",
    "RegisterWorkerControl",
    "RenewControl",
    "ReportControl",
    "RequestTaskControl",
    "ResolveControl",
    "RetryDeadControl",
    "SubmitControl",
    "WaitJobControl",
    "WorkerLeftControl",
]

MAX_WAIT_JOB_S = 86_400.0
"""The longest a ``wait_job`` may wait: a day."""
MAX_RESOURCES = 64
"""Entries of a node beat's ``resources``."""
MAX_CODE_CHARS = 80
"""Characters of a node beat's ``code`` (``0.1.0+3f9a1c2e``: a version and a digest)."""


def _str_list(p: ControlPayload, key: str) -> list[str]:
    value = p.optional(key, list, [])
    for item in value:
        if type(item) is not str:
            raise BadRequest(
                f"control {p.control!r}: field {key!r} must be a list of str, "
                f"has {item!r} ({type(item).__name__})"
            )
    return list(value)


def _prefetch(p: ControlPayload) -> int:
    value: int = p.optional("prefetch", int, 0)
    if not 0 <= value <= MAX_PREFETCH:
        raise BadRequest(f"control {p.control!r}: field 'prefetch' must be 0..{MAX_PREFETCH}, has {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RegisterWorkerControl:
    """``register_worker {worker_id, node, endpoint, pid?, slots?, cpu?, gpu?, kinds?, prefetch?,
    process?}``.

    ``prefetch``: leases the worker may hold beyond its slots (0, the default: none).
    ``process``: the worker process's identity (``runtime/process_identity.py``; "" from older
    workers), in ``status`` for whoever can check it on its host.
    """

    worker_id: str
    node: str
    endpoint: str
    pid: int
    slots: int
    cpu: float
    gpu: int
    kinds: tuple[str, ...]
    prefetch: int = 0
    process: str = ""

    @classmethod
    def decode(cls, payload: Any) -> RegisterWorkerControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload("register_worker", payload)
        slots = p.optional("slots", int, 1)
        return cls(
            p.require("worker_id", str),
            p.require("node", str),
            p.require("endpoint", str),
            p.optional("pid", int, 0),
            slots,
            float(p.optional("cpu", float, slots)),
            p.optional("gpu", int, 0),
            tuple(_str_list(p, "kinds")),
            _prefetch(p),
            p.optional("process", str, ""),
        )


@dataclass(frozen=True, slots=True)
class RequestTaskControl:
    """``request_task {worker_id, free_slots, wait_s?, held?, sync?}``.

    ``held``: the lease ids the worker runs (None from a worker that does not say). ``sync``
    (with ``held``): a reply to one of its reports was lost, so any lease of the worker's not
    in ``held`` never reached it, whatever granted it.
    """

    worker_id: str
    free_slots: int
    wait_s: float
    held: frozenset[int] | None = None
    sync: bool = False

    @classmethod
    def decode(cls, payload: Any) -> RequestTaskControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload("request_task", payload)
        held = p.optional("held", list, None)
        if held is not None and any(type(lease) is not int for lease in held):
            bad = next(lease for lease in held if type(lease) is not int)
            raise BadRequest(f"control 'request_task': field 'held' must be a list of int, has {bad!r}")
        return cls(
            p.require("worker_id", str),
            p.require("free_slots", int),
            float(p.optional("wait_s", float, 0.0)),
            None if held is None else frozenset(held),
            p.optional("sync", bool, False),
        )


@dataclass(frozen=True, slots=True)
class RenewControl:
    """``renew {worker_id, task_id, lease_id, more?, node?, pid?}``.

    ``more``: further ``[task_id, lease_id]`` pairs the worker holds, renewed by the same
    message (a worker holding leases ahead renews them all at once). ``node``: the worker's
    node; a restarted master that does not know the worker yet requeues the leases it names
    when that node dies (empty: a worker of before it, whose leases then expire). ``pid``: the
    worker's process; another process registering under its name requeues them (0: not said).
    """

    worker_id: str
    task_id: str
    lease_id: int
    more: tuple[tuple[str, int], ...] = ()
    node: str = ""
    pid: int = 0

    @classmethod
    def decode(cls, payload: Any) -> RenewControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload("renew", payload)
        more = []
        for pair in p.optional("more", list, []):
            if not (
                isinstance(pair, list | tuple)
                and len(pair) == 2
                and type(pair[0]) is str
                and type(pair[1]) is int
            ):
                raise BadRequest(
                    f"control 'renew': field 'more' must be a list of [task_id, lease_id], has {pair!r}"
                )
            more.append((pair[0], pair[1]))
        return cls(
            p.require("worker_id", str),
            p.require("task_id", str),
            p.require("lease_id", int),
            tuple(more),
            p.optional("node", str, ""),
            p.optional("pid", int, 0),
        )


@dataclass(frozen=True, slots=True)
class ReportControl:
    """``complete``, ``fail`` and ``decline``: ``{worker_id, task_id, lease_id, request?, ...}``.

    ``result_ref`` (complete), ``error`` and ``traceback`` (fail), ``reason`` and ``kind``
    (decline) are optional strings, empty when missing. ``given_back`` (decline): a prefetched
    lease that waited too long, returned unrun. ``run_s`` (complete): how long the copy ran.
    """

    control: str
    worker_id: str
    task_id: str
    lease_id: int
    request: int
    result_ref: str = ""
    error: str = ""
    traceback: str = ""
    reason: str = ""
    kind: str = ""
    given_back: bool = False
    run_s: float | None = None

    @classmethod
    def decode(cls, control: str, payload: Any) -> ReportControl:
        """Raises: BadRequest: see the module."""
        # A worker reports every task: a payload whose every field is plainly right is read
        # here at a third of the cost; anything else takes the checked path, errors included.
        if type(payload) is dict and _plain_report(payload):
            get = payload.get
            run_s = get("run_s")
            return cls(
                control,
                payload["worker_id"],
                payload["task_id"],
                payload["lease_id"],
                get("request") or 0,
                get("result_ref") or "",
                get("error") or "",
                get("traceback") or "",
                get("reason") or "",
                get("kind") or "",
                get("given_back") or False,
                None if run_s is None else float(run_s),
            )
        return cls.decode_checked(control, payload)

    @classmethod
    def decode_checked(cls, control: str, payload: Any) -> ReportControl:
        """``decode`` by the field-by-field path (every payload, good or bad, reads alike).

        Raises: BadRequest: see the module."""
        p = ControlPayload(control, payload)
        text = {
            key: p.optional(key, str, "") for key in ("result_ref", "error", "traceback", "reason", "kind")
        }
        return cls(
            control,
            p.require("worker_id", str),
            p.require("task_id", str),
            p.require("lease_id", int),
            p.optional("request", int, 0),
            **text,
            given_back=p.optional("given_back", bool, False),
            run_s=_run_s(p),
        )


_REPORT_FIELDS: dict[str, type] = {
    "worker_id": str,
    "task_id": str,
    "lease_id": int,
    "request": int,
    "result_ref": str,
    "error": str,
    "traceback": str,
    "reason": str,
    "kind": str,
    "given_back": bool,
    "run_s": float,
}
_REPORT_REQUIRED = ("worker_id", "task_id", "lease_id")


def _plain_report(payload: dict[Any, Any]) -> bool:
    """Whether every field of a report is of its exact type (nil for an optional one), the
    required ones present and ``run_s`` in range: then ReportControl.decode_checked would
    accept it as it is."""
    for key, value in payload.items():
        kind = _REPORT_FIELDS.get(key)
        if kind is None or value is None:  # a field no report has is ignored, nil is "missing"
            continue
        if type(value) is not kind and not (kind is float and type(value) is int):
            return False
    run_s = payload.get("run_s")
    if run_s is not None and not 0.0 <= run_s < float("inf"):
        return False
    return all(payload.get(key) is not None for key in _REPORT_REQUIRED)


def _run_s(p: ControlPayload) -> float | None:
    value = p.optional("run_s", float, None)
    if value is None:
        return None
    if not 0.0 <= value < float("inf"):
        raise BadRequest(f"control {p.control!r}: field 'run_s' must be a number >= 0, has {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class NodeBeatControl:
    """``node_beat {node, endpoint?, resources?, processes?, log_endpoint?, tags?, code?,
    drained?, undrain_token?, process?}``.

    ``processes`` maps each running process of the node to ``{endpoint, actors: {actor:
    endpoint}}`` (the cluster's directory of names); None when the beat does not list them.
    ``tags``: what the node offers replicas; none from older nodes.
    ``code``: the troupe code the node runs (``runtime/code_identity.py``); "" from older nodes.
    ``drained``: the node is drained (``master_drained`` came, no ``master_undrained`` since);
    ``undrain_token``: the token of the last ``master_undrained`` it took ("" if none). False
    and "" from older nodes.
    ``process``: the node process's identity (``process_identity``): another process beating
    under the name of a live node is a second node of that name; "" from older nodes.
    """

    node: str
    endpoint: str
    resources: dict[str, Any]
    processes: dict[str, tuple[str, dict[str, str]]] | None = None
    log_endpoint: str = ""  # where the node publishes its log stream; "" from older nodes
    tags: tuple[str, ...] = ()
    code: str = ""
    drained: bool = False
    undrain_token: str = ""
    process: str = ""

    @classmethod
    def decode(cls, payload: Any) -> NodeBeatControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload("node_beat", payload)
        raw = p.optional("processes", dict, None)
        processes = None
        if raw is not None:
            processes = {}
            for name, entry in raw.items():
                if type(name) is not str or not isinstance(entry, dict):
                    raise BadRequest(
                        f"control 'node_beat': field 'processes' must map a process name to "
                        f"{{endpoint, actors}}, has {name!r}: {type(entry).__name__}"
                    )
                e = ControlPayload("node_beat", entry)
                processes[name] = (e.require("endpoint", str), e.map_of_str("actors", False))
        return cls(
            _node_name(p),
            p.optional("endpoint", str, ""),
            _resources(p),
            processes,
            p.optional("log_endpoint", str, ""),
            _tags(p),
            _code(p),
            p.optional("drained", bool, False),
            _undrain_token(p),
            _process(p),
        )


def _node_name(p: ControlPayload) -> str:
    """A beat's node name, as ``[node] name`` allows: the master's status prints it in a table."""
    try:
        return check_name(p.require("node", str), "node name", shown=80)
    except ValueError as exc:
        raise BadRequest(f"control {p.control!r}: field 'node': {exc}") from None


def _resources(p: ControlPayload) -> dict[str, Any]:
    """A beat's resources: counts and amounts, each a finite number >= 0 (``host_resources``)."""
    resources = dict(p.optional("resources", dict, {}))
    if len(resources) > MAX_RESOURCES:
        raise BadRequest(f"control {p.control!r}: field 'resources' has more than {MAX_RESOURCES} entries")
    for key, value in resources.items():
        number = type(value) in (int, float) and math.isfinite(value) and value >= 0
        if type(key) is not str or not number:
            raise BadRequest(
                f"control {p.control!r}: field 'resources' must map names to finite numbers >= 0, "
                f"has {clipped(key)}: {clipped(value)}"
            )
    return resources


def _code(p: ControlPayload) -> str:
    """A beat's code identity: short text, as ``ctl status`` prints it in a cell."""
    return _short_text(p, "code", MAX_CODE_CHARS)


def _process(p: ControlPayload) -> str:
    """A beat's process identity: short text, compared only."""
    return _short_text(p, "process", MAX_PROCESS_CHARS)


def _short_text(p: ControlPayload, name: str, most: int) -> str:
    text: str = p.optional(name, str, "")
    if len(text) > most or not text.isprintable():
        raise BadRequest(
            f"control {p.control!r}: field {name!r} must be printable, at most {most} "
            f"characters, has {clipped(text)}"
        )
    return text


MAX_PROCESS_CHARS = 200
"""Characters of a beat's ``process`` (``process_identity`` makes about 80)."""

MAX_TOKEN_CHARS = 64
"""Characters of a beat's ``undrain_token`` (the master makes 32)."""


def _undrain_token(p: ControlPayload) -> str:
    token: str = p.optional("undrain_token", str, "")
    if len(token) > MAX_TOKEN_CHARS:
        raise BadRequest(
            f"control {p.control!r}: field 'undrain_token' must be at most {MAX_TOKEN_CHARS} characters"
        )
    return token


def _tags(p: ControlPayload) -> tuple[str, ...]:
    """A beat's tags: names, as ``[node] tags`` allows (a label of every node's row)."""
    tags = _str_list(p, "tags")
    try:
        if len(tags) > MAX_TAGS:
            raise ValueError(f"at most {MAX_TAGS} tags, got {len(tags)}")
        return tuple(check_tag(tag) for tag in tags)
    except ValueError as exc:
        raise BadRequest(f"control {p.control!r}: field 'tags': {exc}") from None


@dataclass(frozen=True, slots=True)
class ResolveControl:
    """``resolve {address}``: an actor address (``actor``, ``process/actor``, ``node/process/actor``)."""

    address: ActorAddress

    @classmethod
    def decode(cls, payload: Any) -> ResolveControl:
        """Raises: BadRequest: see the module."""
        return cls(address_field(ControlPayload("resolve", payload), "address"))


@dataclass(frozen=True, slots=True)
class WorkerLeftControl:
    """``worker_left {worker_id, pid?, reason?}``."""

    worker_id: str
    pid: int
    reason: str

    @classmethod
    def decode(cls, payload: Any) -> WorkerLeftControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload("worker_left", payload)
        return cls(p.require("worker_id", str), p.optional("pid", int, 0), p.optional("reason", str, ""))


@dataclass(frozen=True, slots=True)
class OwnerControl:
    """``owner_beat``, ``owner_seen`` and ``owner_gone``: ``{owner}`` (a run's token, ``run_owners.py``)."""

    owner: str

    @classmethod
    def decode(cls, msg_type: str, payload: Any) -> OwnerControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload(msg_type, payload)
        owner = p.require("owner", str)
        if not owner or len(owner) > _OWNER_MOST:
            raise BadRequest(f"{msg_type}: owner must be 1 to {_OWNER_MOST} characters, got {len(owner)}")
        return cls(owner)


_OWNER_MOST = 200


@dataclass(frozen=True, slots=True)
class NodeControl:
    """``node_dead``, ``node_left``, ``drain`` and ``undrain``: ``{node}``."""

    node: str

    @classmethod
    def decode(cls, control: str, payload: Any) -> NodeControl:
        """Raises: BadRequest: see the module."""
        return cls(ControlPayload(control, payload).require("node", str))


@dataclass(frozen=True, slots=True)
class SubmitControl:
    """``submit {job: <job TOML as a map>, source?, job_id?}``."""

    job: dict[str, Any]
    source: str
    job_id: str | None

    @classmethod
    def decode(cls, payload: Any) -> SubmitControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload("submit", payload)
        return cls(
            p.require("job", dict),
            p.optional("source", str, "") or "<submitted job>",
            p.optional("job_id", str, "") or None,
        )


@dataclass(frozen=True, slots=True)
class CancelControl:
    """``cancel {job_id}``."""

    job_id: str

    @classmethod
    def decode(cls, payload: Any) -> CancelControl:
        """Raises: BadRequest: see the module."""
        return cls(ControlPayload("cancel", payload).require("job_id", str))


@dataclass(frozen=True, slots=True)
class RetryDeadControl:
    """``retry_dead {job_id}``."""

    job_id: str

    @classmethod
    def decode(cls, payload: Any) -> RetryDeadControl:
        """Raises: BadRequest: see the module."""
        return cls(ControlPayload("retry_dead", payload).require("job_id", str))


@dataclass(frozen=True, slots=True)
class DeadControl:
    """``dead {job_id}``."""

    job_id: str

    @classmethod
    def decode(cls, payload: Any) -> DeadControl:
        """Raises: BadRequest: see the module."""
        return cls(ControlPayload("dead", payload).require("job_id", str))


@dataclass(frozen=True, slots=True)
class DoneTasksControl:
    """``done_tasks {job_id, task_ids}``: which of these tasks are done, with their result refs."""

    job_id: str
    task_ids: tuple[str, ...]

    @classmethod
    def decode(cls, payload: Any) -> DoneTasksControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload("done_tasks", payload)
        return cls(p.require("job_id", str), tuple(_str_list(p, "task_ids")))


@dataclass(frozen=True, slots=True)
class WaitJobControl:
    """``wait_job {job_id, timeout_s?}`` (60 s when missing)."""

    job_id: str
    timeout_s: float

    @classmethod
    def decode(cls, payload: Any) -> WaitJobControl:
        """Raises: BadRequest: see the module."""
        p = ControlPayload("wait_job", payload)
        timeout_s = float(p.optional("timeout_s", float, 60.0))
        if not 0 <= timeout_s <= MAX_WAIT_JOB_S:  # NaN too
            raise BadRequest(
                f"control 'wait_job': field 'timeout_s' must be 0 to {MAX_WAIT_JOB_S:g} seconds, "
                f"got {timeout_s}"
            )
        return cls(p.require("job_id", str), timeout_s)
