"""A run on a cluster warns once where its master or a live node runs other troupe code than
the run's process (or than each other), naming who runs what; a uniform cluster is not warned
of. A master or node of before the code identity says none: unknown, another code."""

from __future__ import annotations

from typing import Any

import pytest

from troupe.runtime.code_identity import code_identity
from troupe.runtime.errors import AskTimeout
from troupe.runtime.pipeline.mixed_code import NOT_RELAYED, UNKNOWN, mixed_code_line, warn_if_mixed

pytestmark = pytest.mark.anyio

OWN = "0.1.0+aaaa1111"
MASTER = "tcp://127.0.0.1:30001"


def _status(master: Any, **nodes: Any) -> dict[str, Any]:
    listed = [{"node": name, "alive": True, "code": code} for name, code in nodes.items()]
    return {"master": "master", "code": master, "nodes": listed}


def test_a_uniform_cluster_says_nothing() -> None:
    assert mixed_code_line(_status(OWN, n1=OWN, n2=OWN), OWN) is None


def test_a_node_on_other_code_is_named_with_what_each_runs() -> None:
    line = mixed_code_line(_status(OWN, n1=OWN, n2="0.1.0+bbbb2222"), OWN)
    assert line is not None
    assert f"this command, the master, node n1 {OWN}; node n2 0.1.0+bbbb2222" in line
    assert '"Upgrading a cluster"' in line


def test_an_older_node_under_a_newer_master_is_unknown() -> None:
    line = mixed_code_line(_status(OWN, n1=None), OWN)
    assert line is not None and f"node n1 {UNKNOWN}" in line


def test_the_nodes_of_an_older_master_are_not_called_older() -> None:
    """An older master keeps no node's code: its nodes, upgraded first as README says, were
    all called "unknown (older troupe)" mid-upgrade."""
    status = _status(OWN, n1=None)
    del status["code"]  # an older master's status has no such key
    line = mixed_code_line(status, OWN)
    assert line is not None
    assert f"the master {UNKNOWN}; node n1 {NOT_RELAYED}" in line


def test_a_dead_node_does_not_count() -> None:
    status = _status(OWN, n1=OWN)
    status["nodes"].append({"node": "gone", "alive": False, "code": "0.0.1+cccc3333"})
    assert mixed_code_line(status, OWN) is None


def test_parts_that_agree_with_each_other_but_not_with_this_command_are_mixed() -> None:
    assert mixed_code_line(_status("0.2.0+dddd4444", n1="0.2.0+dddd4444"), OWN) is not None


class _Master:
    """A runtime whose master answers ``status`` with the reply given (or not at all)."""

    def __init__(self, status: dict[str, Any] | None) -> None:
        self.status = status

    async def control(self, endpoint: str, msg_type: str, payload: Any = None, **_: Any) -> Any:
        assert (endpoint, msg_type) == (MASTER, "status")
        if self.status is None:
            raise AskTimeout("no reply to 'status' within 5.0s")
        return self.status


async def test_the_run_is_warned_once_of_a_mixed_cluster_and_not_of_a_uniform_one() -> None:
    own = code_identity()
    warned: list[str] = []
    await warn_if_mixed(_Master(_status(own, n1=own)), MASTER, warned.append)  # type: ignore[arg-type]
    assert warned == []
    await warn_if_mixed(_Master(_status(own, n1=own, n2=None)), MASTER, warned.append)  # type: ignore[arg-type]
    assert len(warned) == 1 and f"node n2 {UNKNOWN}" in warned[0]


async def test_a_master_that_does_not_answer_the_check_fails_nothing() -> None:
    warned: list[str] = []
    await warn_if_mixed(_Master(None), MASTER, warned.append)  # type: ignore[arg-type]
    assert warned == []
