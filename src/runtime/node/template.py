"""The template process: a fork server that starts a node's workers without their imports.

Started by the node (``template_link.py``) as ``python -P -m troupe.lean_start
troupe.runtime.node.template`` with one end of a ``SOCK_SEQPACKET`` socket pair as fd
``$TROUPE_TEMPLATE_FD``. It imports what a worker imports (``worker_process`` and its
dependencies, uvloop, anyio's asyncio backend) and the modules the node names (its actor
classes', and with them numpy or torch): imports only, so no thread pool, CUDA context or
ZeroMQ context exists here, and forking stays safe. Until it is ready it names each class or
module before its import (``{"importing": name}``), so that one whose import hangs is named
while the node waits. It stays single-threaded: it watches its
node by polling, not with the watchdog thread a worker has.

A command may start it ahead, before its own imports (``template_prestart.py``, with
``$TROUPE_TEMPLATE_LATER``): it imports what it was given, then waits for the node's first
message, with the node's name, the classes to check and any modules the guess missed.

It imports with the garbage collector off and freezes what it imported (``gc.freeze``) before it
serves, as the gc module's documentation advises for a process that forks without exec: the
collector had been scanning the imports' long-lived objects again and again (a sixth of the
template's start), and a forked worker, whose collector is on again, never scans those objects
nor writes to their pages.

A fork request carries the worker's environment and cwd, its stderr (a pipe, or the node's
own stderr for the supervisor) as an ``SCM_RIGHTS`` file descriptor, and what the fork runs
(``main``: a worker, or the node's supervisor). The template forks an intermediate process which forks the
worker and exits at once; the node is a child subreaper, so the worker is reparented to the
node: it is the node's own child (``waitpid``, the parent-death signal and the watchdog work
as for a spawned worker), and it outlives this template. The reply is the worker's pid, sent
once the intermediate is reaped (the worker is the node's child by then).

Then the worker becomes what a spawned worker is: stderr on the pipe, stdin on /dev/null,
the node's environment and cwd, fresh random seeds, and ``worker_process.main()``.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import random
import select
import signal
import socket
import sys
import threading
import time
from typing import Any, NoReturn

from troupe.runtime.node.deferred_stop import DeferredStop
from troupe.runtime.node.template_preload import complete_classes, preload, preloads_pending, telling
from troupe.template_prestart import CHECK_ONLY_ENV, CHECKS_ENV, FD_ENV, LATER_ENV, MODULES_ENV, NODE_ENV

__all__ = [
    "BASE_MODULES",
    "CHECKS_ENV",
    "FD_ENV",
    "LATER_ENV",
    "MAINS",
    "MAX_MESSAGE",
    "MODULES_ENV",
    "NODE_ENV",
    "main",
]

MAX_MESSAGE = 1 << 20
# What every worker imports before it serves (the asyncio backend is imported by anyio.run).
BASE_MODULES = ("troupe.runtime.node.worker_process", "uvloop", "anyio._backends._asyncio")
# What a fork may become (a request's ``main``): a worker, or the node's supervisor, which
# imports little beyond a worker's modules and so starts in milliseconds here too.
MAINS = {
    "worker": "troupe.runtime.node.worker_process",
    "supervisor": "troupe.runtime.supervision.supervisor",
}
_PARENT_POLL_S = 0.5
_REPARENT_WAIT_S = 5.0


def main() -> None:
    """Entry point: preload, then serve fork requests until the node goes; returns only in a
    forked worker, which then runs as a worker process."""
    parent = os.getppid()
    _die_with_parent()
    # Its node stops it (SIGTERM, or the socket's end); Ctrl-C at the terminal is the node's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=int(os.environ.pop(FD_ENV)))
    wanted = json.loads(os.environ.pop(MODULES_ENV, "[]"))
    checks = json.loads(os.environ.pop(CHECKS_ENV, "[]"))
    lazy = os.environ.pop(CHECK_ONLY_ENV, "") != "1"
    installed_only = False
    # What the template makes lives until it exits, so the collector only scans it over and
    # over: during torch's import alone, about a sixth of the start-up. Frozen, the forked
    # workers' collections skip it, and never write to its pages (no copy-on-write).
    gc.disable()
    from troupe.runtime.core.process_role import set_role
    from troupe.runtime.node.child import name_process  # a worker imports it anyway

    set_role("template")

    node = os.environ.pop(NODE_ENV, "?")
    title = "troupe template"
    name_process(f"{title} (node {node})", "troupe-template")
    names = [*BASE_MODULES, *wanted]
    # The classes first, without what they preload: a light sibling forked here serves the
    # workers that need no more (and the supervisor) while this one imports torch, say.
    imported, skipped = preload(names, telling(sock), lazy=False)
    light_sock = fork_light(sock) if lazy and preloads_pending(names, skipped) else None
    light = light_sock is not None
    if light_sock is not None:
        sock, lazy, parent, title = light_sock, False, os.getppid(), "troupe light template"
        set_role("light template")
        name_process(f"{title} (node {node})", "troupe-template")
    elif lazy:
        more, more_skipped = preload([n for n in names if n not in skipped], telling(sock))
        imported += [m for m in more if m not in imported]
        skipped.update(more_skipped)
    if os.environ.pop(LATER_ENV, ""):  # started ahead (template_prestart.py): now its node speaks
        later = _receive_later(sock)
        if later is None:  # the command ended without a node for it
            os._exit(0)  # no teardown of the imports: torch's alone takes seconds
        node = str(later.get("node", node))
        name_process(f"{title} (node {node})", "troupe-template")
        told = [str(m) for m in later.get("modules", ())]
        names += told
        more, more_skipped = preload(told, telling(sock), lazy=lazy)
        imported += [m for m in more if m not in imported]
        skipped.update(more_skipped)
        checks = later.get("checks", [])
        installed_only = later.get("installed_only") is True
    hello: dict[str, Any] = {"ready": True, "pid": os.getpid(), "imported": imported, "skipped": skipped}
    if light:  # the classes it forks workers of: those that preload nothing it lacks
        hello["complete"] = complete_classes(n for n in names if n not in skipped)
    if checks:  # the classes are imported now: checking them costs the run no child of its own
        from troupe.runtime.core.loading import first_failure, installed_here

        try:
            hello["check_failure"] = first_failure(installed_here(checks) if installed_only else checks)
        except BaseException:  # a module that exits as it imports: the run's own child says so
            pass
    _read_codec_entry_points()
    gc.freeze()
    _send(sock, hello)
    job = _serve(sock, parent, lazy)
    if job is None:
        return
    _become_worker(job)
    _run_main(MAINS[job.get("main", "worker")])


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (a fork does not inherit it)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _receive_later(sock: socket.socket) -> dict[str, Any] | None:
    """The node's first message to a template started ahead; None once the socket ends."""
    try:
        data = sock.recv(MAX_MESSAGE)
        message = json.loads(data) if data else None
    except (OSError, ValueError):
        return None
    return message if isinstance(message, dict) else None


def _run_main(module_name: str) -> NoReturn:
    """Run the worker (or supervisor), then exit without tearing down the modules, which are
    the template's (torch's teardown alone takes seconds, in workers that never used it)."""
    from troupe.runtime.node.child import run_and_exit

    module = importlib.import_module(module_name)
    sys.argv = [module.__file__ or module_name]
    run_and_exit(module.main)


def fork_light(sock: socket.socket) -> socket.socket | None:
    """Fork the light template, a sibling of this one with the classes imported but not what
    they preload: the node forks the workers that need no more from it (and its supervisor)
    while this one goes on importing. Returns its socket in the light template; None here,
    where the node is sent the other end (``{"light": pid}``), or where none was forked."""
    if _threads() > 1:  # as for a worker's fork
        return None
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError:
        return None
    template = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return None
    if pid == 0:  # it lives as long as this template does (the node stops this one)
        theirs.close()
        sock.close()
        _die_with_parent()
        if os.getppid() != template:
            os._exit(0)
        return ours
    ours.close()
    try:
        socket.send_fds(sock, [json.dumps({"light": pid}).encode()], [theirs.fileno()])
    except OSError:  # the node is gone, or never listened: this template serves alone
        _kill(pid)
        os.waitpid(pid, 0)
    finally:
        theirs.close()
    return None


def _read_codec_entry_points() -> None:
    """Read the codec entry points here, once: each worker read them as it started (twice, when
    its template had imported torch), 30 ms of a forked worker's 60."""
    from troupe.runtime.wire.codec import declared_extensions

    try:
        declared_extensions()
    except Exception:  # unreadable metadata: each worker reads it as before, and says so
        pass


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode())


def _answer(sock: socket.socket, message: dict[str, Any]) -> bool:
    """Answer a fork request; False when the node is gone (it closed the socket as it stopped)."""
    try:
        _send(sock, message)
    except OSError:
        return False
    return True


def _serve(sock: socket.socket, parent: int, lazy: bool = True) -> dict[str, Any] | None:
    """Answer fork requests; returns a request's job in the forked worker, None in the template
    once the node (a light template's: its template) is gone or closed the socket. ``lazy``:
    a request's classes bring what they preload for the next fork (not in a light template)."""
    # Its sys.path was made from these: a worker started elsewhere is spawned, as before.
    start_cwd, start_path = os.getcwd(), os.environ.get("PYTHONPATH")
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    stop = DeferredStop()
    stop.install()
    while True:
        if os.getppid() != parent:
            return None
        if not poller.poll(int(_PARENT_POLL_S * 1000)):
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
        except OSError:
            return None
        if not data:
            return None
        job: dict[str, Any] = json.loads(data)
        job["stderr_fd"] = fds[0] if fds else None
        if job.get("main", "worker") not in MAINS:
            _close(job["stderr_fd"])
            if not _answer(sock, {"error": f"no such main {job.get('main')!r}: one of {sorted(MAINS)}"}):
                return None
            continue
        if job["cwd"] != start_cwd or job["env"].get("PYTHONPATH") != start_path:
            _close(job["stderr_fd"])
            if not _answer(sock, {"error": "the worker's cwd or PYTHONPATH differs from the template's"}):
                return None
            continue
        if _threads() > 1:  # a module started a thread: a fork would copy its locks mid-use
            _close(job["stderr_fd"])
            if not _answer(sock, {"error": f"the template runs {_threads()} threads; forking is unsafe"}):
                return None
            continue
        # The node's stop (SIGTERM) waits until it has the pid: a template ended between the
        # fork and its answer left a worker its node never knew of, running on after it.
        with stop.deferred():
            try:
                pid = _fork(job, sock)
            except OSError as exc:
                _close(job["stderr_fd"])
                if not _answer(sock, {"error": f"fork failed: {exc}"}):
                    return None
                continue
            if pid == 0:
                return job  # the worker (a stop now ends it: DeferredStop)
            _close(job["stderr_fd"])
            answered = _answer(sock, {"pid": pid})
        if not answered:
            # The node stopped while this one was forked, and will never know its pid: it goes
            # now, rather than start a worker for nobody.
            _kill(pid)
            return None
        # Learnt for the next fork (a restart, another replica), after this one is under way.
        preload(list(job.get("modules", ())), lazy=lazy)
        gc.freeze()


def _fork(job: dict[str, Any], sock: socket.socket) -> int:
    """Fork the worker through an intermediate process; returns its pid (0 in the worker)."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # the intermediate: fork the worker, tell the template its pid, and go
        try:
            os.close(read_end)
            me = os.getpid()
            worker = os.fork()
            if worker == 0:
                os.close(write_end)
                sock.close()
                _wait_reparented(me)
                return 0
            os.write(write_end, str(worker).encode())
        except BaseException:  # the template sees no pid and says so
            pass
        os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            said = pipe.read()
    finally:
        os.waitpid(middle, 0)  # once reaped, the worker is the node's child
    if not said:
        raise OSError("the intermediate process died before forking the worker")
    return int(said)


def _wait_reparented(middle: int) -> None:
    """Wait until the intermediate process has exited (a bounded poll of our own parent)."""
    deadline = time.monotonic() + _REPARENT_WAIT_S
    while os.getppid() == middle and time.monotonic() < deadline:
        time.sleep(0.0002)


def _become_worker(job: dict[str, Any]) -> None:
    """Turn this fork of the template into what a spawned worker starts as."""
    if job.get("main", "worker") == "worker":
        # A process group of its own, as a spawned worker's session gives it: what it starts
        # stays in it (a shell's `helper &` too), and is killed with it (worker_descendants.py).
        os.setpgid(0, 0)
    gc.enable()  # the template's objects stay frozen: the worker collects only its own
    signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored by the template only
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stderr_fd = job["stderr_fd"]
    if stderr_fd is not None:
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    # A forked worker would otherwise share the template's random state with its siblings.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


def _threads() -> int:
    """Python threads of the template. A native helper thread that a module starts on import
    (torch starts one, pyarrow's jemalloc one) is left to its fork handlers, as torch's own
    DataLoader fork does; a Python thread could hold an interpreter-level lock mid-fork."""
    return threading.active_count()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:  # gone already
        pass


def _close(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


if __name__ == "__main__":
    main()
