"""Hosts on one machine: network namespaces joined by a bridge, for multi-host tests.

:func:`lan` makes ``count`` namespaces, each a "host" with its own loopback and one interface
``eth0`` at ``10.213.7.<i+1>/24``, joined by a bridge that lives in a further namespace of its
own (the "switch"), so the machine's own network is never touched. Each host's link is a veth
pair whose switch end :meth:`Lan.cut` takes down and :meth:`Lan.restore` brings back up: a
cable pulled and plugged in again. Names carry the pid of the test process, so parallel runs
do not collide; the namespaces (and with them every veth and the bridge) are deleted when the
context exits, whatever happened. Deleting a namespace kills nothing: the caller kills its
processes first. A test process killed outright (SIGKILL, a CI run stopped) cannot delete its
own: :func:`lan` first deletes every ``trp<pid>`` namespace whose pid no longer runs.

:func:`netns_unavailable` says why namespaces cannot be made here (not root, no ``ip``, a
kernel or container that refuses ``ip netns add``), for a test to skip with that reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

__all__ = ["SUBNET", "Host", "Lan", "lan", "netns_unavailable", "sweep_orphans"]

SUBNET = "10.213.7"  # an unusual private /24, unlikely to clash with a real network
_TIMEOUT_S = 20.0
_OURS = re.compile(r"trp(\d+)\S*")


def _ip(*args: str, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)


def _must(*args: str, netns: str | None = None) -> None:
    out = _ip(*args, netns=netns)
    if out.returncode != 0:
        where = f" (in {netns})" if netns else ""
        raise RuntimeError(f"ip {' '.join(args)}{where} failed: {out.stderr.strip()}")


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (the e2e suite runs as root in CI)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"trp{os.getpid()}-probe"
    out = _ip("netns", "add", probe)
    if out.returncode != 0:
        return f"`ip netns add` fails here: {out.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


@dataclass(frozen=True)
class Host:
    """One namespace on the LAN: its name, its address, and its port on the switch."""

    netns: str
    address: str
    switch_port: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: the pid is the command's)."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class Lan:
    """Hosts joined by one bridge, whose links can be cut and restored."""

    switch: str
    hosts: list[Host]

    def cut(self, index: int) -> None:
        """Take host ``index``'s link down at the switch: its packets go nowhere."""
        _must("link", "set", self.hosts[index].switch_port, "down", netns=self.switch)

    def restore(self, index: int) -> None:
        """Bring host ``index``'s link back up."""
        _must("link", "set", self.hosts[index].switch_port, "up", netns=self.switch)


def sweep_orphans() -> list[str]:
    """Delete the namespaces of test processes that died without deleting them; their names.

    Only a name this module makes (``trp<pid>...``) whose pid no longer runs: a live run's
    namespaces, or anyone else's, are left alone.
    """
    listed = _ip("netns", "list")
    if listed.returncode != 0:
        return []
    deleted = []
    for line in listed.stdout.splitlines():
        found = _OURS.match(line.strip())
        if found is None or psutil.pid_exists(int(found.group(1))):
            continue
        if _ip("netns", "del", found.group(0)).returncode == 0:
            deleted.append(found.group(0))
    return deleted


@contextmanager
def lan(count: int, tag: str = "") -> Iterator[Lan]:
    """``count`` hosts on a bridge; every namespace is deleted on exit, even on failure.

    Raises:
        RuntimeError: a step failed (what ``ip`` said); what was made is deleted first.
    """
    sweep_orphans()
    prefix = f"trp{os.getpid()}{tag}"
    switch = f"{prefix}-sw"
    made: list[str] = []
    try:
        _must("netns", "add", switch)
        made.append(switch)
        _must("link", "add", "br0", "type", "bridge", netns=switch)
        _must("link", "set", "br0", "up", netns=switch)
        hosts = []
        for i in range(count):
            name, port = f"{prefix}-h{i + 1}", f"p{i + 1}"
            _must("netns", "add", name)
            made.append(name)
            # Both ends are made in the switch; one moves to the host at once, as its eth0.
            _must("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name, netns=switch)
            _must("link", "set", port, "master", "br0", netns=switch)
            _must("link", "set", port, "up", netns=switch)
            address = f"{SUBNET}.{i + 1}"
            _must("addr", "add", f"{address}/24", "dev", "eth0", netns=name)
            _must("link", "set", "eth0", "up", netns=name)
            _must("link", "set", "lo", "up", netns=name)
            hosts.append(Host(name, address, port))
        yield Lan(switch, hosts)
    finally:
        for name in reversed(made):
            _ip("netns", "del", name)
