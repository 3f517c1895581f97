"""``connect()`` given CURVE keys, or taking ``$TROUPE_KEYS`` by itself, against a node that runs
without keys: every call waits out its deadline (the node answers a CURVE handshake with silence),
and its AskTimeout now says that likely cause and where the keys came from, as the CLI says it,
rather than only "the node may be busy, hung or gone" (report ap 11)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from troupe.runtime import AskTimeout, connect
from troupe.runtime.core.runtime import process_runtime
from troupe.runtime.security.keys import generate_keys
from troupe.runtime.security.process import KEYS_ENV

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


async def test_keys_from_the_environment_are_named_with_the_way_out(
    keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEYS_ENV, str(keys))
    async with process_runtime("n", "keyless") as keyless:
        said = await _asked(keyless.address)
    assert "the node may be busy, hung or gone" in said
    assert f"or it runs without CURVE keys, and this client uses CURVE with ${KEYS_ENV} ({keys})" in said
    assert "env_keys=False" in said


async def test_keys_given_are_named(keys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default timeout, the lookup's own deadline (5 s) is what runs out."""
    monkeypatch.delenv(KEYS_ENV, raising=False)
    async with process_runtime("n", "keyless") as keyless:
        said = await _asked(keyless.address, None, keys=keys)
    assert said.startswith("no reply to 'resolve' from "), said
    assert f"this client uses CURVE with keys={str(keys)!r}: drop keys=" in said


async def test_a_client_without_keys_is_told_nothing_of_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEYS_ENV, raising=False)

    async def never(_: object) -> None:  # a node that hears the client and does not answer
        await anyio.sleep_forever()

    async with process_runtime("n", "keyless") as keyless:
        keyless.register_control("resolve", never)
        said = await _asked(keyless.address)
    assert said.endswith("the node may be busy, hung or gone"), said
