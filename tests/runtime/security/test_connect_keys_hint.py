"""``connect()`` given CURVE keys, or taking ``$TROUPE_KEYS`` by itself, against a node that runs
without keys: every call waited out its deadline, then said only "the node may be busy, hung or
gone" (report ap 11); the failed handshake now ends it at once (report mt 1), saying so and where
the keys came from. A silent node's AskTimeout still names keys as a likely cause."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from troupe.runtime import AskTimeout, Unreachable, connect
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import KEYS_ENV, keys_for

HANG_GUARD_S = 60  # a bound on a hang, never on speed
SILENT_S = 1.0  # what each ask waits: nothing answers it, by design


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    generate_keys(tmp_path / "keys")
    return tmp_path / "keys"


async def _asked(endpoint: str, timeout: float | None = SILENT_S, **kwargs: object) -> str:
    with anyio.fail_after(HANG_GUARD_S), pytest.raises(AskTimeout) as silent:
        async with connect(endpoint, **kwargs) as rt:  # type: ignore[arg-type]
            await rt.ref("render").ask("render", 1, timeout=timeout)
    return str(silent.value)


async def _refused(endpoint: str, **kwargs: object) -> str:
    """A CURVE client of a keyless node is told at once (zmq_peer_loss.py), whichever side
    sees the mismatch first: no call waits out its deadline (an hour here)."""
    with anyio.fail_after(HANG_GUARD_S), pytest.raises(Unreachable) as refused:
        async with connect(endpoint, **kwargs) as rt:  # type: ignore[arg-type]
            await rt.ref("render").ask("render", 1, timeout=3600)
    said = str(refused.value)
    assert "without CURVE keys" in said, said
    return said


async def test_keys_from_the_environment_are_named_with_the_way_out(
    keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEYS_ENV, str(keys))
    async with process_runtime("n", "keyless") as keyless:
        said = await _refused(keyless.address)
    assert f"this client uses CURVE with ${KEYS_ENV} ({keys}): connect(..., env_keys=False)" in said


async def test_keys_given_are_named(keys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEYS_ENV, raising=False)
    async with process_runtime("n", "keyless") as keyless:
        said = await _refused(keyless.address, keys=keys)
    assert said.startswith("ask 'resolve' to "), said
    assert f"this client uses CURVE with keys={str(keys)!r}: drop keys=" in said


async def test_a_client_without_keys_is_told_nothing_of_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEYS_ENV, raising=False)

    async def never(_: object) -> None:  # a node that hears the client and does not answer
        await anyio.sleep_forever()

    async with process_runtime("n", "keyless") as keyless:
        keyless.register_control("resolve", never)
        said = await _asked(keyless.address)
    assert said.endswith("the node may be busy, hung or gone"), said


async def test_a_keyed_node_that_never_answers_is_said_with_the_keys_as_a_likely_cause(
    keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEYS_ENV, raising=False)

    async def never(_: object) -> None:
        await anyio.sleep_forever()

    async with process_runtime("n", "keyed", security=keys_for(keys)) as keyed:
        keyed.register_control("resolve", never)
        said = await _asked(keyed.address, keys=keys)
    assert f"this client uses CURVE with keys={str(keys)!r}: drop keys=" in said, said
