"""mt 3: a master whose control failed on an ask of its own (``undrain`` asking a node) answered
with its AskTimeout, and the CLI took it for its own: "the master ... did not answer (no reply
within 30.0s): ... busy, paused (SIGSTOP) or hung", after 12 s, of a master that had answered.
An error rebuilt from a peer's reply says so (``from_reply``), and the CLI words it as the
master's answer. And ``ctl undrain`` says what the master did with a node not alive."""

from __future__ import annotations

from typing import Any

import pytest

from support.port_range import test_endpoint
from troupe.cli.commands.ctl import _undrain_said
from troupe.cli.master_client import master_call
from troupe.runtime import AskTimeout, TroupeError
from troupe.runtime.core.runtime import process_runtime

pytestmark = pytest.mark.anyio

NODE_SILENT = "no reply to 'master_undrained' from tcp://10.0.0.5:44170 within 10.0s"


async def test_a_masters_own_ask_timeout_is_its_answer_not_the_clis_silence() -> None:
    async def undrain(payload: Any) -> Any:
        raise AskTimeout(NODE_SILENT)

    async with process_runtime("m", "master", bind=test_endpoint()) as rt:
        rt.register_controls({"undrain": undrain})
        with pytest.raises(TroupeError) as caught:
            await master_call(rt.address, "undrain", {"node": "n1"}, timeout=30.0)
    error = caught.value
    assert not isinstance(error, AskTimeout), error  # not the CLI's own timeout
    message = str(error)
    said = f"the master at {rt.address} answered 'undrain' with an error of its own"
    assert message.startswith(said), message
    assert NODE_SILENT in message and "busy, paused" not in message and "within 30.0s" not in message


async def test_an_error_raised_here_is_not_from_a_reply() -> None:
    assert AskTimeout("x").from_reply is False


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ({"state": "stopped", "restarted": []}, " takes tasks again once it starts (it is stopped now)"),
        ({"state": "dead", "restarted": []}, " takes tasks again once it is back"),
        ({"state": "alive", "restarted": ["n1/w0"]}, " takes tasks again; workers started again: n1/w0"),
        ({"restarted": []}, " takes tasks again"),  # an older master says no state
        (
            {"state": "alive", "restarted": [], "not_told": "no reply"},
            " takes tasks again; it did not answer the undrain now (no reply)",
        ),
    ],
    ids=["stopped", "dead", "alive", "older-master", "not-told"],
)
def test_undrain_says_how_the_master_has_the_node(reply: dict[str, Any], said: str) -> None:
    assert _undrain_said({"node": "n1", "draining": False, **reply}).startswith(said)
