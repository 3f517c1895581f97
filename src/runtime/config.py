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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError

__all__ = [
    "DEFAULT_NODE_ENDPOINT",
    "ActorSpec",
    "NodeConfig",
    "WorkerSpec",
    "check_loopback",
    "load_node_config",
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

    @field_validator("endpoint")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
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


def load_node_config(path: Path | None, **overrides: Any) -> NodeConfig:
    """Load and validate a node config; ``overrides`` (CLI options) win over the file.

    Raises:
        ConfigError: the file is missing, not TOML, or has invalid fields.
    """
    data: dict[str, Any] = {}
    source = str(path) if path else "defaults"
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        unknown = set(raw) - {"node", "workers"}
        if unknown:
            raise ConfigError(f"{path}: unknown sections {sorted(unknown)}; expected [node] and [[workers]]")
        data.update(raw.get("node", {}))
        data["workers"] = raw.get("workers", [])
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(source, exc)) from None
