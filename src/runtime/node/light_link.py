"""The node's side of a light template: the sibling its template forks once the actor classes
are imported, before what they preload (torch, say).

The template sends it as ``{"light": pid}`` with the light one's socket, between the classes
and their preloads (``template.fork_light``). Until the template is ready, the node forks the
supervisor, and the workers whose classes preload nothing the light one lacks, from it: a
pipeline's CPU stages (and its class check, which the light one answers too) no longer wait
for torch's import, and their workers do not carry torch. It is the template's child and dies
with it (its parent-death signal); once its template is gone, it is the node's to reap.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterable
from typing import Any

import anyio

from troupe.runtime.library_logging import get_logger

from .forked_process import pid_alive

__all__ = ["LightTemplate", "reap_when_dead"]

log = get_logger(__name__)

_REAP_POLL_S = 0.01


class LightTemplate:
    """One light template: its pid, the node's end of its socket, and what it can fork.

    Args:
        node: the node's name (for the log).
        pid: its pid (a child of the template).
        sock: the node's end of its socket (non-blocking).
    """

    def __init__(self, node: str, pid: int, sock: socket.socket) -> None:
        self.node = node
        self.pid = pid
        self.sock = sock
        self.lock = anyio.Lock()
        self.complete: frozenset[str] = frozenset()
        self.ready = False

    def takes(self, main: str, modules: Iterable[str]) -> bool:
        """Whether it forks this child: the supervisor, or a worker of classes it has whole."""
        return self.ready and (main == "supervisor" or all(m in self.complete for m in modules))

    def on_hello(self, hello: dict[str, Any]) -> None:
        """Its hello came: it forks from now on."""
        self.complete = frozenset(str(c) for c in hello.get("complete", ()) if isinstance(c, str))
        self.ready = True
        log.info("light_template_ready", node=self.node, light_pid=self.pid, classes=len(self.complete))

    def close(self, why: str | None = None) -> None:
        """Use it no more: stop it (its template reaps it, or the node once that is gone)."""
        if why is not None and self.ready:
            log.warning("light_template_failed", node=self.node, light_pid=self.pid, error=why)
        self.ready = False
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGTERM)
        self.sock.close()


async def reap_when_dead(pid: int, within_s: float) -> None:
    """Reap ``pid`` once it has exited, if it is (or becomes) this process's child: a light
    template whose template is gone is reparented to the node, which is a subreaper. Polled with
    ``WNOHANG``, by its pid only, for at most ``within_s``."""
    with anyio.move_on_after(within_s):
        while True:
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222  # never blocks
            except ChildProcessError:  # not ours (yet: its template still runs, or init took it)
                if not pid_alive(pid):
                    return
                done = 0
            if done:
                return
            await anyio.sleep(_REAP_POLL_S)
