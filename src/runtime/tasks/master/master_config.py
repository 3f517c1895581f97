"""How a master runs (:class:`MasterConfig`), checked as it is made, and where it listens by
default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from troupe.runtime.errors import ConfigError
from troupe.runtime.metrics.address import as_endpoint, parse_host_port
from troupe.runtime.node.config import check_bind, check_name

from .journal_watch import OPERATOR_ADVICE

__all__ = ["DEFAULT_MASTER_ENDPOINT", "MasterConfig"]

DEFAULT_MASTER_ENDPOINT = "tcp://127.0.0.1:7480"


@dataclass(frozen=True, slots=True)
class MasterConfig:
    """How the master runs.

    Attributes:
        endpoint: where it listens (loopback only, like nodes).
        name: its name in logs and status (the runtime's node name).
        tick_s: how often leases are checked for expiry and backoffs released.
        node_timeout_s: a node silent this long is dead; its tasks are requeued.
        max_wait_s: the longest a worker's request may be held (long poll).
        hwm: ZeroMQ high-water mark of the master's sockets.
        throughput_window_s: done tasks per second are measured over this window.
        keys: the CURVE keys directory (``troupe keys generate``); None = no CURVE.
        insecure: listen off loopback without keys (logged loudly, shown in status).
        metrics: ``HOST:PORT`` of its Prometheus endpoint (docs/METRICS.md); None = none.
        log_file: its own JSON-lines log file, which it publishes on its log stream (``troupe
            logs tail --master``); None = none (a master inside a node logs to the node's
            file, which the node streams).
        batch_linger_s: how long the driver lets a batch fill before it journals it: a busy
            master then pays its per-batch costs (a transaction, a thread hop) over more
            events, for at most this much more latency per reply.
        journal_lost_advice: what the error that stops it when its journal's file is lost
            (deleted, replaced, cut short: ``journal_watch.py``) tells to do; a ``troupe run``'s
            own master says to run it again, not a cluster operator's ``--new`` and submits.
    """

    endpoint: str = DEFAULT_MASTER_ENDPOINT
    name: str = "master"
    tick_s: float = 0.05
    node_timeout_s: float = 10.0
    max_wait_s: float = 10.0
    hwm: int = 100_000
    throughput_window_s: float = 10.0
    keys: Path | None = None
    insecure: bool = False
    metrics: str | None = None
    log_file: Path | None = None
    batch_linger_s: float = 0.002
    journal_lost_advice: str = OPERATOR_ADVICE

    def __post_init__(self) -> None:
        if self.metrics is not None:
            try:
                metrics = as_endpoint(*parse_host_port(self.metrics))
                check_bind(metrics, keys=self.keys, insecure=self.insecure, plain_http=True)
            except ValueError as exc:  # named as written, HOST:PORT
                raise ConfigError(f"master metrics: {exc}".replace("tcp://", "")) from None
        try:
            check_bind(self.endpoint, keys=self.keys, insecure=self.insecure)
        except ValueError as exc:
            raise ConfigError(f"master endpoint: {exc}") from None
        try:  # it names the log file: no markup, no path
            check_name(self.name, "master name", shown=200)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not self.node_timeout_s > 0:
            raise ConfigError(
                f"master: node_timeout_s (--node-timeout) must be > 0, got {self.node_timeout_s:g}"
            )
        if not (self.tick_s > 0 and self.max_wait_s >= 0):
            raise ConfigError("master: tick_s must be > 0, max_wait_s >= 0")
        if not 0 <= self.batch_linger_s <= 1.0:
            raise ConfigError(f"master: batch_linger_s must be 0..1, got {self.batch_linger_s}")
