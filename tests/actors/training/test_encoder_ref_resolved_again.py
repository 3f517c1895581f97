"""A rank's ask to an encoder actor that got no answer resolves the actor's name afresh before the
next ask: the actor may have been started again on another node (its own died), and a ref keeps
the node and process it resolved to first, so the rank went on asking the dead node. The
handler's own error (the encoder refused the input) keeps the ref: the actor is where it was."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch

from troupe.actors.training.inflight import SampleGroup, actor_encoder
from troupe.runtime import AskTimeout, RemoteError

HANG_GUARD_S = 30  # a bound on a hang, never on speed
GROUP = SampleGroup(batch=0, index=0, video=torch.zeros((1, 3, 2, 4, 4), dtype=torch.uint8))


class _Ref:
    """One resolution of the name: it answers as the runtime says when it was made."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.asked = 0

    async def ask(self, msg_type: str, payload: Any, timeout: float | None = None) -> Any:
        self.asked += 1
        if self.how == "silent":
            raise AskTimeout(f"ask {msg_type!r}: no reply within {timeout} s")
        if self.how == "hangs":
            await anyio.sleep_forever()
        if self.how == "refuses":
            raise RemoteError("ValueError", "bad video")
        return {"tag": payload["tag"], "latents": torch.ones(1)}


class _Runtime:
    """Hands out refs answering, in turn, as ``hows`` says (the last one from then on)."""

    def __init__(self, *hows: str) -> None:
        self.hows = list(hows)
        self.refs: list[_Ref] = []

    def ref(self, name: str) -> _Ref:
        how = self.hows.pop(0) if len(self.hows) > 1 else self.hows[0]
        self.refs.append(_Ref(how))
        return self.refs[-1]


@pytest.mark.parametrize("failure", ["silent", "hangs"])
async def test_an_ask_without_an_answer_resolves_the_name_again(failure: str) -> None:
    """A deadline the ask's own (AskTimeout) or the rank's (its probe's wait, a cancellation)."""
    runtime = _Runtime(failure, "answers")
    encode = actor_encoder(runtime, ["encode-0"], timeout=5)
    with anyio.fail_after(HANG_GUARD_S):
        with pytest.raises((AskTimeout, TimeoutError)), anyio.fail_after(0.05 if failure == "hangs" else 5):
            await encode(0, GROUP)
        latents = await encode(0, GROUP)
    assert torch.equal(latents, torch.ones(1))
    assert [r.asked for r in runtime.refs] == [1, 1]  # the second ask went to a fresh ref


async def test_the_handlers_own_error_keeps_the_ref() -> None:
    runtime = _Runtime("refuses")
    encode = actor_encoder(runtime, ["encode-0"], timeout=5)
    with anyio.fail_after(HANG_GUARD_S):
        for _ in range(2):
            with pytest.raises(RemoteError, match="bad video"):
                await encode(0, GROUP)
    assert [r.asked for r in runtime.refs] == [2]
