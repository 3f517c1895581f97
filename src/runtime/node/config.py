"""Node configuration: frozen, typed, validated once when loaded.

A node config is a TOML file (see configs/node.toml)::

    [node]
    name = "local"
    endpoint = "tcp://127.0.0.1:7470"

    [[workers]]
    name = "greeter"
    actors = [{ name = "greeter", class = "troupe.actors.demo.actors:Greeter" }]

Every field has a default; a node started with no file hosts no workers until told to.

Counts, numbers and switches are strict: ``hwm = "8"`` is a typo, not 8, and NaN or infinity
is never a sensible timeout (nor is one over a year: :data:`MAX_DURATION_S`). Unknown keys are
refused with the closest known one.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from troupe.runtime.core.config_messages import shipped_hint, short_repr, validation_message
from troupe.runtime.errors import ConfigError
from troupe.runtime.logs import check_log_level
from troupe.runtime.metrics.address import as_endpoint, parse_host_port
from troupe.runtime.supervision.liveness import LivenessPolicy
from troupe.runtime.transports.endpoint_form import check_endpoint

from .reach import is_wildcard

if TYPE_CHECKING:
    from troupe.runtime.supervision.restart import RestartPolicy

__all__ = [
    "DEFAULT_NODE_ENDPOINT",
    "MAX_DURATION_S",
    "MAX_HWM",
    "MAX_NAME",
    "MAX_TAGS",
    "RUN_MASTER_ENDPOINT",
    "RUN_NODE_ENDPOINT",
    "ActorSpec",
    "Duration",
    "KindSupervision",
    "NodeConfig",
    "RestartConfig",
    "SupervisionConfig",
    "WorkerSpec",
    "check_bind",
    "check_endpoint",
    "check_loopback",
    "check_name",
    "check_tag",
    "is_loopback",
    "load_node_config",
    "read_toml",
    "validation_message",
]

DEFAULT_NODE_ENDPOINT = "tcp://127.0.0.1:7470"
# Where `troupe run` starts its own node and master unless told (`--endpoint`, `--master`).
RUN_NODE_ENDPOINT = "tcp://127.0.0.1:7479"
RUN_MASTER_ENDPOINT = "tcp://127.0.0.1:7478"
# ZeroMQ takes the high-water mark as a C int; far below that, a queue this long is a mistake.
MAX_HWM = 1_000_000
MAX_NAME = 100  # names end up in file names and log lines
MAX_TAGS = 32
MAX_MESSAGE_MB = 4096.0  # a worker's own bound: a 640x480 episode of RGB-D is ~130 MB
# The least message bound: 64 KiB, four batch frames (wire/batch_frames.py), which every peer
# must take whole: ZeroMQ drops the connection of a peer that sends a frame over the bound.
MIN_MESSAGE_MB = 1 / 16
# The longest timeout, interval or period a config may give (a year): none sensible is longer,
# and past threading.TIMEOUT_MAX (about 292 years) a wait overflows (interval_s = 1e299 killed
# every worker's heartbeat thread with an OverflowError, and the worker ran on unwatched).
MAX_DURATION_S = 365 * 24 * 3600.0
Duration = Annotated[StrictFloat, Field(le=MAX_DURATION_S)]
"""A config's seconds: finite (as every number of a config) and at most :data:`MAX_DURATION_S`."""
NAME_PATTERN = r"^[A-Za-z0-9_.\-]+$"
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")  # a DNS name: what advertise holds


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)


# What only a node reads (its config file; the worker specs it launches from): the validators
# are built on first use, not as this module imports. A node's template imports it for
# ActorSpec and _Frozen, which its workers validate with; building these as well cost the
# template about 6 ms before its first fork, in every run, for models no forked process uses.
_NODE_ONLY = ConfigDict(defer_build=True)


class ActorSpec(_Frozen):
    """One actor to host: its name and class import path (``module:Class``)."""

    name: str = Field(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)
    cls: str = Field(alias="class", min_length=3)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class WorkerSpec(_Frozen):
    """One worker process and the actors it hosts."""

    model_config = _NODE_ONLY

    name: str = Field(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)
    actors: tuple[ActorSpec, ...] = ()
    kind: str = Field(default="default", min_length=1, max_length=MAX_NAME)
    # This worker's message size bound, over the node's (a pipeline stage whose items are large).
    max_message_mb: StrictFloat | None = Field(default=None, ge=MIN_MESSAGE_MB, le=MAX_MESSAGE_MB)

    @field_validator("actors")
    @classmethod
    def _unique_actors(cls, value: tuple[ActorSpec, ...]) -> tuple[ActorSpec, ...]:
        # Plain from the file, as a repeated worker is: the worker refused the second at its
        # start, and was restarted until given up.
        names = [a.name for a in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"actor names must be unique in a worker, repeated: {dupes}")
        return value


class KindSupervision(_Frozen):
    """Liveness overrides for one worker kind (``[supervision.kinds.<kind>]``); unset = inherit.

    ``start_timeout_s`` too: a kind whose imports are slow (a renderer's) needs a longer bound
    on its start than the node's other workers, which keep theirs short."""

    interval_s: Duration | None = Field(default=None, gt=0)
    heartbeat_timeout_s: Duration | None = Field(default=None, gt=0)
    progress_timeout_s: Duration | None = Field(default=None, ge=0)
    startup_timeout_s: Duration | None = Field(default=None, gt=0)
    start_timeout_s: Duration | None = Field(default=None, ge=0)


class SupervisionConfig(_Frozen):
    """The ``[supervision]`` table: how the node's supervisor judges its workers.

    ``progress_timeout_s = 0`` disables the no-progress check (for kinds whose work goes quiet
    on purpose); ``startup_timeout_s`` unset means ``heartbeat_timeout_s``.
    ``supervisor_timeout_s``: the node asks its supervisor every second whether it answers;
    silent this long (stopped, hung), it is killed and started again.
    ``start_timeout_s``: a worker's start (its imports, its actors' constructors and
    ``started()`` hooks) that has not ended this long after its launch is killed as hung and
    restarted (warned at a third and two thirds of it); 0 disables the bound.
    """

    enabled: StrictBool = True
    interval_s: Duration = Field(default=0.5, gt=0)
    heartbeat_timeout_s: Duration = Field(default=3.0, gt=0)
    progress_timeout_s: Duration = Field(default=30.0, ge=0)
    startup_timeout_s: Duration | None = Field(default=None, gt=0)
    supervisor_timeout_s: Duration = Field(default=10.0, gt=0)
    start_timeout_s: Duration = Field(default=180.0, ge=0)
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

    def start_timeout_for(self, kind: str) -> tuple[float, str]:
        """The bound on the start of a worker of ``kind`` (0: none), and the setting it comes
        from, which the lines about a slow start name as the one to raise."""
        own = self.kinds.get(kind, KindSupervision()).start_timeout_s
        if own is None:
            return self.start_timeout_s, "[supervision] start_timeout_s"
        return own, f"[supervision.kinds.{kind}] start_timeout_s"


class RestartConfig(_Frozen):
    """The ``[restart]`` table: OTP-style restart intensity and backoff for worker processes.

    ``healthy_after_s``: a worker that has served this long since its last start counts as
    recovered, and its backoff starts again from ``backoff_base_s``.
    """

    max_restarts: StrictInt = Field(default=5, ge=0, le=1_000_000)
    period_s: Duration = Field(default=60.0, gt=0)
    backoff_base_s: Duration = Field(default=0.1, ge=0)
    backoff_max_s: Duration = Field(default=10.0, ge=0)
    healthy_after_s: Duration = Field(default=10.0, gt=0)

    model_config = _NODE_ONLY

    @model_validator(mode="after")
    def _policy_valid(self) -> RestartConfig:
        self.policy()
        return self

    def policy(self) -> RestartPolicy:
        """The restart policy these settings describe."""
        # Imported here: the node's own supervision imports it anyway; its workers and its
        # supervisor, forked from a template that imports this module, never use it.
        from troupe.runtime.supervision.restart import RestartPolicy

        return RestartPolicy(self.max_restarts, self.period_s, self.backoff_base_s, self.backoff_max_s)


class NodeConfig(_Frozen):
    """Everything a node needs to start."""

    model_config = _NODE_ONLY

    name: str = Field(
        default_factory=lambda: socket.gethostname().split(".")[0] or "node",
        min_length=1,
        max_length=MAX_NAME,
        pattern=NAME_PATTERN,
    )
    # Security (DESIGN.md): the CURVE keys directory (``troupe keys generate``); None = no CURVE.
    # Declared before the endpoints, whose validator reads them.
    keys: Path | None = None
    # Listen off loopback without keys: allowed only when asked for, and said loudly.
    insecure: StrictBool = False
    endpoint: str = DEFAULT_NODE_ENDPOINT
    log_dir: Path = Path("logs")
    log_level: str = "info"
    # Every process of the node rotates <log_dir>/<name>.jsonl before a line that would take it
    # past this size (see log_max_bytes), keeping log_keep rotated files.
    log_max_mb: StrictFloat = Field(default=64.0, gt=0)
    log_keep: StrictInt = Field(default=5, ge=1, le=1000)
    hwm: StrictInt = Field(default=1000, ge=1, le=MAX_HWM)
    max_message_mb: StrictFloat = Field(default=64.0, ge=MIN_MESSAGE_MB, le=MAX_MESSAGE_MB)
    # Input limits (core/throttle.py, wire/codec.py): frames per message; bad frames a peer may
    # send at once and per second before its messages are dropped unread for throttle_s.
    max_frames: StrictInt = Field(default=1024, ge=2, le=1_000_000)
    bad_frames_burst: StrictInt = Field(default=20, ge=1, le=1_000_000)
    bad_frames_per_s: StrictFloat = Field(default=10.0, gt=0)
    throttle_s: Duration = Field(default=10.0, gt=0)
    ask_timeout_s: Duration = Field(default=30.0, gt=0)
    drain_timeout_s: Duration = Field(default=5.0, ge=0)
    stop_grace_s: Duration = Field(default=5.0, ge=0)
    # Workers forked from a template process that has done their imports (template.py);
    # false: every worker is a fresh interpreter. preload: more modules (or pkg.mod:Class
    # actor classes) the template imports.
    fast_start: StrictBool = True
    preload: tuple[str, ...] = ()
    workers: tuple[WorkerSpec, ...] = ()
    supervision: SupervisionConfig = Field(default_factory=SupervisionConfig)
    restart: RestartConfig = Field(default_factory=RestartConfig)
    # Task dispatch (master.py): the master this node joins; None = no master.
    master: str | None = None
    # The host other hosts reach this node and its workers at, when the endpoint binds every
    # interface (tcp://0.0.0.0:PORT); see reach.py. None: the endpoint's own host.
    advertise: str | None = Field(default=None, min_length=1, max_length=253, validate_default=True)
    # Prometheus endpoint (docs/METRICS.md): HOST:PORT of GET /metrics; None = none opened.
    metrics: str | None = None
    # What this host offers replicas (placement.py): a replica that names tags runs only on
    # nodes that carry them all. Told to the master in every beat.
    tags: tuple[str, ...] = ()

    @field_validator("keys", mode="before")
    @classmethod
    def _keys_named(cls, value: Any) -> Any:
        if value == "":  # Path("") is the current folder (report kl 2)
            raise ValueError("is empty; give the keys directory, or leave keys out to use none")
        return value

    @field_validator("tags", mode="before")
    @classmethod
    def _valid_tags(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            for tag in value:
                check_tag(tag)
            if len(value) > MAX_TAGS:
                raise ValueError(f"at most {MAX_TAGS} tags, got {len(value)}")
            return tuple(dict.fromkeys(value))  # a tag said twice is one tag
        return value

    @field_validator("metrics")
    @classmethod
    def _metrics_address(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            endpoint = as_endpoint(*parse_host_port(value))
            try:
                keys, insecure = info.data.get("keys"), bool(info.data.get("insecure"))
                check_bind(endpoint, keys=keys, insecure=insecure, plain_http=True)
            except ValueError as exc:  # named as written, HOST:PORT
                raise ValueError(str(exc).replace("tcp://", "")) from None
        return value

    @field_validator("endpoint", "master")
    @classmethod
    def _safe_off_loopback(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A master off loopback under an endpoint refused for it already: one refusal says the
        # way out for both (it said it twice in one line).
        said = info.field_name == "master" and "endpoint" not in info.data
        if value is not None and not said:
            check_bind(value, keys=info.data.get("keys"), insecure=bool(info.data.get("insecure")))
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        return check_log_level(value)

    @field_validator("advertise")
    @classmethod
    def _host_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Checked as the config loads, named with its file, rather than as the node starts.
        endpoint = info.data.get("endpoint")
        if value is None and isinstance(endpoint, str) and is_wildcard(endpoint):
            raise ValueError(
                f"required when node.endpoint binds every interface ({endpoint!r}); give the "
                "address other hosts reach this one at (node.advertise, or --advertise)"
            )
        if value is not None and not _HOST.fullmatch(value):
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(
                    f"{value!r} is no host name or IP address (ASCII letters, digits, '-' and '.')"
                ) from None
        return value

    def ignored_settings(self) -> list[str]:
        """Settings the file gives that this node will not use, each said in one line for the
        node to warn of (not refused: see each).

        - A ``[supervision.kinds.X]`` that no ``[[workers]]`` table's kind names, on a node that
          has such tables: a typo, likely (``rendr``), and its workers get the defaults. Not
          refused: a pipeline replica's kind is its stage's name, known only as it is spawned.
        - ``advertise`` with an endpoint that does not bind every interface: only then is it
          used (``reach.py``).
        """
        lines: list[str] = []
        kinds = sorted({"default", *(w.kind for w in self.workers)})
        for kind in sorted(set(self.supervision.kinds) - set(kinds)) if self.workers else []:
            close = difflib.get_close_matches(kind, kinds, n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else f"fine if {kind!r} is a pipeline stage this node runs (its replicas' kind)"
            )
            lines.append(
                f"supervision.kinds.{kind}: no [[workers]] table has kind {kind!r} (kinds: "
                f"{', '.join(kinds)}), so it applies to no worker of the file; {hint}"
            )
        if self.advertise is not None and not is_wildcard(self.endpoint):
            lines.append(
                f"node.advertise: ignored: used only with an endpoint that binds every interface "
                f"(tcp://0.0.0.0:PORT), and node.endpoint is {self.endpoint!r}"
            )
        return lines

    @field_validator("workers")
    @classmethod
    def _unique_workers(cls, value: tuple[WorkerSpec, ...]) -> tuple[WorkerSpec, ...]:
        names = [w.name for w in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"worker names must be unique, repeated: {dupes}")
        return value

    @property
    def log_max_bytes(self) -> int:
        """``log_max_mb`` in bytes: the size every writer of the node's log file rotates it at
        (``log_files``; a rotated file holds at most this, plus a line of each other process
        writing in the same instant)."""
        return int(self.log_max_mb * 2**20)


def check_tag(tag: Any) -> str:
    """A node tag as given, if it is a name (see :func:`check_name`).

    Raises:
        ValueError: it is not; the message names the tag.
    """
    return check_name(tag, "tag")


def check_name(value: Any, what: str, shown: int = 60) -> str:
    """``value`` as given, if it is a name (ASCII letters, digits, ``_ . -``; at most MAX_NAME): what
    names a node, a master, a tag, and ends up in a file name or a table.

    Raises:
        ValueError: it is not; the message says ``what`` and shows the value (cut to ``shown``).
    """
    if not isinstance(value, str) or not re.fullmatch(NAME_PATTERN, value) or len(value) > MAX_NAME:
        raise ValueError(
            f"{what} {short_repr(value, shown)} must be 1 to {MAX_NAME} ASCII letters (a-z, A-Z), digits, "
            "'_', '.' or '-'"
        )
    return value


def is_loopback(endpoint: str) -> bool:
    """Whether ``endpoint`` stays on this host: tcp on 127.0.0.0/8, ::1 or localhost, ipc, inproc.

    Raises:
        ValueError: the endpoint is not tcp://HOST:PORT, ipc:// or inproc:// (``check_endpoint``).
    """
    parts = urlsplit(check_endpoint(endpoint))
    if parts.scheme in ("ipc", "inproc"):
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or a wildcard (*): reachable from elsewhere


def check_bind(endpoint: str, *, keys: Path | str | None, insecure: bool, plain_http: bool = False) -> None:
    """Refuse an endpoint off loopback unless CURVE keys are configured or ``insecure`` is set.

    Without keys, nothing authenticates peers, so a socket reachable from other hosts would
    take orders from anyone; ``insecure`` is the user's explicit override (logged loudly at
    start, and shown by ``troupe ctl status``). ``plain_http``: the endpoint is a metrics one,
    plain HTTP with keys or without, which the refusal must not promise to protect (report ak 10).

    Raises:
        ValueError: malformed, or off loopback with neither keys nor ``insecure``; one line
            naming the endpoint and both ways out.
    """
    if is_loopback(endpoint) or keys is not None or insecure:
        return
    said = f"endpoint {endpoint!r} is not on loopback and no CURVE keys are configured; pass --keys DIR "
    if plain_http:
        raise ValueError(
            f"{said}or --insecure to serve it off loopback; it is plain HTTP either way (names and "
            "counts, not authenticated, not encrypted): firewall it to the scraper, or keep it on "
            "loopback"
        )
    raise ValueError(
        f"{said}(made by `troupe keys generate DIR`) to authenticate and encrypt, or "
        "--insecure to listen unauthenticated"
    )


def check_loopback(endpoint: str) -> None:
    """Refuse endpoints off the loopback interface (:func:`check_bind` without keys).

    Raises:
        ValueError: the endpoint is not tcp on 127.0.0.0/8 or ::1 (nor ipc/inproc).
    """
    check_bind(endpoint, keys=None, insecure=False)


def read_toml(path: Path, what: str, tables: set[str], arrays: set[str], expected: str) -> dict[str, Any]:
    """Read a TOML file whose top level may hold only the ``tables`` and arrays of tables.

    Raises:
        ConfigError: the file is missing, unreadable, empty, not TOML, or has another section;
            named with the file.
    """
    import tomllib  # a node or a command reads TOML; the workers forked with this module, never

    try:
        raw = tomllib.loads(Path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what} file{shipped_hint(Path(path))}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; save the {what} file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if not raw:
        raise ConfigError(f"{path}: the {what} file is empty; expected {expected}")
    sections = tables | arrays
    unknown = sorted(set(raw) - sections)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(sections), n=1)
        hint = f" (did you mean [{close[0]}]?)" if close else ""
        names = ", ".join(short_repr(name) for name in unknown)
        raise ConfigError(f"{path}: unknown sections: {names}{hint}; expected {expected}")
    for name, value in raw.items():
        if name in tables and not isinstance(value, dict):
            raise ConfigError(f"{path}: {name} must be a [{name}] table, got {short_repr(value)}")
        if name in arrays and not (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
            raise ConfigError(f"{path}: {name} must be [[{name}]] tables, got {short_repr(value)}")
    return raw


_SECTIONS = frozenset({"workers", "supervision", "restart"})  # NodeConfig fields with own tables
_OPTIONS = {"tags": "--tag", "log_dir": "--logs"}  # keys whose option is not --KEY (troupe node start)


def load_node_config(path: Path | None, *, env_keys: Path | None = None, **overrides: Any) -> NodeConfig:
    """Load and validate a node config; ``overrides`` (CLI options) win over the file, and the
    file over ``env_keys`` (``$TROUPE_KEYS``): a node's config file is the more specific
    statement of its keys than a shell's environment (report kl 1).

    Raises:
        ConfigError: the file is missing, not TOML, or has invalid fields.
    """
    data: dict[str, Any] = {}
    rename: dict[str, str] = {}  # the [node] table's keys sit at the model's top level
    source = str(path) if path else "command line"
    if path is not None:
        raw = read_toml(
            path,
            "config",
            {"node", "supervision", "restart"},
            {"workers"},
            "[node], [[workers]], [supervision] and [restart]",
        )
        node = raw.get("node", {})
        misplaced = sorted(set(node) & _SECTIONS)
        if misplaced:
            table = "[[workers]]" if misplaced[0] == "workers" else f"[{misplaced[0]}]"
            raise ConfigError(f"{path}: node.{misplaced[0]}: belongs in its own {table} table, not in [node]")
        data.update(node)
        # Every [node] key, also one the file lacks (a default found wrong: advertise missing).
        keys = [*node, *(key for key in NodeConfig.model_fields if key not in _SECTIONS)]
        rename.update({key: f"node.{key}" for key in keys})
        data["workers"] = raw.get("workers", [])
        for table in ("supervision", "restart"):
            if table in raw:
                data[table] = raw[table]
    given = {k: v for k, v in overrides.items() if v is not None}
    data.update(given)
    for key in given:  # named as the user gave it: the option, not a key of the file
        rename[key] = _OPTIONS.get(key, f"--{key.replace('_', '-')}")
    if env_keys is not None and data.get("keys") is None:  # neither --keys nor [node] keys
        data["keys"] = env_keys
        rename["keys"] = "$TROUPE_KEYS"
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        # Only options wrong: the file is not to blame, so the line does not name it.
        if given and all(err["loc"] and err["loc"][0] in given for err in exc.errors()):
            source = "command line"
        raise ConfigError(validation_message(source, exc, data, NodeConfig, rename, _SECTIONS)) from None
