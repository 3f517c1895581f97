"""Node configuration: frozen, typed, validated once when loaded.

A node config is a TOML file (see configs/node.toml)::

    [node]
    name = "local"
    endpoint = "tcp://127.0.0.1:7470"

    [[workers]]
    name = "greeter"
    actors = [{ name = "greeter", class = "troupe.actors.demo:Greeter" }]

Every field has a default; a node started with no file hosts no workers until told to.
"""

from __future__ import annotations

import ipaddress
import socket
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .liveness import LivenessPolicy
from .restart import RestartPolicy

__all__ = [
    "DEFAULT_NODE_ENDPOINT",
    "ActorSpec",
    "KindSupervision",
    "NodeConfig",
    "RestartConfig",
    "SupervisionConfig",
    "WorkerSpec",
    "check_loopback",
    "load_node_config",
    "read_toml",
    "validation_message",
]

DEFAULT_NODE_ENDPOINT = "tcp://127.0.0.1:7470"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class ActorSpec(_Frozen):
    """One actor to host: its name and class import path (``module:Class``)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    cls: str = Field(alias="class", min_length=3)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class WorkerSpec(_Frozen):
    """One worker process and the actors it hosts."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    actors: tuple[ActorSpec, ...] = ()
    kind: str = "default"


class KindSupervision(_Frozen):
    """Liveness overrides for one worker kind (``[supervision.kinds.<kind>]``); unset = inherit."""

    interval_s: float | None = Field(default=None, gt=0)
    heartbeat_timeout_s: float | None = Field(default=None, gt=0)
    progress_timeout_s: float | None = Field(default=None, ge=0)
    startup_timeout_s: float | None = Field(default=None, gt=0)


class SupervisionConfig(_Frozen):
    """The ``[supervision]`` table: how the node's supervisor judges its workers.

    ``progress_timeout_s = 0`` disables the no-progress check (for kinds whose work goes quiet
    on purpose); ``startup_timeout_s`` unset means ``heartbeat_timeout_s``.
    """

    enabled: bool = True
    interval_s: float = Field(default=0.5, gt=0)
    heartbeat_timeout_s: float = Field(default=3.0, gt=0)
    progress_timeout_s: float = Field(default=30.0, ge=0)
    startup_timeout_s: float | None = Field(default=None, gt=0)
    kinds: dict[str, KindSupervision] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _policies_valid(self) -> SupervisionConfig:
        self.policy_for("default")
        for kind in self.kinds:
            self.policy_for(kind)
        return self

    def policy_for(self, kind: str) -> LivenessPolicy:
        """The liveness policy of ``kind``: its overrides on top of the table's defaults.

        Raises:
            ConfigError: the merged values are inconsistent (e.g. timeout not above interval).
        """
        o = self.kinds.get(kind, KindSupervision())
        progress = self.progress_timeout_s if o.progress_timeout_s is None else o.progress_timeout_s
        return LivenessPolicy(
            interval_s=self.interval_s if o.interval_s is None else o.interval_s,
            heartbeat_timeout_s=(
                self.heartbeat_timeout_s if o.heartbeat_timeout_s is None else o.heartbeat_timeout_s
            ),
            progress_timeout_s=progress or None,
            startup_timeout_s=o.startup_timeout_s or self.startup_timeout_s,
        )


class RestartConfig(_Frozen):
    """The ``[restart]`` table: OTP-style restart intensity and backoff for worker processes.

    ``healthy_after_s``: a worker that has served this long since its last start counts as
    recovered, and its backoff starts again from ``backoff_base_s``.
    """

    max_restarts: int = Field(default=5, ge=0)
    period_s: float = Field(default=60.0, gt=0)
    backoff_base_s: float = Field(default=0.1, ge=0)
    backoff_max_s: float = Field(default=10.0, ge=0)
    healthy_after_s: float = Field(default=10.0, gt=0)

    @model_validator(mode="after")
    def _policy_valid(self) -> RestartConfig:
        self.policy()
        return self

    def policy(self) -> RestartPolicy:
        """The restart policy these settings describe."""
        return RestartPolicy(self.max_restarts, self.period_s, self.backoff_base_s, self.backoff_max_s)


class NodeConfig(_Frozen):
    """Everything a node needs to start."""

    name: str = Field(default_factory=lambda: socket.gethostname().split(".")[0] or "node")
    endpoint: str = DEFAULT_NODE_ENDPOINT
    log_dir: Path = Path("logs")
    log_level: str = "info"
    hwm: int = Field(default=1000, ge=1)
    max_message_mb: float = Field(default=64.0, gt=0)
    ask_timeout_s: float = Field(default=30.0, gt=0)
    drain_timeout_s: float = Field(default=5.0, ge=0)
    stop_grace_s: float = Field(default=5.0, ge=0)
    workers: tuple[WorkerSpec, ...] = ()
    supervision: SupervisionConfig = Field(default_factory=SupervisionConfig)
    restart: RestartConfig = Field(default_factory=RestartConfig)
    # Task dispatch (master.py): the master this node joins; None = no master.
    master: str | None = None

    @field_validator("endpoint")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        check_loopback(value)
        return value

    @field_validator("master")
    @classmethod
    def _master_loopback_only(cls, value: str | None) -> str | None:
        if value is not None:
            check_loopback(value)
        return value

    @field_validator("workers")
    @classmethod
    def _unique_workers(cls, value: tuple[WorkerSpec, ...]) -> tuple[WorkerSpec, ...]:
        names = [w.name for w in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"worker names must be unique, repeated: {dupes}")
        return value


def check_loopback(endpoint: str) -> None:
    """Refuse endpoints off the loopback interface.

    Binding another address needs CURVE keys (DESIGN.md, Security), which this version does
    not configure yet; refusing is safer than listening unauthenticated.

    Raises:
        ValueError: the endpoint is not tcp on 127.0.0.0/8 or ::1 (nor ipc/inproc).
    """
    parts = urlsplit(endpoint)
    if parts.scheme in ("ipc", "inproc"):
        return
    if parts.scheme != "tcp":
        raise ValueError(f"endpoint {endpoint!r} must be tcp://HOST:PORT, ipc:// or inproc://")
    host = parts.hostname or ""
    if host == "localhost":
        return
    try:
        loop = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = False
    if not loop:
        raise ValueError(
            f"endpoint {endpoint!r} is not on loopback; troupe binds 127.0.0.1 unless CURVE "
            "keys are configured, which this version does not support yet"
        )


def validation_message(source: str, exc: ValidationError) -> str:
    """Render pydantic errors as one line per field, naming the file."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"{source}: {where}: {err['msg']}")
    return "\n".join(lines)


def read_toml(path: Path, what: str, sections: set[str], expected: str) -> dict[str, Any]:
    """Read a TOML file whose top level may hold only ``sections``.

    Raises:
        ConfigError: the file is missing, not TOML, or has another section; named with the file.
    """
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what} file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(raw) - sections
    if unknown:
        raise ConfigError(f"{path}: unknown sections {sorted(unknown)}; expected {expected}")
    return raw


def load_node_config(path: Path | None, **overrides: Any) -> NodeConfig:
    """Load and validate a node config; ``overrides`` (CLI options) win over the file.

    Raises:
        ConfigError: the file is missing, not TOML, or has invalid fields.
    """
    data: dict[str, Any] = {}
    source = str(path) if path else "defaults"
    if path is not None:
        raw = read_toml(path, "config", {"node", "workers", "supervision", "restart"},
                        "[node], [[workers]], [supervision] and [restart]")
        data.update(raw.get("node", {}))
        data["workers"] = raw.get("workers", [])
        for table in ("supervision", "restart"):
            if table in raw:
                data[table] = raw[table]
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(source, exc)) from None
