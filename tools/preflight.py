"""Checks a command makes before it starts anything: bad input is one line and exit status 2.

Each ``check_*`` function reads the options and config a command was given, imports every
actor class its workers will import (except ``troupe run``'s stage classes: the run checks them
itself, in the template it starts first), and makes sure its endpoints are free and its output
directories writable; the first problem exits 2 with one line naming the option or field and
what is wrong. Nothing is created on the way (no directory, no log file, no process).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from troupe.runtime.core.config_messages import validation_message
from troupe.runtime.core.current_folder import shadowing_problem
from troupe.runtime.core.loading import check_node_actors, check_node_preload
from troupe.runtime.errors import ConfigError
from troupe.runtime.metrics.address import as_endpoint, parse_host_port
from troupe.runtime.node.config import NodeConfig, check_endpoint, is_loopback, load_node_config
from troupe.runtime.tasks.jobspec import MAX_COUNT
from troupe.runtime.tasks.master.master_config import DEFAULT_MASTER_ENDPOINT
from troupe.runtime.transports.ipc_socket import IN_USE, bind_refusal, ipc_path
from troupe.runtime.transports.loopback import free_endpoint

from .client import fail

__all__ = [
    "check_cluster_run",
    "check_demo",
    "check_master_start",
    "check_node_start",
    "check_run",
    "default_or_free",
    "endpoint_problem",
    "endpoint_shape_problem",
    "full_disk_problem",
    "log_file_problem",
    "loopback_problem",
    "metrics_problem",
    "run_metrics_problem",
    "writable_problem",
]

# Kernel file systems: writing output there is never what was meant, and errors are cryptic.
_VIRTUAL = (Path("/proc"), Path("/sys"), Path("/dev"))


def endpoint_shape_problem(endpoint: str | None, option: str) -> str | None:
    """Why ``endpoint`` is no endpoint at all (``check_endpoint``: a port past 65535, a missing
    slash), naming ``option``; None when it is one, or not given."""
    if endpoint is None:
        return None
    try:
        check_endpoint(endpoint)
    except ValueError as exc:
        return f"{option}: {exc}"
    return None


def endpoint_problem(endpoint: str, option: str, who: str = "node") -> str | None:
    """Why ``endpoint`` cannot be bound now (it is no endpoint, or another process listens
    there), or None.

    ``who`` is what usually holds such a port (``node``, ``master``), for the message.

    ``tcp://HOST:PORT`` is probed by a bind, ``ipc://PATH`` by a connect (ZeroMQ's bind
    unlinks a live process's socket file: it took the socket of a running node without a
    word); a wildcard port and inproc are left to the bind.
    """
    shape = endpoint_shape_problem(endpoint, option)
    if shape is not None:
        return shape
    path = ipc_path(endpoint)
    if path:
        refused = bind_refusal(path)
        if refused is IN_USE:
            return f"endpoint {endpoint} is in use (another troupe {who}?); pass another {option}"
        return None if refused is None else f"endpoint {endpoint}: {refused}; pass another {option}"
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "tcp" or not port:
        return None
    host = parts.hostname or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As ZeroMQ does: a port whose last connection lingers in TIME_WAIT is free to bind.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"endpoint {endpoint} is in use (another troupe {who}?); pass another {option}"
            return f"endpoint {endpoint} cannot be bound ({exc.strerror}); pass another {option}"
    return None


def loopback_problem(endpoint: str, option: str, what: str) -> str | None:
    """Why ``what`` (a one-host run, the demo), which takes no CURVE keys, cannot listen at
    ``endpoint``: off loopback, anyone who reaches it could give its node orders. None when it
    may (a malformed endpoint is :func:`endpoint_problem`'s to say)."""
    try:
        if is_loopback(endpoint):
            return None
    except ValueError:
        return None
    return (
        f"{option} {endpoint} is not on loopback: {what} listens on this host only (127.0.0.1, "
        "::1), with no keys to authenticate peers; for other hosts start a master and nodes "
        "with --keys (troupe master start, troupe node start) and run with --cluster"
    )


def default_or_free(endpoint: str | None, default: str) -> tuple[str, bool]:
    """``endpoint`` when given; else ``default`` if it is free, or a free loopback port (True:
    the default was taken, by another troupe run most likely, and the caller says where it went).

    A given endpoint is checked by the caller as usual: in use, it is refused."""
    if endpoint is not None:
        return endpoint, False
    if endpoint_problem(default, "") is None:
        return default, False
    return free_endpoint(), True


def _connect_problem(endpoint: str, option: str) -> str | None:
    """Why ``endpoint`` is no endpoint to connect to (tcp://HOST:PORT, ipc://, inproc://), or None."""
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:  # urllib refuses it ("Invalid IPv6 URL"): a traceback, with the run refused
        return f"{option} {endpoint!r}: not an endpoint to connect to; expected tcp://HOST:PORT"
    if parts.scheme in ("ipc", "inproc") or (parts.scheme == "tcp" and parts.hostname and port):
        return None
    return f"{option} {endpoint!r}: not an endpoint to connect to; expected tcp://HOST:PORT"


def metrics_problem(address: str | None, who: str = "node") -> str | None:
    """Why the metrics ``HOST:PORT`` cannot be bound now (another process listens there), or None."""
    if address is None:
        return None
    try:
        endpoint = as_endpoint(*parse_host_port(address))
    except ValueError as exc:
        return f"--metrics {exc}"
    problem = endpoint_problem(endpoint, "--metrics HOST:PORT", who)
    return problem.replace(f"endpoint {endpoint}", f"metrics {address}") if problem else None


def run_metrics_problem(metrics: str | None, keys: Path | None, own_node: bool) -> str | None:
    """Why ``troupe run --metrics`` may not serve there (not HOST:PORT; off loopback without the
    cluster's keys: ``run_metrics.check_run_metrics``), or None."""
    from troupe.runtime.pipeline.run_metrics import check_run_metrics

    try:
        check_run_metrics(metrics, keys, own_node)
    except ConfigError as exc:
        return f"--{exc}"
    return None


def shared_port_problem(metrics: str | None, **endpoints: str | None) -> str | None:
    """Why ``--metrics`` and an endpoint of the same process would take one TCP port (each is
    free alone, so the second bind failed once the first held it: after a journal was made, and
    blaming "another master"), or None. ``endpoints``: option name (``_`` for ``-``) -> value."""
    if metrics is None:
        return None
    try:
        host, port = parse_host_port(metrics)
    except ValueError:
        return None  # metrics_problem says why
    wildcards = {"0.0.0.0", "*", "::", ""}
    for option, endpoint in endpoints.items():
        parts = urlsplit(endpoint or "")
        try:
            taken = parts.port
        except ValueError:
            continue
        other = parts.hostname or ""
        if parts.scheme == "tcp" and port and taken == port and (other == host or {other, host} & wildcards):
            name = "--" + option.replace("_", "-")
            return f"--metrics {metrics} and {name} {endpoint} are one port: give the metrics another"
    return None


def writable_problem(path: Path, what: str) -> str | None:
    """Why files cannot be written under directory ``path`` (made if missing), or None.

    Probes by creating and removing a temporary entry, in ``path`` or in its nearest existing
    parent, so it leaves nothing behind and is right where permission bits are not the whole
    story (root, read-only mounts, /proc).
    """
    absolute = Path(os.path.abspath(path))
    try:
        str(absolute).encode("utf-8")
    except UnicodeEncodeError:  # bytes the file system's encoding does not name: surrogates
        raw = os.fsencode(absolute)
        shown = raw.decode("utf-8", "backslashreplace")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return (
                f"{what} {shown}: not valid UTF-8; troupe writes its paths into its journal, logs "
                "and messages as UTF-8, so give a path whose name is valid UTF-8"
            )
        # UTF-8 on disk, but this process reads names as ASCII (LC_ALL=C with Python's
        # UTF-8 mode and locale coercion turned off): it could not name the file again.
        return (
            f"{what} {shown}: this process reads file names as {sys.getfilesystemencoding()} "
            "(its locale), which cannot hold this name; run it under a UTF-8 locale "
            "(LC_ALL=C.UTF-8) or with PYTHONUTF8=1"
        )
    try:
        absolute.resolve(strict=False)  # a loop of symlinks, a name over the file system's limit
        absolute.exists()
    except (OSError, RuntimeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"{what} {path}: not a usable path ({why})"
    for virtual in _VIRTUAL:
        if absolute == virtual or virtual in absolute.parents:
            return f"{what} {path}: {virtual} is a kernel file system, not a place for output"
    existing = absolute
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        shown = "is a file" if existing == absolute else f"is under {existing}, which is a file"
        return f"{what} {path}: {shown}, not a directory"
    try:
        if existing == absolute:
            fd, probe = tempfile.mkstemp(prefix=".troupe-probe-", dir=existing)
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".troupe-probe-", dir=existing))
    except OSError as exc:
        return f"{what} {path}: cannot write in {existing} ({exc.strerror})"
    return None


def log_file_problem(log_dir: Path, name: str, what: str) -> str | None:
    """Why the log file ``<log_dir>/<name>.jsonl`` cannot be appended to and read (a directory
    in its place, a file another user made), or None; ``what`` names the directory's option.

    Opened, not written, and not made where missing (:func:`writable_problem` probes the
    directory): it raised IsADirectoryError or PermissionError as logging was configured, a
    traceback where the other refusals are one line.
    """
    from troupe.runtime.logs import log_file

    path = log_file(log_dir, name)
    try:
        # O_NONBLOCK: a FIFO there is not waited on; O_APPEND and O_NOFOLLOW as the writers open it.
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            return f"log file {path} is a directory; remove it, or give another {what}"
        if exc.errno == errno.ELOOP:  # in a folder another user may write, it could name any file of ours
            return (
                f"log file {path} is a symbolic link, which troupe does not follow; remove it, or "
                f"give another {what}"
            )
        return (
            f"log file {path} cannot be written ({exc.strerror}); let this user write it (or "
            f"remove it), or give another {what}"
        )
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"log file {path} is not a regular file; remove it, or give another {what}"
    finally:
        os.close(fd)
    return None


FULL_BELOW = 1 << 20  # free bytes under which a disk is said full before anything starts


def full_disk_problem(path: Path, what: str) -> str | None:
    """One line where the disk that holds (or would hold) ``path`` has less than ``FULL_BELOW``
    free, or None: a training run on it failed as it recorded its --out, or as its encoders
    opened their cache's index, with a raw ``database or disk is full`` or a traceback."""
    existing = Path(os.path.abspath(path))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return None  # writable_problem says what is wrong with it
    if free >= FULL_BELOW:
        return None
    return (
        f"{what} {path}: the disk holding it is full ({free / 2**20:.1f} MiB free); free space on "
        "it, then run again"
    )


def check_run(
    config: Path | None,
    out: Path,
    items: int | None,
    endpoint: str,
    master: str,
    flag: str = "--items",
    metrics: str | None = None,
    fresh: bool = False,
    retry_dead: bool = False,
) -> None:
    """``troupe run``: --items, the current folder (``shadowing_problem``), the pipeline file,
    --out, both endpoints, --metrics. The actor classes are checked by the run itself, in the
    template it starts first (``early_template``), with the same one-line error and exit status
    2: a child importing them here would be 0.4 s more. An --out that cannot be written is
    refused unless it holds a finished run of the pipeline, whose rerun writes nothing there
    (``read_only_answer``: ``fresh`` and ``retry_dead`` may make it write)."""
    if items is not None and not 1 <= items <= MAX_COUNT:
        raise fail(f"{flag} must be between 1 and {MAX_COUNT}, got {items}", 2)
    _check(shadowing_problem())
    from troupe.cli.commands.run_pipeline import declared_config
    from troupe.runtime.pipeline.run_outcome import completed_run

    unusable = writable_problem(out, "--out")  # first: a path that cannot be resolved (a loop)
    read_only = unusable is not None and _answered_read_only(config, out, items, fresh, retry_dead)
    if read_only:  # a read-only archive of a finished run: its rerun answers from its record
        unusable = None
    elif unusable is not None:
        unusable = _read_only_problem(out, unusable)
    if unusable is None:
        unusable = _journal_length_problem(out)
    if unusable is None and not read_only and completed_run(out) is None:  # a rerun writes nothing
        unusable = full_disk_problem(out, "--out")
    if unusable is not None:
        raise fail(unusable, 2)
    source = str(config) if config else "the default pipeline"
    try:
        declared_config(config, items).with_out(out.resolve())
    except ValidationError as exc:  # the embedded default with an override
        raise fail(validation_message(source, exc), 2) from None
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    from troupe.runtime.errors import JournalError
    from troupe.runtime.pipeline.run_dir import RunDir

    try:
        in_use = RunDir(out).in_use_problem()
    except JournalError as exc:  # its lock cannot be taken (a directory in its place): one line
        raise fail(str(exc), 2) from None
    # The run that holds --out is named first: its node would hold the default endpoints too.
    _check(
        in_use,
        *(() if read_only else _run_log_problems(out)),  # a rerun answered read-only logs nothing
        # Off loopback first: an address of another host cannot be bound either, and "pass
        # another --endpoint" did not say why none off loopback will do.
        loopback_problem(endpoint, "--endpoint", "troupe run"),
        loopback_problem(master, "--master", "troupe run"),
        endpoint_problem(endpoint, "--endpoint"),
        endpoint_problem(master, "--master", "master"),
        run_metrics_problem(metrics, None, own_node=True),
        metrics_problem(metrics),
        shared_port_problem(metrics, endpoint=endpoint, master=master),
    )


def check_cluster_run(
    config: Path | None,
    out: Path,
    items: int | None,
    master: str,
    flag: str,
    metrics: str | None = None,
    keys: Path | None = None,
    endpoint: str | None = None,
) -> None:
    """``troupe run --cluster``: --items, the pipeline file, --out, the master's endpoint (its
    nodes import the actor classes themselves, and say so if one does not), --metrics (served
    by this process; ``keys``: the cluster's, which let it off loopback) and --endpoint (the
    run's mailbox, ``run_keys.run_mailbox``)."""
    if items is not None and not 1 <= items <= MAX_COUNT:
        raise fail(f"{flag} must be between 1 and {MAX_COUNT}, got {items}", 2)
    from troupe.cli.commands.run_pipeline import declared_config

    source = str(config) if config else "the default pipeline"
    try:
        declared_config(config, items)
    except ValidationError as exc:
        raise fail(validation_message(source, exc), 2) from None
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    if endpoint is not None:
        from troupe.runtime.pipeline.run_keys import run_mailbox

        try:
            run_mailbox(master, keys, endpoint)
        except ConfigError as exc:
            raise fail(str(exc), 2) from None
    _check(
        writable_problem(out, "--out"),
        *_run_log_problems(out),
        _connect_problem(master, "--cluster"),
        run_metrics_problem(metrics, keys, own_node=False),
        metrics_problem(metrics, "run"),
    )
    from troupe.cli.master_client import unreachable_why, what_to_do

    # Before --out gets its logs: a typo in the endpoint leaves nothing.
    if (absent := unreachable_why(master, "master")) is not None:
        start = "start one with `troupe master start`, or give the endpoint of the running one"
        raise fail(f"--cluster: {what_to_do(absent, start)}", 1)


def _read_only_problem(out: Path, cannot_write: str) -> str:
    """Why ``out``, which cannot be written and holds no run a rerun can answer read-only, is
    refused: the run that holds it where one does (seen without writing: its pid, as on a
    writable path), and an unfinished run's folder said as one; else ``cannot_write``. It said
    only "cannot write (Read-only file system)" for a folder a live run was writing."""
    from troupe.runtime.errors import JournalError
    from troupe.runtime.pipeline.run_dir import RunDir
    from troupe.runtime.pipeline.run_outcome import completed_run

    try:
        if not (out / ".troupe" / "run.json").is_file():
            return cannot_write
        held = RunDir(out).in_use_problem()
        finished = completed_run(out) is not None
    except (JournalError, OSError, RuntimeError):  # no usable path (too long, a symlink loop)
        return cannot_write
    if held is not None:
        return held
    if finished:  # another pipeline, outputs changed since, --fresh: as the write says
        return cannot_write
    return f"{cannot_write}; it holds an unfinished run, which can go on only where --out can be written"


def _answered_read_only(
    config: Path | None, out: Path, items: int | None, fresh: bool, retry_dead: bool
) -> bool:
    """Whether ``out``, which cannot be written, holds a finished run of the pipeline that a
    rerun answers from its record (``run_plan.read_only_answer``); False where anything says
    otherwise (a bad pipeline is refused below, after the folder's problem, as ever)."""
    from troupe.cli.commands.run_pipeline import declared_config
    from troupe.runtime.errors import TroupeError
    from troupe.runtime.pipeline.run_plan import read_only_answer

    try:
        cfg = declared_config(config, items)
        return read_only_answer(cfg, out.resolve(), fresh, retry_dead) is not None
    except (ValidationError, TroupeError, OSError, RuntimeError):  # RuntimeError: a symlink loop
        return False


def _journal_length_problem(out: Path) -> str | None:
    """Why the run's journal in ``out`` is a path too long for SQLite, or None: the run failed
    as it opened it, advised to check the path was writable, leaving ``.troupe/`` behind."""
    from troupe.runtime.pipeline.run_dir import RunDir
    from troupe.runtime.tasks.journal_path import path_length_problem

    run_dir = RunDir(out)
    too_long = path_length_problem(run_dir.journal_path)
    if too_long is None:
        return None
    journal = run_dir.journal_path.relative_to(out)
    return f"--out {out}: the run's journal there ({journal}) would be {too_long}: use a shorter --out"


def _run_log_problems(out: Path) -> tuple[str | None, str | None]:
    """Why a run's log folder ``<out>/logs``, or its log file there, cannot be written (a file
    in the folder's place, a directory in the file's), or Nones: its mkdir raised
    FileExistsError, and its logging IsADirectoryError, as tracebacks, after the checks."""
    from troupe.runtime.pipeline.run_cluster import LOCAL_NODE

    log_dir = out / "logs"
    if log_dir.exists() and not log_dir.is_dir():
        return f"--out {out}: its log folder {log_dir} is a file; remove it, or give another --out", None
    return None, log_file_problem(log_dir, LOCAL_NODE, "--out")


def check_demo(log_dir: Path, endpoint: str) -> None:
    """``troupe demo``: the current folder, its logs directory and endpoint."""
    _check(
        shadowing_problem(),
        writable_problem(log_dir, "--logs"),
        loopback_problem(endpoint, "--endpoint", "troupe demo"),  # first: as troupe run's
        endpoint_problem(endpoint, "--endpoint"),
    )


def check_node_start(
    config: Path | None, with_master: bool, env_keys: Path | None = None, **options: Any
) -> str | None:
    """``troupe node start``: the current folder (``shadowing_problem``), the config with its
    options (``env_keys``: ``$TROUPE_KEYS``, see ``load_node_config``), its actor classes,
    endpoints, logs.

    Returns:
        The master to join: ``--master``, else the config's ``[node] master``, else (with
        ``--with-master``) the default master endpoint.
    """
    _check(shadowing_problem())  # first: the class check's child would import the file too
    try:
        cfg: NodeConfig = load_node_config(config, env_keys=env_keys, **options)
        check_node_preload(cfg, str(config) if config else "defaults")
        check_node_actors(cfg, str(config) if config else "defaults", on_slow=_say)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    master = cfg.master
    if with_master and master is None:
        master = DEFAULT_MASTER_ENDPOINT
    option = "--endpoint" if options.get("endpoint") else "--endpoint (or [node] endpoint)"
    _check(
        writable_problem(cfg.log_dir, "logs directory"),
        log_file_problem(cfg.log_dir, cfg.name, "logs directory"),
        endpoint_problem(cfg.endpoint, option),
        endpoint_problem(master, "--master", "master") if with_master and master else None,
        metrics_problem(cfg.metrics),
        shared_port_problem(cfg.metrics, endpoint=cfg.endpoint, master=master if with_master else None),
    )
    return master


def check_master_start(
    endpoint: str, log_dir: Path, metrics: str | None = None, name: str = "master"
) -> None:
    """``troupe master start``: its endpoint, metrics port, logs directory and its log file there
    (``<name>.jsonl``; the journal is checked apart)."""
    _check(
        writable_problem(log_dir, "--logs"),
        log_file_problem(log_dir, name, "--logs"),
        endpoint_problem(endpoint, "--endpoint", "master"),
        metrics_problem(metrics, "master"),
        shared_port_problem(metrics, endpoint=endpoint),
    )


def _check(*problems: str | None) -> None:
    for problem in problems:
        if problem is not None:
            raise fail(problem, 2)


def _say(line: str) -> None:
    """A line for the operator on stderr while a check waits (stdout may carry a report)."""
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True).print(Text(line), soft_wrap=True)
