"""A real master process for task-level chaos tests, and the exactly-once checks they share.

The pytest plugin (``troupe.runtime.testing.plugin``) starts nodes; a task test also needs a master.
:func:`start_master` runs ``troupe master start --journal J --new`` on a free loopback port
and returns once it answers; :meth:`TaskMaster.reap` stops it (SIGTERM, grace, SIGKILL).
Task outputs go to one :class:`~troupe.runtime.tasks.output_store.OutputStore` shared by every worker, and
the task actors log each commit they make (see ``troupe.actors.demo.tasks``), so
:meth:`TaskMaster.commits` counts commits across processes: a task committed twice shows twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from troupe.cli.master_client import master_call
from troupe.runtime.errors import ActorStopped, AskTimeout, Unreachable
from troupe.runtime.tasks.content_store import ContentStore
from troupe.runtime.tasks.output_store import OutputStore
from troupe.runtime.testing.plugin import free_endpoint, reap

__all__ = ["TaskMaster", "node_config", "start_master"]

_TRANSIENT = (Unreachable, ActorStopped, AskTimeout)


@dataclass
class TaskMaster:
    """A running master process and the stores its workers share.

    Attributes:
        proc: the master process.
        endpoint: where it listens.
        outputs: the output store's root (task actors commit there).
        content: the content store's root (task parameters come from there).
    """

    proc: subprocess.Popen[bytes]
    endpoint: str
    outputs: Path
    content: Path

    async def call(self, msg_type: str, payload: Any = None, timeout: float = 10.0) -> Any:
        """One control call to the master."""
        return await master_call(self.endpoint, msg_type, payload, timeout)

    async def wait_workers(self, names: set[str], timeout: float = 60.0) -> None:
        """Poll until exactly the workers ``names`` (``node/process``) are registered."""
        with anyio.fail_after(timeout):
            while {w["worker_id"] for w in (await self.call("status"))["workers"]} != names:
                await anyio.sleep(0.05)

    async def used(self, worker_id: str) -> int:
        """How many leases the master counts as held by ``worker_id`` now."""
        workers = (await self.call("status"))["workers"]
        return next((int(w["used"]) for w in workers if w["worker_id"] == worker_id), 0)

    async def submit(self, name: str, kind: str, count: int, params: dict[str, Any], **policy: Any) -> str:
        """Submit a job of ``count`` tasks whose parameters go to the content store.

        Args:
            name: the job name (its task ids start with ``name-``).
            kind: the task kind.
            count: how many tasks.
            params: the JSON object the tasks load lazily.
            policy: further ``[job]`` keys (``lease_s``, ``max_attempts``, ``backoff_base_s``).
        """
        ref = ContentStore(self.content, durable=False).put(json.dumps(params).encode())
        job = {"name": name, "kind": kind, "count": count, "refs": {"params": ref}, **policy}
        reply = await self.call("submit", {"job": {"job": job}, "source": f"{name}.toml"})
        return str(reply["job_id"])

    async def wait_job(self, job_id: str, timeout: float) -> dict[str, Any]:
        """Wait (the master's own long poll, bounded) until the job is final; return its view."""
        job: dict[str, Any] = await self.call(
            "wait_job", {"job_id": job_id, "timeout_s": timeout}, timeout + 10
        )
        assert job["state"] != "running", f"job {job_id} still running after {timeout}s: {job}"
        return job

    def commits(self, prefix: str) -> Counter[str]:
        """Commits made per task id (from every worker's commit log)."""
        counts: Counter[str] = Counter()
        for f in (self.outputs / "commit-log").glob("*.log"):
            counts.update(ln.split()[0] for ln in f.read_text().splitlines() if ln.startswith(prefix))
        return counts

    def results(self, prefix: str) -> list[dict[str, Any]]:
        """The committed ``result.json`` of every task whose id starts with ``prefix``."""
        store = OutputStore(self.outputs, durable=False)
        return [
            json.loads((store.committed_path(t) / "result.json").read_text())
            for t in store.committed()
            if t.startswith(prefix)
        ]

    def check_exactly_once(self, job: dict[str, Any], prefix: str, count: int) -> None:
        """Assert the invariants: the job is done, nothing dead, each task committed once."""
        assert job["state"] == "done", job
        assert job["counts"].get("done") == count and not job["counts"].get("dead"), job
        commits = self.commits(prefix)
        twice = sorted(t for t, n in commits.items() if n > 1)
        assert not twice, f"tasks committed more than once: {twice}"
        expected = {f"{prefix}{i:06d}" for i in range(count)}
        committed = set(OutputStore(self.outputs, durable=False).committed())
        assert set(commits) == expected and {t for t in committed if t.startswith(prefix)} == expected

    def reap(self) -> list[int]:
        """Stop the master; return the pids that survived (should be none)."""
        return reap(self.proc, [])


def start_master(
    directory: Path, timeout: float = 60.0, endpoint: str | None = None, extra: tuple[str, ...] = ()
) -> TaskMaster:
    """Start a master on a new journal under ``directory`` (or on the one there, resumed); return
    once it answers.

    Args:
        directory: its journal, logs and stores.
        timeout: how long it may take to answer.
        endpoint: where it listens (where it listened before: a restart); default a free port.
        extra: more options of ``troupe master start`` (``--keys DIR``: the test process must
            have keys installed for the master to answer it).

    Raises:
        RuntimeError: it exited or did not answer in time (it is reaped first).
    """
    directory.mkdir(parents=True, exist_ok=True)
    endpoint = endpoint or free_endpoint()
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    with open(logs / "master.out", "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "troupe.cli.main",
                "master",
                "start",
                "--journal",
                str(directory / "journal.db"),
                "--new",
                "--endpoint",
                endpoint,
                "--logs",
                str(logs),
                "--node-timeout",
                "30",
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    master = TaskMaster(proc, endpoint, directory / "out", directory / "cas")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # a bounded poll of a condition
        if proc.poll() is not None:
            break
        try:
            anyio.run(master_call, endpoint, "ping", None, 2.0)
            return master
        except _TRANSIENT:
            time.sleep(0.05)
    reap(proc, [])
    raise RuntimeError(f"master not answering within {timeout}s (exit {proc.returncode}); see {logs}")


def node_config(master: TaskMaster, workers: list[str], actor_class: str, tables: str) -> str:
    """A node config: ``tables`` (supervision, restart), then one task worker per name.

    Each worker hosts one task actor ``task`` of ``actor_class`` on the master's shared stores.
    """
    kwargs = f'{{ outputs = "{master.outputs}", content = "{master.content}", durable = false }}'
    lines = [f'[node]\nmaster = "{master.endpoint}"\nask_timeout_s = 5\nstop_grace_s = 2\n', tables]
    for name in workers:
        lines.append(
            f'[[workers]]\nname = "{name}"\n'
            f'actors = [{{ name = "task", class = "{actor_class}", kwargs = {kwargs} }}]\n'
        )
    return "\n".join(lines)
