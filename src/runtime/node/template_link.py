"""The node's side of its template process (``template.py``): start it, ask it for workers,
replace it when it dies.

A forked worker is reparented to the node (the node is a child subreaper while its template
runs), so the node waits for it and signals it like a worker it spawned; :class:`ForkedProcess`
gives it the interface of the spawned one's process. The template is a shortcut, never a
dependency: while it starts anew, is unusable or was switched off (``[node] fast_start =
false``), :meth:`TemplateLink.launch` answers None and the node spawns the worker as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.abc import Process

from troupe.lean_start import argv as lean_argv
from troupe.runtime.library_logging import get_logger
from troupe.template_prestart import template_argv

from .child import child_env
from .config import WorkerSpec
from .forked_process import ForkedProcess
from .light_link import LightTemplate, reap_when_dead
from .orphans import reap_orphans
from .template import CHECKS_ENV, FD_ENV, MAINS, MAX_MESSAGE, MODULES_ENV, NODE_ENV

if TYPE_CHECKING:
    from troupe.runtime.core.loading import Check
    from troupe.template_prestart import Prestarted

__all__ = [
    "READY_S",
    "ClassCheck",
    "ForkedProcess",
    "TemplateLink",
    "spec_classes",
    "start_child",
]

log = get_logger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
READY_S = 120.0  # imports only; torch with CUDA libraries takes seconds on a slow disk
_REPLY_S = 10.0  # a fork: milliseconds; longer means the template is stuck
_RESTART_BACKOFF_S = 1.0
_STOP_S = 5.0  # a stopped or killed template's exit; longer only on a machine that stalls
_MAX_RESTARTS = 5  # a template that keeps dying (a module crashes its import): spawn for good


def spec_classes(specs: Iterable[WorkerSpec]) -> list[str]:
    """The actor classes of ``specs`` (``pkg.mod:Class``), each once: what the template imports."""
    return list(dict.fromkeys(actor.cls for spec in specs for actor in spec.actors))


def _set_subreaper(on: bool) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on))


@dataclass(frozen=True)
class ClassCheck:
    """What the template found checking the classes it was given: ``failure`` is the first
    one's ``(field, error)`` (``loading.first_failure``), None when every class passed."""

    failure: tuple[str, str] | None


class TemplateLink:
    """One node's template process, kept running while the node serves.

    Args:
        node: the node's name (for the log).
        modules: what the template imports at start besides what every worker imports:
            modules, or actor classes (``pkg.mod:Class``: its module, and the modules the class
            names in ``preload_modules``).
        record: told ``(pid, role)`` of each template started (the node's child record).
        reap_orphans: reap the zombies the node adopts as a subreaper (``orphans``).
        checks: ``(field, class, kind, kwarg names)`` to check once imported (``loading.first_failure``),
            answered by :meth:`checked`: a run that starts its template before anything else
            checks its stage classes there, in the time the imports take anyway.
        ahead: a template the command started ahead (``template_prestart.prestart``): the
            first one, told its node, ``modules`` and ``checks`` now; later ones start anew.
        ready_s: how long a template may import before it is given up on (killed; the node
            spawns meanwhile, and starts another).
        installed_only: ``ahead`` checks only the classes whose package it finds
            (``loading.installed_here``): a run on a cluster's nodes leaves the others to them.
    """

    def __init__(
        self,
        node: str,
        modules: Iterable[str],
        record: Callable[[int, str], None] | None = None,
        reap_orphans: bool = False,
        checks: Sequence[Check] = (),
        ahead: Prestarted | None = None,
        ready_s: float = READY_S,
        installed_only: bool = False,
    ) -> None:
        self.node = node
        self._ahead = ahead
        self.reap_orphans = reap_orphans
        self.record = record
        self.modules = list(dict.fromkeys(modules))
        self.checks = [list(c) for c in checks]
        self._check: ClassCheck | None = None
        self._check_known = anyio.Event()  # set with ``_check``
        self._light: LightTemplate | None = None  # the template's light sibling (light_link.py)
        self._light_settled = anyio.Event()  # it is ready, or gone
        self.ready_s = ready_s
        self.installed_only = installed_only
        self.importing: str | None = None  # until ready: the class or module it imports now
        self.stuck: str | None = None  # the import a template's ready_s ran out in (it was killed)
        self.process: Process | None = None
        self.pid: int | None = None
        self.forks = 0
        self.restarts = 0
        self._sock: socket.socket | None = None
        self._ready = anyio.Event()
        self._lock = anyio.Lock()
        self._stopping = False
        # Set once the first template is ready or gone: launches wait for the first one (it
        # does the imports a spawned worker would do), never for a replacement.
        self._settled = anyio.Event()

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start the template (in ``tg``) and keep it running until :meth:`stop`."""
        _set_subreaper(True)
        tg.start_soon(self._keep_running)
        if self.reap_orphans:  # a subreaper adopts what dead workers left running
            tg.start_soon(reap_orphans)

    async def _keep_running(self) -> None:
        while not self._stopping:
            try:
                await self._run_one()
            except Exception as exc:  # could not even start it: the node spawns meanwhile
                log.warning("template_failed", node=self.node, error=repr(exc))
            if self._stopping or self.restarts >= _MAX_RESTARTS:
                break
            self.restarts += 1
            await anyio.sleep(_RESTART_BACKOFF_S)
        self._settled.set()
        if not self._stopping:
            log.warning("template_given_up", node=self.node, restarts=self.restarts)

    async def _run_one(self) -> None:
        ahead, self._ahead = self._ahead, None
        process: Process
        if ahead is not None:  # started by the command: told now what a spawned one is told at start
            process, ours = ForkedProcess(ahead.pid, None), ahead.sock
            ours.setblocking(False)
            told: dict[str, object] = {"node": self.node, "modules": self.modules, "checks": self.checks}
            if self.installed_only:
                told["installed_only"] = True
            later = json.dumps(told).encode()
        else:
            (process, ours), later = await self._spawn(), None
        self.process, self.pid, self._sock = process, process.pid, ours
        if self.record is not None:
            self.record(process.pid, "template")
        log.info(
            "template_started",
            node=self.node,
            template_pid=process.pid,
            # Started by the command, this many seconds before its node took it over.
            ahead_s=None if ahead is None else round(time.monotonic() - ahead.started, 3),
        )
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._await_ready, ours, later, tg)
                code = await process.wait()
                tg.cancel_scope.cancel()
        finally:
            self._ready = anyio.Event()
            self._settled.set()
            self._light_settled = anyio.Event()
            light, self._light = self._light, None
            if light is not None:
                light.close()
            with anyio.CancelScope(shield=True):
                if process.returncode is None:  # cancelled while it runs: it goes with this task
                    with anyio.move_on_after(_STOP_S):
                        with contextlib.suppress(ProcessLookupError):
                            process.kill()
                        await process.wait()  # reaped here: a forked one has no one else to reap it
                if light is not None:  # the node's child now, dead of its parent-death signal
                    await reap_when_dead(light.pid, _STOP_S)
            self.process, self._sock = None, None
            ours.close()
        if not self._stopping:
            log.warning("template_exited", node=self.node, template_pid=self.pid, returncode=code)

    async def _spawn(self) -> tuple[Process, socket.socket]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            extra = {
                FD_ENV: str(theirs.fileno()),
                MODULES_ENV: json.dumps(self.modules),
                NODE_ENV: self.node,
            }
            if self.checks:
                extra[CHECKS_ENV] = json.dumps(self.checks)
            env = child_env(extra)
            process = await anyio.open_process(
                template_argv(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=None,
                stderr=None,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # out of the terminal's Ctrl-C: the node stops it (child.py)
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return process, ours

    async def _await_ready(self, sock: socket.socket, later: bytes | None, tg: anyio.abc.TaskGroup) -> None:
        try:
            with anyio.fail_after(self.ready_s):
                if later is not None:  # read once the template's own imports are done
                    await _send_fds(sock, later)
                hello, fds = await _receive_fds(sock)
                while "ready" not in hello:  # what it imports next, or its light sibling
                    if "importing" in hello:
                        self.importing = str(hello["importing"])
                    elif "light" in hello and fds and self._light is None:
                        self._take_light(int(hello["light"]), socket.socket(fileno=fds.pop()), later, tg)
                    _close(*fds)
                    hello, fds = await _receive_fds(sock)
                _close(*fds)
        except (TimeoutError, OSError, ValueError) as exc:
            if isinstance(exc, TimeoutError) and self.importing is not None and self.stuck is None:
                self.stuck = self.importing  # the first template's: the run says so
            log.log(  # a node stopped as its template started: that is no fault
                logging.INFO if self._stopping else logging.WARNING,
                "template_not_ready",
                node=self.node,
                error=repr(exc),
                importing=self.importing,
            )
            self._kill()
            return
        self.importing = None
        if hello.get("skipped"):
            # A class's workers import it as spawned ones would, and say why; a node's preload
            # that raised on import has nobody else to say so.
            log.warning("template_skipped_modules", node=self.node, skipped=hello["skipped"])
        log.info(
            "template_ready", node=self.node, template_pid=self.pid, imported=len(hello.get("imported", ()))
        )
        self._take_check(hello.get("check_failure", False))
        self._ready.set()
        self._settled.set()

    def _take_check(self, failure: Any) -> None:
        """A hello's ``check_failure`` (absent, False: it could not check), the first one only."""
        if self.checks and self._check is None and failure is not False:
            self._check = ClassCheck(None if failure is None else (str(failure[0]), str(failure[1])))
            self._check_known.set()

    def _take_light(
        self, pid: int, sock: socket.socket, later: bytes | None, tg: anyio.abc.TaskGroup
    ) -> None:
        """The template forked its light sibling: await its hello (in ``tg``, the template's)."""
        sock.setblocking(False)
        light = self._light = LightTemplate(self.node, pid, sock)
        if self.record is not None:
            self.record(pid, "light template")
        tg.start_soon(self._await_light, light, later)

    async def _await_light(self, light: LightTemplate, later: bytes | None) -> None:
        try:
            with anyio.fail_after(self.ready_s):
                if later is not None:  # it waits for the node's word as its template does
                    await _send_fds(light.sock, later)
                hello = await _receive(light.sock)
                while "ready" not in hello:  # what it imports (its template names them too)
                    hello = await _receive(light.sock)
        except (TimeoutError, OSError, ValueError) as exc:
            log.info("light_template_not_ready", node=self.node, light_pid=light.pid, error=repr(exc))
            light.close()
            self._light_settled.set()
            return
        light.on_hello(hello)
        self._take_check(hello.get("check_failure", False))
        self._light_settled.set()

    async def checked(self) -> ClassCheck | None:
        """The first template's check of ``checks`` once it is ready; None when it could not
        say (it failed to start, died, or a module ended it as it imported, or it is ``stuck``
        in an import): check elsewhere."""
        if not self._settled.is_set() and not self._check_known.is_set():
            # Past the template's own ready bound (and its kill): it settles first, ``stuck`` set.
            with anyio.move_on_after(self.ready_s + _STOP_S):
                await _first(self._settled, self._check_known)
        return self._check

    async def settled(self) -> None:
        """Wait until the first template is ready, or given up on (``stuck`` says if in an
        import), or the link stops."""
        await self._settled.wait()

    def adopt(self, record: Callable[[int, str], None]) -> None:
        """Hand this running template to a node: ``record`` is told its pid, and any later one's."""
        self.record = record
        if self.process is not None and self.pid is not None:
            record(self.pid, "template")
        if self._light is not None:
            record(self._light.pid, "light template")

    async def launch(
        self, env: dict[str, str], modules: Iterable[str], main: str = "worker"
    ) -> ForkedProcess | None:
        """Fork a worker with ``env`` (and the node's cwd) from the template; None when the
        template cannot (the caller spawns the worker instead). ``modules`` are imported by
        the template afterwards (modules or classes), for the next worker that needs them.

        With ``main="supervisor"`` the fork is the node's supervisor, on the node's own
        stderr (as a spawned one is), and only a template ready now forks it: while the first
        one still imports, a spawned supervisor imports alongside it, on another core.

        The template's light sibling (``light_link.py``), once ready, forks the supervisor and
        the workers whose classes it has whole; a worker waits for the first of the two.
        """
        if self._stopping:
            return None
        modules = list(modules)
        worker = main == "worker"
        if worker and not self._settled.is_set():  # the first of the two to be ready forks it
            with anyio.move_on_after(self.ready_s):
                await _first(self._settled, self._light_settled)
        light = self._light
        if light is not None and light.takes(main, modules):
            async with light.lock:
                if light.ready:
                    try:
                        forked = await _fork(light.sock, env, modules, main, self.node)
                    except (TimeoutError, OSError, ValueError) as exc:
                        light.close(repr(exc))  # its template forks instead
                        forked = None
                    if forked is not None:
                        self.forks += 1
                        return forked
        if worker and not self._settled.is_set():
            with anyio.move_on_after(self.ready_s):
                await self._settled.wait()
        async with self._lock:
            sock = self._sock
            if sock is None or not self._ready.is_set():
                return None
            try:
                forked = await _fork(sock, env, modules, main, self.node)
            except (TimeoutError, OSError, ValueError) as exc:
                log.warning("template_fork_failed", node=self.node, error=repr(exc))
                self._kill()  # it is stuck or broken: a new one starts
                return None
            if forked is not None:
                self.forks += 1
            return forked

    async def stop(self) -> None:
        """Stop the template (its workers are not its children: they stay, for the node to stop)."""
        self._stopping = True
        self._settled.set()
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # stopped before it took over the one started ahead
            ahead.discard()
        if self._light is not None:  # first: it finishes a fork under way, as its template does
            self._light.close()
        self._kill(signal.SIGTERM)
        process = self.process
        if process is not None:
            with anyio.move_on_after(_STOP_S):
                await process.wait()
            if process.returncode is None:
                self._kill()
        _set_subreaper(False)

    def describe(self) -> dict[str, Any]:
        """Plain data for the node's status reply."""
        return {
            "pid": self.pid if self.process else None,
            "ready": self._ready.is_set(),
            "forks": self.forks,
            "restarts": self.restarts,
            "light_pid": self._light.pid if self._light is not None and self._light.ready else None,
        }

    def _kill(self, signum: signal.Signals = signal.SIGKILL) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)


async def start_child(
    template: TemplateLink | None, main: str, env: dict[str, str], modules: Iterable[str] = ()
) -> tuple[Process, str]:
    """Start a child of the node that runs ``main`` (a key of ``MAINS``): forked from
    ``template`` when it can, else spawned as ``python -P -m troupe.lean_start`` (no rich, the
    current folder after the installed packages); with
    how it started, ``"fork"`` or ``"spawn"``. A worker's stderr is a pipe the node reads
    (``WorkerHandle.wait`` keeps its tail); the supervisor writes to the node's own."""
    forked = None if template is None else await template.launch(env, modules, main)
    if forked is not None:
        return forked, "fork"
    process = await anyio.open_process(
        lean_argv(MAINS[main]),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=subprocess.PIPE if main == "worker" else None,
        start_new_session=True,  # out of the terminal's Ctrl-C: the node stops it (child.py)
    )
    return process, "spawn"


def _own_stderr() -> int:
    """A copy of this process's stderr descriptor (of /dev/null where it has none)."""
    try:
        return os.dup(2)
    except OSError:
        return os.open(os.devnull, os.O_WRONLY)


async def _send_fds(sock: socket.socket, data: bytes, fd: int | None = None) -> None:
    while True:
        try:
            socket.send_fds(sock, [data], [] if fd is None else [fd])
            return
        except BlockingIOError:
            await anyio.wait_writable(sock)


async def _fork(
    sock: socket.socket, env: dict[str, str], modules: list[str], main: str, node: str
) -> ForkedProcess | None:
    """Ask the template (or its light sibling) on ``sock`` to fork ``main``; None when it
    refused (said why); raises when it is stuck or broken."""
    worker = main == "worker"
    read_end, write_end = os.pipe() if worker else (-1, _own_stderr())
    request = {"env": env, "cwd": os.getcwd(), "modules": modules, "main": main}
    try:
        # Shielded: once the request is out, the template forks whatever happens here,
        # and a reply read by nobody left a worker no node knew of (a restart cancelled
        # by its node's stop: the worker outlived the node).
        with anyio.CancelScope(shield=True), anyio.fail_after(_REPLY_S):
            await _send_fds(sock, json.dumps(request).encode(), write_end)
            os.close(write_end)
            write_end = -1
            reply = await _receive(sock)
    except BaseException:
        _close(read_end, write_end)
        raise
    if "pid" not in reply:
        _close(read_end)
        log.info("template_fork_refused", node=node, error=reply.get("error"))
        return None
    return ForkedProcess(int(reply["pid"]), read_end if worker else None)


async def _first(*events: anyio.Event) -> None:
    """Wait until one of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def one(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(one, event)


async def _receive(sock: socket.socket) -> dict[str, Any]:
    message, fds = await _receive_fds(sock)
    _close(*fds)
    return message


async def _receive_fds(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A message and the descriptors it carried (the light template's socket, in one)."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
            break
        except BlockingIOError:
            await anyio.wait_readable(sock)
    if not data:
        _close(*fds)
        raise OSError("the template closed its socket")
    try:
        message = json.loads(data)
        if not isinstance(message, dict):
            raise ValueError(f"the template said {message!r}")
    except ValueError:
        _close(*fds)
        raise
    return message, fds


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
