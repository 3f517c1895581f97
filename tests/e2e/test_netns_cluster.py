"""A cluster across hosts, on one machine: three network namespaces joined by a bridge.

Each namespace is a host (tests/support/netns.py) with its own address on 10.213.7.0/24; the
master runs on the first, a node on each. CURVE is on when this troupe has ``troupe keys``
(every process gets the same keys directory), else the cluster runs ``--insecure``. The test
process cannot reach the namespaces' addresses: it talks to the cluster through an agent run
inside the first one (tests/support/netns_agent.py).

These tests skip, saying why, only where namespaces cannot be made (not root, no ``ip``, a
kernel that refuses). Every process is killed by its pid, then the namespaces are deleted.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from support.netns import Host, Lan, lan, netns_unavailable
from troupe.runtime.tasks.content_store import ContentStore
from troupe.runtime.tasks.output_store import OutputStore
from troupe.runtime.testing.plugin import node_start_command, reap

_WHY_NOT = netns_unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]

TESTS_DIR = Path(__file__).resolve().parents[1]
MASTER_PORT, NODE_PORT = 7480, 7470
NODES = ("n1", "n2", "n3")
WORKERS = {f"{n}/{w}" for n in NODES for w in ("w1", "w2")}
SLEEP_TASK = "troupe.actors.demo.tasks:SleepTask"


def _troupe(*args: str) -> list[str]:
    return [sys.executable, "-m", "troupe.cli.main", *args]


def _curve_available() -> bool:
    out = subprocess.run(_troupe("keys", "--help"), capture_output=True, text=True, timeout=60)
    return out.returncode == 0


class NetCluster:
    """A master and three nodes in three namespaces, and an agent to talk to them."""

    def __init__(self, net: Lan, root: Path, curve: bool) -> None:
        self.net = net
        self.root = root
        self.master_endpoint = f"tcp://{net.hosts[0].address}:{MASTER_PORT}"
        self.outputs, self.content = root / "out", root / "cas"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agent: subprocess.Popen[str] | None = None
        self.keys: Path | None = None
        self.security: list[str] = ["--insecure"]
        if curve:
            self.keys = root / "keys"
            out = subprocess.run(
                _troupe("keys", "generate", str(self.keys)), capture_output=True, text=True, timeout=60
            )
            assert out.returncode == 0, out.stderr
            self.security = ["--keys", str(self.keys)]

    # -- processes --------------------------------------------------------------------------

    def _spawn(self, host: Host, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{log_name}.out", "ab") as out:
            proc = subprocess.Popen(
                host.command(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        h1 = self.net.hosts[0]
        journal = self.root / "journal.db"
        self._spawn(
            h1,
            _troupe("master", "start", "--journal", str(journal), "--new", "--endpoint", self.master_endpoint,
                    "--logs", str(self.root / "logs" / "master"), "--node-timeout", "3", *self.security),
            "master",
        )  # fmt: skip
        for name, host in zip(NODES, self.net.hosts, strict=True):
            config = self.root / f"{name}.toml"
            config.write_text(self._node_config(name))
            endpoint = f"tcp://{host.address}:{NODE_PORT}"
            argv = node_start_command(config, name, endpoint, self.root / "logs" / name)
            self._spawn(host, [*argv, *self.security], name)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        }
        if self.keys is not None:
            env["TROUPE_KEYS"] = str(self.keys)
        self.agent = subprocess.Popen(
            h1.command([sys.executable, "-m", "support.netns_agent"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def _node_config(self, name: str) -> str:
        kwargs = f'{{ outputs = "{self.outputs}", content = "{self.content}", durable = false }}'
        lines = [
            f'[node]\nmaster = "{self.master_endpoint}"\nask_timeout_s = 5\nstop_grace_s = 2\n',
            "[supervision]\ninterval_s = 0.2\nheartbeat_timeout_s = 5\n",
        ]
        for worker in ("w1", "w2"):
            lines.append(
                f'[[workers]]\nname = "{worker}"\n'
                f'actors = [{{ name = "task", class = "{SLEEP_TASK}", kwargs = {kwargs} }}]\n'
            )
        if name == "n2":  # asks `echo` by name: it lives on another host
            lines.append(
                '[[workers]]\nname = "w-relay"\n'
                'actors = [{ name = "relay", class = "troupe.actors.demo.actors:Relay" }]\n'
            )
        if name == "n3":
            lines.append(
                '[[workers]]\nname = "w-echo"\n'
                'actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]\n'
            )
        return "\n".join(lines)

    def stop(self) -> list[int]:
        """Kill every process started (the agent first), by pid; return survivors' pids."""
        if self.agent is not None:
            self.agent.kill()
            self.agent.wait(timeout=10)
            for pipe in (self.agent.stdin, self.agent.stdout):
                if pipe is not None:
                    pipe.close()
        survivors: list[int] = []
        for proc in reversed(self.procs):  # the nodes, then the master
            try:
                descendants = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                descendants = []
            survivors += reap(proc, descendants)
        return survivors

    # -- talking to the cluster -------------------------------------------------------------

    def _request(self, request: dict[str, Any], timeout: float) -> Any:
        agent = self.agent
        assert agent is not None and agent.stdin is not None and agent.stdout is not None
        agent.stdin.write(json.dumps(request) + "\n")
        agent.stdin.flush()
        ready, _, _ = select.select([agent.stdout], [], [], timeout + 30)
        assert ready, f"the agent did not answer {request['type']} within {timeout + 30}s"
        answer = json.loads(agent.stdout.readline())
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["ok"]

    def call(self, msg_type: str, payload: Any = None, timeout: float = 10.0) -> Any:
        """One control call to the master."""
        return self._request(
            {"control": self.master_endpoint, "type": msg_type, "payload": payload, "timeout": timeout},
            timeout,
        )

    def ask(self, node: int, actor: str, msg_type: str, payload: Any, timeout: float = 10.0) -> Any:
        """Ask ``actor`` by name through the node on host ``node`` (from the first host)."""
        endpoint = f"tcp://{self.net.hosts[node].address}:{NODE_PORT}"
        return self._request(
            {"ask": endpoint, "actor": actor, "type": msg_type, "payload": payload, "timeout": timeout},
            timeout,
        )

    def resolves(self, name: str) -> bool:
        """Whether the master (the cluster's directory) knows where actor ``name`` listens."""
        try:
            self.call("resolve", {"address": name}, 5.0)
        except RuntimeError:
            return False
        return True

    def status(self) -> dict[str, Any]:
        try:
            status: dict[str, Any] = self.call("status", None, 5.0)
        except RuntimeError:  # not up yet: the caller polls again
            return {"nodes": [], "workers": [], "stale_reports": {}}
        return status

    def wait_for(self, what: str, predicate: Any, timeout: float) -> dict[str, Any]:
        """Poll the master's status (bounded) until ``predicate(status)``; return that status."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            for proc in self.procs:
                assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}; see {self.root}/logs"
            status = self.status()
            if predicate(status):
                return status
            time.sleep(0.2)
        raise AssertionError(f"not {what} within {timeout}s; last status: {json.dumps(status)[:3000]}")

    def submit(self, name: str, count: int, params: dict[str, Any]) -> str:
        ref = ContentStore(self.content, durable=False).put(json.dumps(params).encode())
        job = {"name": name, "kind": "sleep", "count": count, "refs": {"params": ref},
               "lease_s": 6, "max_attempts": 50}  # fmt: skip
        reply = self.call("submit", {"job": {"job": job}, "source": f"{name}.toml"}, 30.0)
        return str(reply["job_id"])

    def wait_job(self, job_id: str, timeout: float) -> dict[str, Any]:
        job: dict[str, Any] = self.call("wait_job", {"job_id": job_id, "timeout_s": timeout}, timeout + 10)
        assert job["state"] == "done", job
        return job

    # -- the tasks' own records -------------------------------------------------------------

    def commits(self, prefix: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in (self.outputs / "commit-log").glob("*.log"):
            for line in f.read_text().splitlines():
                if line.startswith(prefix):
                    counts[line.split()[0]] = counts.get(line.split()[0], 0) + 1
        return counts

    def results(self, prefix: str) -> list[dict[str, Any]]:
        store = OutputStore(self.outputs, durable=False)
        return [
            json.loads((store.committed_path(t) / "result.json").read_text())
            for t in store.committed()
            if t.startswith(prefix)
        ]

    def check_exactly_once(self, job: dict[str, Any], prefix: str, count: int) -> None:
        assert job["counts"].get("done") == count and not job["counts"].get("dead"), job
        commits = self.commits(prefix)
        expected = {f"{prefix}{i:06d}" for i in range(count)}
        assert set(commits) == expected, sorted(expected ^ set(commits))
        assert all(n == 1 for n in commits.values()), {t: n for t, n in commits.items() if n > 1}
        assert {r["task_id"] for r in self.results(prefix)} == expected


@pytest.fixture
def netcluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NetCluster]:
    """The cluster, CURVE on (``troupe keys``) unless the test asks for ``insecure``."""
    mode = getattr(request, "param", "curve")
    if mode == "curve" and not _curve_available():
        if request.node.get_closest_marker("parametrize") is not None:
            pytest.skip("this troupe has no `troupe keys` (CURVE)")
        mode = "insecure"
    with lan(len(NODES)) as net:
        cluster = NetCluster(net, tmp_path, curve=mode == "curve")
        try:
            cluster.start()
            cluster.wait_for("every worker registered", lambda s: _workers(s) == WORKERS, 120)
            yield cluster
        finally:
            assert not cluster.stop(), "processes survived the test"


def _workers(status: dict[str, Any]) -> set[str]:
    return {w["worker_id"] for w in status["workers"] if w["worker_id"] in WORKERS}


def _used(status: dict[str, Any]) -> dict[str, int]:
    return {w["worker_id"]: int(w["used"]) for w in status["workers"] if w["worker_id"] in WORKERS}


def _node(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next((n for n in status["nodes"] if n["node"] == name), {"alive": False, "revivals": 0})


def test_a_host_cut_off_has_its_tasks_requeued_and_rejoins_under_the_same_names(
    netcluster: NetCluster,
) -> None:
    c = netcluster
    gate = c.root / "gate-1"
    job = c.submit("cut", 30, {"min_ms": 20, "max_ms": 60, "wait_for": str(gate)})
    # Every worker of every host holds a task, held at the gate: tasks run on all three hosts.
    c.wait_for(
        "a task leased on every worker", lambda s: set(_used(s).values()) == {1} and len(_used(s)) == 6, 60
    )

    for worker in c.status()["workers"]:  # workers listen on their own host's address
        host = c.net.hosts[NODES.index(worker["node"])]
        assert worker["endpoint"].startswith(f"tcp://{host.address}:"), worker

    c.net.cut(2)  # n3's cable is pulled: its two leases must go to the others
    c.wait_for(
        "n3 declared dead and its workers forgotten",
        lambda s: not _node(s, "n3")["alive"] and not {w for w in _workers(s) if w.startswith("n3/")},
        60,
    )
    gate.touch()
    # n3's copies may finish and commit (the store is shared), but cannot report: the job can
    # end only because the master requeued n3's leases to n1 and n2.
    done = c.wait_job(job, 120)
    c.check_exactly_once(done, "cut-", 30)

    c.net.restore(2)
    status = c.wait_for(
        "n3 alive again with its workers under their names",
        lambda s: _node(s, "n3")["alive"] and _workers(s) == WORKERS,
        120,
    )
    assert _node(status, "n3")["revivals"] == 1
    # The reports n3's copies made before the cut arrive late: dropped as stale, counted.
    status = c.wait_for("n3's stale reports counted", lambda s: sum(s["stale_reports"].values()) >= 1, 90)

    gate2 = c.root / "gate-2"
    job2 = c.submit("after", 12, {"min_ms": 20, "max_ms": 60, "wait_for": str(gate2)})
    c.wait_for(
        "a task leased on every worker again",
        lambda s: set(_used(s).values()) == {1} and len(_used(s)) == 6,
        60,
    )
    gate2.touch()
    c.check_exactly_once(c.wait_job(job2, 120), "after-", 12)
    assert "n3" in {r["node"] for r in c.results("after-")}  # the rejoined host works again
    assert {r["node"] for r in c.results("cut-") + c.results("after-")} == set(NODES)
    # Every task of both jobs is done exactly once, stale reports notwithstanding.
    c.check_exactly_once(c.wait_job(job, 10), "cut-", 30)


@pytest.mark.parametrize("netcluster", ["curve", "insecure"], indirect=True)
def test_an_actor_on_one_host_asks_an_actor_on_another_by_name(netcluster: NetCluster) -> None:
    c = netcluster
    # `relay` (n2) asks `echo` by name; echo lives on n3: n2's node resolves it through the
    # master (the cluster's directory), and the ask goes from n2's worker to n3's directly.
    deadline = time.monotonic() + 60
    while not (c.resolves("echo") and c.resolves("relay")):  # every node's beat lists its workers
        assert time.monotonic() < deadline, "echo and relay never reached the cluster's directory"
        time.sleep(0.2)
    reply = c.ask(1, "relay", "relay", {"hello": "across the bridge"}, timeout=20)
    assert reply == {"hello": "across the bridge"}
    # And a client on n1 finds n3's echo by name through n1's node.
    assert c.ask(0, "echo", "echo", [1, 2, 3], timeout=20) == [1, 2, 3]
