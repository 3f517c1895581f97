"""A master that does not answer ``troupe run --cluster``: the error says which side of a CURVE
mismatch this process is on. A stranger gave ``--keys`` to a run against a master started
without keys and read "a master with CURVE keys answers only --keys DIR", which was the
other way round: CURVE on one side only is silence, not a refusal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from troupe.runtime.errors import AskTimeout, ConfigError, Unreachable
from troupe.runtime.placement import cluster_status
from troupe.runtime.security.keys import generate_keys, load_keys
from troupe.runtime.security.process import install


class _SilentMaster:
    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        raise AskTimeout(f"no reply to {kind!r} within {timeout}s")


@pytest.fixture
def keys_installed(tmp_path: Path) -> Iterator[None]:
    generate_keys(tmp_path / "keys")
    install(load_keys(tmp_path / "keys"))
    try:
        yield
    finally:
        install(None)


async def test_with_keys_the_error_says_a_master_without_keys_answers_nothing(keys_installed: None) -> None:
    with pytest.raises(Unreachable, match="a master started without keys answers nothing"):
        await cluster_status(_SilentMaster(), "tcp://127.0.0.1:1", timeout=0.1)  # type: ignore[arg-type]


async def test_without_keys_the_error_says_a_keyed_master_wants_them() -> None:
    with pytest.raises(Unreachable, match="answers only --keys DIR of its cluster"):
        await cluster_status(_SilentMaster(), "tcp://127.0.0.1:1", timeout=0.1)  # type: ignore[arg-type]


class _Node:
    """A node's endpoint given as the master's: its status names no master."""

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        return {"node": "n0", "workers": []}


async def test_a_node_given_as_the_master_is_said_to_be_no_master() -> None:
    """It said "the cluster offers: no nodes" (a training run) of a node's endpoint."""
    with pytest.raises(ConfigError, match=r"tcp://127.0.0.1:1 answered, but not as a master \(a node\?"):
        await cluster_status(_Node(), "tcp://127.0.0.1:1", timeout=0.1)  # type: ignore[arg-type]


class _RefusingMaster:
    """A keyed master as a keyless client's transport tells it (zmq_peer_loss.py)."""

    async def control(self, endpoint: str, kind: str, payload: Any, timeout: float | None = None) -> Any:
        raise Unreachable(f"ask {kind!r} to {endpoint}: the process at {endpoint} uses CURVE keys (...)")


async def test_a_refused_handshake_is_said_in_the_transport_s_words_not_as_silence() -> None:
    """A keyless training run against a keyed master was told that no master answered within
    5 s (Unreachable) and to start one (report dt 2)."""
    with pytest.raises(Unreachable) as refused:
        await cluster_status(_RefusingMaster(), "tcp://127.0.0.1:1", timeout=0.1)  # type: ignore[arg-type]
    assert str(refused.value) == (
        "the master at tcp://127.0.0.1:1 cannot be asked: "
        "the process at tcp://127.0.0.1:1 uses CURVE keys (...)"
    )
