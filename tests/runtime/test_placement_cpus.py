"""A stage's ``resources.cpu`` on a cluster: a node fits a replica only with at least that many
CPUs, as its beats count them (it was accepted and never read: cf 3). Nothing is reserved, and
a node that says no count (an older one, the one-host cluster) fits any need."""

from __future__ import annotations

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.node.master_link import host_resources
from troupe.runtime.pipeline.hosts import EngineHosts
from troupe.runtime.placement import Host, fits, hosts_of_status, place


def _node(name: str, resources: dict[str, object]) -> dict[str, object]:
    return {"node": name, "endpoint": f"tcp://{name}:1", "alive": True, "resources": resources, "tags": []}


def test_hosts_carry_the_cpus_their_beats_report() -> None:
    status = {
        "master": "m",
        "nodes": [_node("big", {"cpus": 16, "gpus": 0}), _node("old", {}), _node("odd", {"cpus": "8"})],
    }
    hosts = {h.name: h for h in hosts_of_status(status)}
    assert (hosts["big"].cpus, hosts["old"].cpus, hosts["odd"].cpus) == (16, None, None)
    assert isinstance(host_resources()["cpus"], int), "what a node's beat says"


def test_a_replica_goes_only_to_a_node_with_its_cpus() -> None:
    small, big = Host("small", "tcp://s:1", cpus=2), Host("big", "tcp://b:1", cpus=16)
    assert [h.name for h in place(3, [small, big], cpus=4, what="stages.render")] == ["big"] * 3
    assert [h.name for h in place(2, [small, big], cpus=0.5)] == ["small", "big"]
    assert fits(Host("old", "tcp://o:1"), cpus=64), "a node that says no count fits any need"
    assert fits(Host.anything("local", "tcp://l:1"), cpus=1000), "nor does a one-host run place by it"


def test_a_cpu_need_no_node_has_is_refused_naming_it() -> None:
    hosts = [Host("small", "tcp://s:1", cpus=2), Host("big", "tcp://b:1", cpus=16)]
    with pytest.raises(ConfigError) as info:
        place(1, hosts, cpus=32, what="stages.render")
    said = str(info.value)
    assert "stages.render: no node has tags [], 0 GPU(s) and 32 CPU(s)" in said, said
    assert "small (tags [], gpus 0, cpus 2), big (tags [], gpus 0, cpus 16)" in said, said


def test_the_engine_places_a_stage_by_its_cpus() -> None:
    hosts = EngineHosts([Host("small", "tcp://s:1", cpus=2), Host("big", "tcp://b:1", cpus=16)])
    assert [hosts.pick("render", cpus=8).name for _ in range(2)] == ["big", "big"]
    assert hosts.pick("load", cpus=1).name == "small", "the least loaded node that fits"
    with pytest.raises(ConfigError, match=r"stages\.render: no node has .* 32 CPU\(s\)"):
        hosts.pick("render", cpus=32)
