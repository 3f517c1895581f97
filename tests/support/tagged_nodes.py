"""Nodes on loopback addresses of their own (127.0.0.2, 127.0.0.3, ...), each with a tag, joined
to a test's master: a cluster of "hosts" for placement tests, without namespaces."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import psutil

from support.chaos import TaskMaster
from troupe.runtime.testing.plugin import node_start_command, reap

__all__ = ["TaggedNode", "tagged_nodes"]

NODE = """
[node]
master = "{master}"
tags = ["{tag}"]
stop_grace_s = 5
"""
JOIN_S = 60  # a bound on the poll for the nodes' first beats, not on speed


@dataclass(frozen=True)
class TaggedNode:
    """One of the nodes: its process and where it listens."""

    proc: subprocess.Popen[bytes]
    endpoint: str


def _endpoint_on(host: str) -> str:
    with socket.socket() as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


async def _wait_joined(master: TaskMaster, nodes: set[str]) -> None:
    """Until every node beats with its tags (a bounded poll)."""
    with anyio.fail_after(JOIN_S):
        while True:
            status = await master.call("status")
            if {n["node"] for n in status["nodes"] if n["alive"] and n.get("tags")} >= nodes:
                return
            await anyio.sleep(0.1)


@contextmanager
def tagged_nodes(
    master: TaskMaster,
    root: Path,
    nodes: Mapping[str, tuple[str, str]],
    extra_config: str = "",
    env: Mapping[str, str] | None = None,
) -> Iterator[dict[str, TaggedNode]]:
    """Start ``nodes`` (name -> (loopback address, tag)) joined to ``master``, each with its
    config under ``root`` (plus ``extra_config``), until all beat with their tags; yield them by
    name; on the way out, reap every node and their workers (and fail if one survives)."""
    procs: list[subprocess.Popen[bytes]] = []
    started: dict[str, TaggedNode] = {}
    children: dict[int, list[psutil.Process]] = {}  # each node's own: reaped with it, not before
    try:
        for name, (host, tag) in nodes.items():
            config = root / f"{name}.toml"
            config.write_text(NODE.format(master=master.endpoint, tag=tag) + extra_config, encoding="utf-8")
            endpoint = _endpoint_on(host)
            procs.append(
                subprocess.Popen(
                    node_start_command(config, name, endpoint, root / "logs"),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                )
            )
            started[name] = TaggedNode(procs[-1], endpoint)
        anyio.run(_wait_joined, master, set(nodes))
        yield started
    finally:
        for proc in procs:
            try:
                children[proc.pid] = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        survivors = [pid for proc in procs for pid in reap(proc, children.get(proc.pid, []))]
        assert not survivors, f"outlived their test: {survivors}"
