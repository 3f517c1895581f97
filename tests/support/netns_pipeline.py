"""A data generation pipeline run on a cluster of network-namespace hosts, for end-to-end tests.

:class:`NetPipeline` starts a master on the first host of a :func:`support.netns.lan` and one
node per host (n1, n2, n3; n1 tagged ``store``), all ``--insecure``, and runs ``troupe run`` on
the first host against that master (``--cluster``). The namespaces share the file system, so
the run's ``--out`` under the test's tmp_path stands in for the dataset's host. Every process
is started by its pid and reaped by it (:meth:`NetPipeline.stop`), children too.

:class:`GatedRenderer` and :class:`GatedWriter` are the render and store stages of
:mod:`troupe.actors.datagen` held at a gate: an item whose seed is at least ``from_seed`` waits,
in the replica, until the gate folder holds ``open``, and says so first (a marker file named
after the stage, the seed and the replica's node: :func:`markers`); the renderer also marks each
item it rendered, the writer each item it took. A test thus knows which node holds which item,
and the run cannot end before the test opens the gate. Worker processes load them from
``support.netns_pipeline`` (``tests/`` is on their PYTHONPATH).

:func:`dataset_episodes` reads the LeRobot v3.0 dataset a run wrote: the task id of every
episode, in episode order.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from support.netns import Host, Lan
from troupe.actors.datagen.lifecycle import LeRobotWriter, RaycastRenderer
from troupe.runtime.testing.plugin import node_start_command, reap

__all__ = [
    "NODES",
    "GatedRenderer",
    "GatedWriter",
    "NetPipeline",
    "committed",
    "dataset_episodes",
    "markers",
    "pipeline_toml",
    "run_events",
]

TESTS_DIR = Path(__file__).resolve().parents[1]
MASTER_PORT, NODE_PORT = 7480, 7470
NODES = ("n1", "n2", "n3")
STORE_TAG = "store"
RENDERER = "troupe.actors.datagen.lifecycle:RaycastRenderer"
GATED_RENDERER = "support.netns_pipeline:GatedRenderer"
WRITER = "troupe.actors.datagen.lifecycle:LeRobotWriter"
GATED_WRITER = "support.netns_pipeline:GatedWriter"
GATE_OPEN = "open"
_GATE_MOST_S = 600.0  # a gate never opened fails the item (retried) rather than hang the run


async def _hold_at(gate: Path, stage: str, seed: int, node: str) -> None:
    """Mark ``waiting-STAGE-SEED-NODE`` and wait (async: the replica's mailbox and outbox stay
    live) until the gate opens; a gate never opened fails the item rather than hang the run."""
    if (gate / GATE_OPEN).exists():
        return
    (gate / f"waiting-{stage}-{seed}-{node}").touch()
    deadline = time.monotonic() + _GATE_MOST_S
    while not (gate / GATE_OPEN).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {gate} stayed shut for {_GATE_MOST_S:.0f} s")
        await anyio.sleep(0.05)


def markers(gate: Path, kind: str) -> set[tuple[int, str]]:
    """``(seed, node)`` of every ``KIND-SEED-NODE`` marker in ``gate`` (``waiting-render``,
    ``waiting-store``, ``rendered``, ``taken``)."""
    found = set()
    for path in gate.glob(f"{kind}-*"):
        seed, node = path.name[len(kind) + 1 :].split("-", 1)
        found.add((int(seed), node))
    return found


class GatedRenderer(RaycastRenderer):
    """The ray-casting renderer, marking ``rendered-SEED-NODE`` for every item it rendered and,
    on the nodes named, holding seeds from ``from_seed`` on at ``gate``.

    Args:
        gate: the gate's folder (markers go there; ``open`` there opens it).
        from_seed: the first seed held.
        on_nodes: the nodes whose replicas hold items (none: the renderer only marks).
    """

    def __init__(
        self, gate: str, from_seed: int = 0, on_nodes: Sequence[str] = (), threads: int | None = 1
    ) -> None:
        super().__init__(device="cpu", threads=threads)
        self.gate = Path(gate)
        self.from_seed = from_seed
        self.on_nodes = frozenset(on_nodes)

    async def process(self, item: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        seed, node = int(item["seed"]), self.address.node
        if seed >= self.from_seed and node in self.on_nodes:
            await _hold_at(self.gate, "render", seed, node)
        out = super().process(item)
        (self.gate / f"rendered-{seed}-{node}").touch()
        return out


class GatedWriter(LeRobotWriter):
    """The LeRobot writer, marking ``taken-SEED-NODE`` for every item it has taken from the
    replica that rendered it, and holding seeds from ``from_seed`` on at ``gate`` before it
    writes them.

    Args:
        gate: the gate's folder.
        from_seed: the first seed held.
        store: the episodes' OutputStore folder (LeRobotWriter's).
    """

    def __init__(self, gate: str, from_seed: int, store: str) -> None:
        super().__init__(store=store)
        self.gate = Path(gate)
        self.from_seed = from_seed

    async def process(self, item: dict[str, Any]) -> dict[str, Any]:
        seed, node = int(item["seed"]), self.address.node
        (self.gate / f"taken-{seed}-{node}").touch()
        if seed >= self.from_seed:
            await _hold_at(self.gate, "store", seed, node)
        return await super().process(item)


def pipeline_toml(
    out_name: str,
    items: int,
    *,
    tags: bool = True,
    gate: Path | None = None,
    from_seed: int = 0,
    hold_render_on: Sequence[str] = (),
    hold_store: bool = False,
    render_replicas: int = 3,
) -> str:
    """The data generation pipeline of configs/datagen.toml, small, render wide, store pinned.

    Args:
        out_name: the pipeline's name (the master's job is named after it).
        items: how many items (seeds 0 .. items - 1).
        tags: pin the store stage to nodes tagged ``store`` (only a ``--cluster`` run knows tags).
        gate: the gate's folder (:class:`GatedRenderer` renders, marking what it rendered);
            None: the plain stages, nothing held.
        from_seed: the first seed the gate holds.
        hold_render_on: the nodes whose render replicas hold those seeds at the gate.
        hold_store: the writer holds them too (:class:`GatedWriter`).
        render_replicas: render's replicas (fixed: min = max).
    """
    render, render_kwargs = RENDERER, "{ }"
    store, store_kwargs = WRITER, '{ store = "{out}/.troupe/episodes" }'
    if gate is not None:
        render = GATED_RENDERER
        render_kwargs = (
            f'{{ gate = "{gate}", from_seed = {from_seed}, on_nodes = {json.dumps(list(hold_render_on))} }}'
        )
    if gate is not None and hold_store:
        store = GATED_WRITER
        store_kwargs = f'{{ gate = "{gate}", from_seed = {from_seed}, store = "{{out}}/.troupe/episodes" }}'
    store_resources = f'resources = {{ tags = ["{STORE_TAG}"] }}\n' if tags else ""
    slots = 3 + render_replicas
    return f"""
[pipeline]
name = "{out_name}"
items = {items}
seed_start = 0
slots = {slots}
max_attempts = 5
scale_interval_s = 0.5

[[stages]]
name = "load"
actor = "troupe.actors.datagen.lifecycle:SceneLoader"
replicas = 1
max_replicas = 1
queue = 4
kwargs = {{ width = 32, height = 24 }}

[[stages]]
name = "plan"
actor = "troupe.actors.datagen.lifecycle:NavPlanner"
replicas = 1
max_replicas = 1
queue = 4
kwargs = {{ fps = 10, max_frames = 12 }}

[[stages]]
name = "render"
actor = "{render}"
replicas = {render_replicas}
min_replicas = {render_replicas}
max_replicas = {render_replicas}
queue = 4
kwargs = {render_kwargs}

[[stages]]
name = "store"
actor = "{store}"
replicas = 1
max_replicas = 1
queue = 4
{store_resources}kwargs = {store_kwargs}
"""


def committed(out: Path) -> list[str]:
    """The task ids whose episode the writer has committed under ``out`` so far."""
    # Read, not opened as an OutputStore: opening one makes its folders (and --out with them,
    # which a run that has not started yet would take for an older run's) and sweeps staging.
    folder = out / ".troupe" / "episodes" / "committed"
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_dir())
    except FileNotFoundError:  # the writer has not started yet
        return []


def run_events(out: Path, event: str) -> list[dict[str, Any]]:
    """The ``event`` records of the run's JSON-lines logs under ``out/logs`` so far."""
    found = []
    for path in sorted((out / "logs").glob("*.jsonl*")):
        for line in path.read_text(errors="replace").splitlines():
            if f'"{event}"' in line:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # the line being written now
                    continue
                if record.get("event") == event:
                    found.append(record)
    return found


def dataset_episodes(root: Path) -> list[str]:
    """The task id of every episode of the LeRobot v3.0 dataset at ``root``, in episode order.

    Checks what ties the index together: info's episode and frame totals, the episode indices
    0 .. n - 1, and every frame's episode index.
    """
    info = json.loads((root / "meta" / "info.json").read_text(encoding="utf-8"))
    assert info["codebase_version"] == "v3.0", info["codebase_version"]
    episodes = pa.concat_tables(
        pq.read_table(p) for p in sorted((root / "meta" / "episodes").rglob("*.parquet"))
    ).to_pandas()
    assert len(episodes) == info["total_episodes"], (len(episodes), info["total_episodes"])
    assert list(episodes["episode_index"]) == list(range(len(episodes)))
    data = pa.concat_tables(pq.read_table(p) for p in sorted((root / "data").rglob("*.parquet")))
    assert data.num_rows == info["total_frames"] == int(episodes["length"].sum())
    per_frame = data.column("episode_index").to_pylist()
    assert sorted(set(per_frame)) == list(range(len(episodes)))
    return [str(t) for t in episodes["troupe/task_id"]]


def _troupe(*args: str) -> list[str]:
    return [sys.executable, "-m", "troupe.cli.main", *args]


class NetPipeline:
    """A master on the first host, a node on each host, and ``troupe run`` on the first host."""

    def __init__(self, net: Lan, root: Path) -> None:
        self.net = net
        self.root = root
        self.logs = root / "logs"
        self.master_endpoint = f"tcp://{net.hosts[0].address}:{MASTER_PORT}"
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agent: subprocess.Popen[str] | None = None
        # Every process the test starts and every process they start, seen while they ran:
        # a node killed by SIGKILL leaves its workers orphaned (reparented), no longer found
        # below it; they are reaped from here.
        self.seen: dict[int, psutil.Process] = {}
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p),
            "COLUMNS": "200",
        }

    # -- processes --------------------------------------------------------------------------

    def spawn(self, host: Host, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``, its output in ``logs/<log_name>.out``; reaped by stop()."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{log_name}.out", "ab") as out:
            proc = subprocess.Popen(
                host.command(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.procs.append(proc)
        self.note_descendants()
        return proc

    def start_cluster(self, node_timeout_s: float = 3.0) -> None:
        """The master on the first host and nodes n1, n2, n3 (n1 tagged ``store``), joined to it."""
        h1 = self.net.hosts[0]
        self.spawn(
            h1,
            _troupe("master", "start", "--journal", str(self.root / "journal.db"), "--new",
                    "--endpoint", self.master_endpoint, "--logs", str(self.logs / "master"),
                    "--node-timeout", str(node_timeout_s), "--insecure"),
            "master",
        )  # fmt: skip
        for name, host in zip(NODES, self.net.hosts, strict=True):
            config = self.root / f"{name}.toml"
            tags = f'tags = ["{STORE_TAG}"]\n' if name == "n1" else ""
            config.write_text(
                f'[node]\nmaster = "{self.master_endpoint}"\nask_timeout_s = 10\nstop_grace_s = 2\n{tags}'
                "\n[supervision]\ninterval_s = 0.2\nheartbeat_timeout_s = 10\n"
            )
            endpoint = f"tcp://{host.address}:{NODE_PORT}"
            argv = node_start_command(config, name, endpoint, self.logs / name)
            self.nodes[name] = self.spawn(host, [*argv, "--insecure"], name)
        self.agent = subprocess.Popen(
            h1.command([sys.executable, "-m", "support.netns_agent"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
        )

    def run(self, pipeline: Path, out: Path) -> subprocess.Popen[bytes]:
        """Start ``troupe run PIPELINE --out OUT --cluster MASTER --nodes 3 --json`` on the first
        host (not waited for): the master's nodes run every replica."""
        argv = _troupe("run", str(pipeline), "--out", str(out), "--cluster", self.master_endpoint,
                       "--nodes", str(len(NODES)), "--json")  # fmt: skip
        return self.spawn(self.net.hosts[0], argv, "run")

    def run_json(self, run: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
        """Wait (bounded) for ``run`` to end, check it exited 0, and return its JSON."""
        try:
            run.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"troupe run did not end within {timeout}s; {self.log_tail('run')}"
            ) from None
        text = (self.logs / "run.out").read_text(errors="replace")
        assert run.returncode == 0, f"troupe run exited {run.returncode}; {self.log_tail('run')}"
        start = text.find("{\n")  # the JSON object is printed last, indented
        assert start >= 0, f"no JSON from troupe run; {self.log_tail('run')}"
        result: dict[str, Any] = json.loads(text[start:])
        return result

    def log_tail(self, name: str, chars: int = 4000) -> str:
        """The end of ``logs/<name>.out``, for an assertion's message."""
        path = self.logs / f"{name}.out"
        text = path.read_text(errors="replace") if path.exists() else "(no output)"
        return f"{name} said:\n{text[-chars:]}"

    def note_descendants(self) -> None:
        """Remember every process below the ones started (reaped by stop(), orphaned or not)."""
        for proc in self.procs:
            try:
                below = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for child in below:
                self.seen.setdefault(child.pid, child)

    def kill_node(self, node: str, timeout: float) -> list[int]:
        """SIGKILL node ``node``'s process and wait (bounded) until every process it started is
        gone too (they die of the lost parent); return the pids still alive (should be none)."""
        self.note_descendants()
        below = list(psutil.Process(self.nodes[node].pid).children(recursive=True))
        self.nodes[node].kill()
        self.nodes[node].wait(timeout=30)
        _, alive = psutil.wait_procs(below, timeout=timeout)
        return [p.pid for p in alive]

    def stop(self) -> list[int]:
        """Kill every process started (the agent, the run, the nodes, the master) and what they
        started, by pid; return the pids that survived."""
        if self.agent is not None:
            self.agent.kill()
            self.agent.wait(timeout=10)
            for pipe in (self.agent.stdin, self.agent.stdout):
                if pipe is not None:
                    pipe.close()
        self.note_descendants()
        survivors: list[int] = []
        for proc in reversed(self.procs):  # the run, then the nodes, then the master
            survivors += reap(proc, [])
        _, alive = psutil.wait_procs(list(self.seen.values()), timeout=10)
        for p in alive:  # workers of a killed node, if they outlived it
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(alive, timeout=10)
        return survivors + [p.pid for p in still]

    # -- the master's view ------------------------------------------------------------------

    def master_status(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's status (``{"nodes": []}`` while it does not answer yet)."""
        agent = self.agent
        assert agent is not None and agent.stdin is not None and agent.stdout is not None
        request = {"control": self.master_endpoint, "type": "status", "payload": None, "timeout": timeout}
        agent.stdin.write(json.dumps(request) + "\n")
        agent.stdin.flush()
        ready, _, _ = select.select([agent.stdout], [], [], timeout + 30)
        assert ready, f"the agent did not answer within {timeout + 30}s"
        line = agent.stdout.readline()
        assert line, "the agent inside the first host exited"
        answer = json.loads(line)
        status: dict[str, Any] = answer.get("ok") or {"nodes": []}
        return status

    def wait_nodes_alive(self, timeout: float) -> None:
        """Poll (bounded) until the master sees every node alive."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            for proc in self.procs:
                assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}; see {self.logs}"
            status = self.master_status()
            alive = {n["node"] for n in status.get("nodes", []) if n.get("alive")}
            if alive >= set(NODES):
                self.note_descendants()
                return
            time.sleep(0.2)
        raise AssertionError(
            f"not every node alive within {timeout}s; last status: {json.dumps(status)[:3000]}"
        )
