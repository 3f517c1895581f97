"""What a node says of itself: the controls ``ping`` (who and where it is), ``status`` (its
workers, each asked for its own runtime's figures, its supervision, template and memory) and
``log_recent`` (the last lines of its log stream), and its uptime.

:class:`StatusControls` is a part of :class:`~troupe.runtime.node.node.Node`: it uses the
node's fields.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import psutil

from troupe.runtime.errors import ActorStopped
from troupe.runtime.process_identity import process_identity, user_name
from troupe.runtime.security.process import security_status

from .worker_handles import HandleState, WorkerHandle

if TYPE_CHECKING:
    from troupe.runtime.core.runtime import Runtime
    from troupe.runtime.log_publisher import LogPublisher
    from troupe.runtime.supervision.node_side import NodeSupervision

    from .config import NodeConfig
    from .template_link import TemplateLink

__all__ = ["StatusControls"]


class StatusControls:
    """Answers ``ping``, ``status`` and ``log_recent`` (a part of the node)."""

    config: NodeConfig
    name: str
    runtime: Runtime | None
    workers: dict[str, WorkerHandle]
    supervision: NodeSupervision
    template: TemplateLink | None
    log_publisher: LogPublisher | None
    status_extras: dict[str, Callable[[], Any]]  # more sections of the status, by name
    _started_mono: float  # when the node was made, on the monotonic clock

    @property
    def uptime_s(self) -> float:
        """Seconds since the node was made, on the monotonic clock: a step of the wall clock
        (NTP at boot) makes it neither negative nor an hour too long."""
        return time.monotonic() - self._started_mono

    async def _log_recent(self, payload: Any) -> dict[str, Any]:
        if self.log_publisher is None:
            raise ActorStopped(f"node {self.name} is not streaming its log yet")
        return self.log_publisher.answer(payload)

    async def _ping(self, _: Any) -> dict[str, Any]:
        return {
            "node": self.name,
            "pid": os.getpid(),
            "time": time.time(),
            "process": process_identity(),
            "user": user_name(),
        }

    async def _status(self, payload: Any) -> dict[str, Any]:
        assert self.runtime is not None
        workers = []
        for handle in list(self.workers.values()):  # workers may start while it awaits
            info = handle.describe()
            info["rss_mib"] = _rss_mib(handle.pid) if handle.returncode is None else 0.0
            if handle.state is HandleState.RUNNING and handle.endpoint:
                try:
                    info["runtime"] = await self.runtime.control(handle.endpoint, "status", timeout=1.0)
                except Exception as exc:
                    info["runtime"] = {"error": repr(exc)}
            workers.append(info)
        return {
            "node": self.name,
            "pid": os.getpid(),
            # Whose node: two users' runs' nodes on one host are both called ``local``.
            "user": user_name(),
            "uid": os.getuid(),
            "endpoint": self.runtime.address,
            "tags": list(self.config.tags),
            "log_endpoint": self.log_publisher.endpoint if self.log_publisher is not None else None,
            "security": security_status(self.config.insecure),
            "uptime_s": round(self.uptime_s, 3),
            "rss_mib": _rss_mib(os.getpid()),
            "workers": workers,
            "runtime": asdict(self.runtime.statistics()),
            "supervision": await self.supervision.describe(),
            "template": self.template.describe() if self.template is not None else None,
            **{name: extra() for name, extra in self.status_extras.items()},
        }


def _rss_mib(pid: int | None) -> float:
    if not pid:
        return 0.0
    try:
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except psutil.Error:
        return 0.0
