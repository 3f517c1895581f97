"""``troupe ctl chaos`` and ``heal`` in the command's words: a fault the node refuses is said with
the command's options, not a fault spec's JSON keys (``seconds must be ...; e.g. "seconds":
0.5`` for a missing ``--seconds``); what fired, in words, not ``fired {}``."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from troupe.cli.commands.chaos import as_options, fired_words, partition_words
from troupe.cli.main import app
from troupe.runtime.chaos.faults import FaultSpec
from troupe.runtime.errors import ConfigError


def _refusal(spec: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as refused:
        FaultSpec.from_dict(spec, where="chaos")
    return as_options(str(refused.value))


@pytest.mark.parametrize(
    ("spec", "option"),
    [
        ({"kind": "slow"}, "--seconds must be a finite number >= 0, got None; e.g. --seconds 0.5"),
        ({"kind": "partition", "peers": []}, "a partition needs --peers (repeated"),
        ({"kind": "drop", "probability": 2}, "--probability must be a number in [0, 1], got 2"),
        ({"kind": "drop", "count": -1}, "--count must be an integer >= 0, got -1"),
        ({"kind": "drop", "after": -1}, "--after must be an integer >= 0, got -1"),
    ],
)
def test_a_refused_fault_names_the_option_to_fix(spec: dict[str, object], option: str) -> None:
    said = _refusal(spec)
    assert option in said, said
    assert '"seconds":' not in said and "'peers'" not in said and "'probability'" not in said


def test_what_fired_is_said_in_words() -> None:
    assert fired_words({}) == "nothing had fired"
    assert fired_words({"slow": 1, "drop": 3}) == "fired: drop 3 times, slow once"


def test_a_worker_restarted_since_its_faults_were_armed_is_said_so() -> None:
    """A hang_with_gil that fired killed its worker and the record of it: the heal said
    "nothing had fired"."""
    restarted = {"kinds": ["hang_with_gil"], "exit": "no_heartbeat (SIGKILL)"}
    assert fired_words({}, restarted) == (
        "restarted since its faults (hang_with_gil) were armed: the process that had them ended "
        "(no_heartbeat (SIGKILL)), and what fired went with it"
    )
    assert fired_words({"slow": 1}, restarted) == "fired: slow once"  # armed again after the restart


def test_a_healed_partition_is_said_with_what_it_refused() -> None:
    """A partition fires no handler: its heal said only `nothing had fired`."""
    healed = {"partitioned_peers": ["tcp://127.0.0.1:9"], "refused": {"tcp://127.0.0.1:9": 12}}
    assert partition_words(healed) == "; a partition from tcp://127.0.0.1:9 ended (12 messages refused)"
    assert partition_words({"partitioned_peers": [], "refused": {}}) == ""


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["crash", "--seconds", "1"], "--seconds applies to hang_with_gil, stall, slow only, not to crash"),
        (
            ["kill", "--count", "2"],
            "--count applies to crash, hang_with_gil, stall, slow, drop only, not to kill",
        ),
        (["drop", "--peers", "w2"], "--peers applies to partition only, not to drop"),
    ],
)
def test_an_option_that_does_not_apply_to_the_kind_is_refused_in_the_command_s_words(
    args: list[str], said: str
) -> None:
    """It reached the node, which said ``allowed: actor, after, count, kind, message_type,
    probability``: its fault spec's fields, two of them no option of this command."""
    result = CliRunner().invoke(
        app, ["ctl", "chaos", *args, "--target", "w", "--node", "tcp://127.0.0.1:1"], env={"COLUMNS": "400"}
    )
    assert result.exit_code == 2, result.output
    assert said in result.output
