"""A node's link to the master: beats with the host's resources, worker exits, drains.

When a node's config names a master (``[node] master = "tcp://..."`` or ``--master``), the node
runs a :class:`MasterLink`. It

- beats to the master every ``beat_s`` with the host's resources (:func:`host_resources`), its
  tags (``[node] tags``, what it offers replicas: :mod:`troupe.runtime.placement`) and
  its running processes with their mailboxes, and the code it runs (``code``,
  :func:`~troupe.runtime.code_identity.code_identity`: ``ctl status`` shows which node runs
  what, and ``troupe run --cluster`` says when they differ), so the master knows the node is alive, where to
  reach it, and where its actors listen (the cluster's directory of names: a node resolves an
  actor of another host through :func:`resolve_through_master`); a node that stops beating is
  declared dead by the master and its tasks are requeued. When its link comes back (a cut
  network, a restarted master), the next beat makes it alive again: nothing to re-register,
  and its workers' getters register again by themselves when the master answers them
  ``unknown_worker``, under the same names;
- beats at once, off its period, when the node has started a worker on request
  (:meth:`MasterLink.beat_now`, before the node answers ``spawn_worker``), or a worker an actor
  (before the node answers its ``actor_spawned``, and so before the worker's ``spawn``): whoever learns of
  the worker from that answer (a run's engine, and through it every replica pulling from it,
  nodes of an older troupe among them) finds it in the master's directory, not only after the
  next beat;
- tells the master ``worker_left`` the moment one of its worker processes exits (from the
  node's ``worker_exit_listeners``), so that worker's leases are requeued at once instead of
  when they expire;
- tells the master ``node_left`` when the node stops on purpose (SIGTERM, Ctrl-C, ``shutdown``),
  once its workers have stopped (:meth:`MasterLink.leave`): the master marks it stopped at
  once rather than dead after its node timeout, and requeues what it held then. It beats no
  more from there; a master that does not answer holds the stop as long as a beat waits;
- answers the master's ``master_drained``: the node's drain is over (its workers hold no task
  any more), so it stops its workers; and ``master_undrained`` (``troupe ctl undrain``): it
  starts again the workers the drain stopped, which join the master and pull tasks. Its beats
  say whether it is drained, with the token of the last undrain it took: a master that
  restarted (or declared it dead) meanwhile learns the drain from them, and one that undrained
  it tells a beat sent before the undrain by its older token.

Each beat waits for its reply a third of the master's node timeout (which the master's
answer says; :attr:`MasterLink.reply_s`), not one beat: over a link of a second's round trip,
or a new CURVE connection's five, the reply of a beat the master took came after a bound of
one second, and the node said its beats failed every few seconds while the master had it
alive. One beat without a reply is said at info, as a slow link's; a warning, and the advice
about keys, come only where keys can be the matter: the master refused this node's key, or
never answered any of ``WARN_AFTER`` beats in a row.

The workers themselves talk to the master directly (their TaskGetter); the link carries only
what the node alone knows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import psutil

from troupe.runtime.code_identity import code_identity
from troupe.runtime.core.ref import ActorAddress
from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import ActorStopped, NameTaken, Unreachable
from troupe.runtime.library_logging import get_logger
from troupe.runtime.process_identity import process_identity
from troupe.runtime.security.process import installed
from troupe.runtime.start_limits import in_thread

from .reach import advertised_endpoint
from .worker_handles import HandleState

if TYPE_CHECKING:
    from .ports import LinkedNode
    from .worker_handles import WorkerHandle

__all__ = [
    "NODE_TIMEOUT_S",
    "REPLY_MOST_S",
    "WARN_AFTER",
    "MasterLink",
    "count_gpus",
    "host_resources",
    "resolve_through_master",
]

log = get_logger(__name__)
_PROBE_S = 1.0  # the look at the master's port after a failed beat
NODE_TIMEOUT_S = 10.0
"""The master's node timeout a node counts on until the master's answer says its own (the
default of ``troupe master start --node-timeout``; a master older than that answer says none)."""
REPLY_MOST_S = 4.0
"""The longest a beat waits for its reply, whatever the master's node timeout: a node's answer
to a spawn waits for a beat (:meth:`MasterLink.beat_now`), and a worker asks it for 10 s."""
WARN_AFTER = 3
"""Beats in a row without a reply before the node warns (and, never answered, gives the hints
about keys): fewer are a slow link's late replies or a master's restart, said at info."""

_GPU_COUNT: int | None = None  # probing may run nvidia-smi: do it once per process


def count_gpus() -> int:
    """Count the GPUs this host lets its processes use, without importing torch.

    In order: ``CUDA_VISIBLE_DEVICES`` when set (it is what CUDA programs will see; empty or
    ``-1`` means none), else the entries of ``/proc/driver/nvidia/gpus`` (the NVIDIA driver's
    own list), else the ``GPU n:`` lines of ``nvidia-smi -L`` when the tool is installed, else
    0. AMD and other accelerators are not counted.
    """
    global _GPU_COUNT
    if _GPU_COUNT is not None:
        return _GPU_COUNT
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d for d in visible.split(",") if d.strip()]
        count = 0 if not ids or ids[0].strip() == "-1" else len(ids)
    else:
        count = _driver_gpus()
    _GPU_COUNT = count
    return count


def _driver_gpus() -> int:
    proc_dir = Path("/proc/driver/nvidia/gpus")
    if proc_dir.is_dir():
        return sum(1 for _ in proc_dir.iterdir())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def host_resources() -> dict[str, Any]:
    """Return what a node reports: CPUs, load, memory and GPUs of this host."""
    mem = psutil.virtual_memory()
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = 0.0
    return {
        "cpus": psutil.cpu_count() or 1,
        "load1": round(load1, 2),
        "cpu_percent": psutil.cpu_percent(interval=None),
        "mem_total_mib": round(mem.total / 2**20),
        "mem_available_mib": round(mem.available / 2**20),
        "gpus": count_gpus(),
    }


class MasterLink:
    """Keeps one node joined to the master.

    Args:
        node: the node (what :class:`~.ports.LinkedNode` lists of it); its runtime must be
            running when :meth:`run` starts.
        master: the master's endpoint.
        beat_s: seconds between beats; the master's node timeout should be several beats.
        log_endpoint: where the node publishes its log stream, told to the master in each beat.
        leave_s: the longest :meth:`leave` waits for the master; by default as long as a beat
            waits for its reply (:attr:`reply_s`).
    """

    def __init__(
        self,
        node: LinkedNode,
        master: str,
        beat_s: float = 1.0,
        log_endpoint: str = "",
        leave_s: float | None = None,
    ) -> None:
        self.node = node
        self.master = master
        self.log_endpoint = log_endpoint
        self.beat_s = beat_s
        self.leave_s = leave_s
        self.left = False  # said node_left: no beat from then on
        self.beats = 0
        self.failed_beats = 0  # in a row
        self.node_timeout_s = NODE_TIMEOUT_S  # the master's, once its answer says it
        self.resources: dict[str, Any] = {}  # the last reading of ``host_resources``
        self.drained = node.drained  # workers a drain stopped; an undrain starts them again
        # Drained: master_drained came, no master_undrained since (a drain may stop no worker).
        self.is_drained = False
        self.undrain_token = ""  # the last master_undrained's, told in every beat
        self.code = ""  # this node's code identity, read once the link runs
        self.process = process_identity()  # this node process's, said in every beat
        # One beat at a time (the period's and beat_now's): a beat lists the node's processes
        # as it is sent, and one listed earlier must not reach the master after a later one,
        # which would drop the worker just started from the directory until the next beat.
        self._beating = anyio.Lock()

    async def run(self) -> None:
        """Install the hooks, then beat until cancelled."""
        runtime = self._runtime()
        runtime.register_controls({"master_drained": self._drained, "master_undrained": self._undrained})
        self.node.worker_exit_listeners.append(self._worker_exited)
        # Tens of ms of reading source files, once: in a thread, not on the node's loop.
        self.code = await in_thread(code_identity, what="code_identity")
        log.info("master_link_started", master=self.master, beat_s=self.beat_s, code=self.code)
        while True:
            await self._beat(runtime)
            await anyio.sleep(self.beat_s)

    @property
    def reply_s(self) -> float:
        """How long a beat waits for its reply: a third of the master's node timeout, at least
        a beat, at most :data:`REPLY_MOST_S` (3.3 s for the default 10 s).

        Long enough for a slow link (a second's round trip, a new CURVE connection's five),
        short enough that a beat whose reply never comes is followed by the next well within
        the node timeout: the master is told the node lives even while its replies are lost.
        """
        return max(self.beat_s, min(self.node_timeout_s / 3, REPLY_MOST_S))

    def _runtime(self) -> Runtime:
        runtime = self.node.runtime
        if runtime is None:
            raise RuntimeError("the node's runtime is not running; start the link inside Node.run")
        return runtime

    def processes(self) -> dict[str, dict[str, Any]]:
        """The node's running worker processes: ``name -> {endpoint, actors}`` (their mailboxes)."""
        return {
            name: {"endpoint": h.endpoint, "actors": dict(h.actors)}
            for name, h in self.node.workers.items()
            if h.endpoint and h.returncode is None and h.state is HandleState.RUNNING
        }

    async def beat_now(self) -> None:
        """Beat at once: the master's directory then lists the node's running workers.

        Returns once the master answered, or once the beat failed (said as any failed beat,
        bounded as any beat: :attr:`reply_s`, after a beat under way): the caller goes on
        either way, the next beats retry.
        """
        await self._beat(self._runtime())

    async def _beat(self, runtime: Runtime) -> None:
        async with self._beating:
            if not self.left:  # a beat after the leave would make the node alive again
                await self._beat_once(runtime)

    async def leave(self) -> None:
        """Tell the master this node stops on purpose (``node_left``); it beats no more.

        Returns once the master answered, or failed to, or after ``leave_s`` (by default as
        long as a beat waits: over a slow link the answer comes as late as a beat's): a master
        that is down or hung does not hold the node's stop longer. A node the master never
        answered says nothing (it may have no master to tell).
        """
        runtime = self.node.runtime
        if runtime is None or self.beats == 0 or self.left:  # left: said, or refused (NameTaken)
            self.left = True
            return
        self.left = True
        leave_s = self.reply_s if self.leave_s is None else self.leave_s
        error = f"no answer within {leave_s:g}s"
        with anyio.move_on_after(leave_s):
            # A beat under way goes first: sent on the same connection, it reaches the master
            # before the leave, never after it.
            async with self._beating:
                try:
                    await runtime.control(self.master, "node_left", {"node": self.node.name}, timeout=leave_s)
                except Exception as exc:  # down, or an older master that knows no node_left
                    error = repr(exc)
                else:
                    log.info("master_told_node_left", master=self.master)
                    return
        # It declares the node dead once silent, as before the leave was said.
        log.info("master_leave_unanswered", master=self.master, error=error)

    async def _beat_once(self, runtime: Runtime) -> None:
        try:
            self.resources = host_resources()
        except OSError as exc:  # out of descriptors, /proc unreadable: beat on, with the last reading
            log.warning("host_resources_failed", error=str(exc))  # it stopped the node (EMFILE)
        payload = {
            "node": self.node.name,
            "endpoint": advertised_endpoint(runtime.address, self.node.config.advertise),
            "resources": self.resources,  # none at first: the master keeps what it had
            "processes": self.processes(),
            "tags": list(self.node.config.tags),  # what it offers replicas; older masters ignore it
            "code": self.code,  # older masters ignore it too (they take any field they do not read)
            "drained": self.is_drained,  # a restarted master learns the drain (older ones ignore it)
            "undrain_token": self.undrain_token,
            "process": self.process,  # tells a second node of this name (older masters ignore it)
        }
        if self.log_endpoint:  # the node's log stream (log_publisher); older masters ignore it
            payload["log_endpoint"] = self.log_endpoint
        try:
            reply = await runtime.control(self.master, "node_beat", payload, timeout=self.reply_s)
        except NameTaken as exc:  # another node runs under this name: this one stops, saying so
            self.left = True  # no beat more, and no leave: the name's node_left is the other's
            log.error("master_refused_node", master=self.master, error=str(exc))
            self.node.refuse(exc)
            return
        except Exception as exc:  # the master is down, restarting or busy, or the link slow: beat on
            self.failed_beats += 1
            await self._beat_failed(exc)
            return
        self._take_node_timeout(reply)
        if self.failed_beats:
            log.info("master_beat_restored", master=self.master, failed_beats=self.failed_beats)
        self.failed_beats = 0
        self.beats += 1

    def _take_node_timeout(self, reply: Any) -> None:
        """The master's node timeout, from its answer (an older master's says none)."""
        said = reply.get("node_timeout_s") if isinstance(reply, dict) else None
        if isinstance(said, int | float) and not isinstance(said, bool) and 0 < said < 86_400:
            self.node_timeout_s = float(said)

    async def _beat_failed(self, exc: Exception) -> None:
        """Say a failed beat: the first of a run at info, unless the master refused this node's
        key or nothing listens there; ``WARN_AFTER`` in a row (and every 30th) at warning."""
        n = self.failed_beats
        refused = isinstance(exc, Unreachable)  # at once, not late: the handshake refused the key
        if n != 1 and n != WARN_AFTER and n % 30 != 0:
            return
        hint, certain = await self._hint(refused)
        level = log.warning if certain or n >= WARN_AFTER else log.info
        level("master_beat_failed", master=self.master, error=repr(exc), failed=n, hint=hint)

    async def _hint(self, refused: bool) -> tuple[str, bool]:
        """What may be wrong, and whether it is sure (a warning from the first failed beat).

        Keys are named only where they can be the matter: the master refused this node's key,
        or never answered it in ``WARN_AFTER`` beats. A master that answered before has taken
        the keys; a late reply is a slow link's as well as a keyed master's silence.
        """
        late = f"no reply within {self.reply_s:g}s"
        if self.beats:
            return (
                f"the master answered this node before, so keys are not the matter: it is down, "
                f"restarting or busy, or the link to it is slow ({late}); this node beats on"
            ), False
        if not await _listens(self.master):  # no master: keys are no matter
            return (
                f"nothing accepts connections at {self.master}: start the master "
                "(troupe master start), or give this node its endpoint (--master)"
            ), True
        if not refused and self.failed_beats < WARN_AFTER:
            return (
                f"{late}: the link to the master may be slow (a new CURVE connection takes five "
                "round trips), or the master busy; this node beats on"
            ), False
        n = self.failed_beats
        slow = "" if refused else f"; or the link to it is slow ({late} on {n} beats in a row)"
        if installed() is None:
            # Never answered: a master with CURVE keys ignores a node without them.
            return f"if the master runs with CURVE keys, start this node with --keys DIR{slow}", refused
        # Keys of another cluster, or a master without any: silence.
        return (
            "if the master is up, it may run without keys (start this node without --keys), or "
            "this node's --keys DIR may not be its cluster's: both must hold the same cluster key "
            f"pair (a master with keys then logs peer_refused){slow}"
        ), refused

    def _worker_exited(self, handle: WorkerHandle, reason: str) -> None:
        payload = {"worker_id": f"{self.node.name}/{handle.spec.name}", "pid": handle.pid, "reason": reason}
        self._runtime().start_soon(self._tell, "worker_left", payload)

    async def _tell(self, msg_type: str, payload: Any) -> None:
        try:
            await self._runtime().control(self.master, msg_type, payload, timeout=5.0)
        except ActorStopped:  # the node is stopping: its runtime reads no more replies
            log.info("master_report_unanswered", type=msg_type, reason="the node stops")
        except Exception as exc:  # the lease then runs out instead: later, never lost
            log.warning("master_report_failed", type=msg_type, error=repr(exc))

    async def _drained(self, payload: Any) -> list[str]:
        """The master says this node runs no task any more: stop its workers, those of its own.

        Not those started for a requester that owns them (a pipeline's replicas): they run on,
        as a drain promises, and their run stops them. Stopped here, their calls failed at once,
        and an undrain started them again after their run had ended, with nothing to stop them.
        """
        runtime = self._runtime()
        names = [
            name
            for name, h in self.node.workers.items()
            if h.process is not None and h.returncode is None and h.owner is None
        ]
        log.info("node_drained_stopping_workers", workers=names)
        self.drained.update(names)
        self.is_drained = True
        grace = self.node.config.stop_grace_s + 10.0
        for name in names:  # answer now; stopping takes up to the grace period
            # Through the node's own stop_worker control: a stop on purpose, not restarted.
            runtime.start_soon(self._stop_one, runtime, name, grace)
        return names

    async def _undrained(self, payload: Any) -> list[str]:
        """The master ended this node's drain: start again the workers the drain stopped."""
        runtime = self._runtime()
        names = sorted(self.drained)
        self.drained.clear()
        self.is_drained = False
        token = payload.get("token") if isinstance(payload, dict) else None
        # From an older master: none, and the beats carry the last one (it sends no other).
        if isinstance(token, str) and len(token) <= 64:
            self.undrain_token = token
        log.info("node_undrained_starting_workers", workers=names)
        for name in names:  # answer now; each starts once its drain stop has ended
            runtime.start_soon(self._start_again, runtime, name)
        return names

    async def _start_again(self, runtime: Runtime, name: str) -> None:
        handle = self.node.workers.get(name)
        if handle is None:
            return
        with anyio.move_on_after(self.node.config.stop_grace_s + 10.0):
            while handle.returncode is None:  # its drain stop may still be under way
                await handle.exited_event.wait()
        spec = {**handle.spec.model_dump(by_alias=True), "timeout_s": 60.0}
        try:
            await runtime.control(runtime.address, "spawn_worker", spec, timeout=65.0)
        except Exception as exc:
            log.warning("undrained_worker_start_failed", worker=name, error=repr(exc))
            return
        started = self.node.workers.get(name)
        if started is not None and started is not handle:
            # The start made a fresh record: the worker's restarts before the drain are still
            # its own (ctl status showed 0 after every undrain).
            started.restarts += handle.restarts

    async def _stop_one(self, runtime: Runtime, name: str, grace: float) -> None:
        try:
            await runtime.control(runtime.address, "stop_worker", {"name": name}, timeout=grace)
        except Exception as exc:
            log.warning("drained_worker_stop_failed", worker=name, error=repr(exc))


async def resolve_through_master(
    runtime: Runtime, master: str, address: ActorAddress, timeout: float = 5.0
) -> dict[str, str]:
    """Ask the master (the cluster's directory) where an actor of another node listens.

    Returns:
        ``{address, endpoint}``, as a node's own ``resolve`` answers.

    Raises:
        UnknownActor: no live node of the cluster runs it.
        AskTimeout, Unreachable: the master does not answer.
    """
    reply = await runtime.control(master, "resolve", {"address": str(address)}, timeout=timeout)
    return {"address": str(reply["address"]), "endpoint": str(reply["endpoint"])}


async def _listens(endpoint: str) -> bool:
    """Whether something accepts TCP connections at ``endpoint`` (not tcp: assume so). ZeroMQ
    retries a refused connection quietly, so a beat to no master fails as one to a master that
    ignores this node's keys."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or parts.port is None:
        return True
    with anyio.move_on_after(_PROBE_S):
        try:
            stream = await anyio.connect_tcp(parts.hostname or "127.0.0.1", parts.port)
        except OSError:
            return False
        await stream.aclose()
        return True
    return True  # no answer in time (a filtered port): keep the other hints
