"""``troupe ctl chaos`` and ``troupe ctl heal``: inject faults into a running node's workers.

Importing this module adds both commands to ``troupe ctl`` (``main.py`` imports it).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from troupe.cli.client import control, fail, run_async
from troupe.cli.literal import literal, markup
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import DEFAULT_NODE_ENDPOINT

from .ctl import NodeOption, TimeoutOption, ctl_app
from .keys_option import KeysOption, use_keys

__all__ = ["as_options", "chaos", "fired_words", "heal", "options_not_for", "partition_words"]

console = Console()

KINDS = ("kill", "crash", "hang_with_gil", "stall", "slow", "drop", "partition")

TargetOption = Annotated[
    str,
    typer.Option(
        "--target", "-t", help="WORKER, WORKER/ACTOR, '*' (every worker), or 'supervisor' (kill only)."
    ),
]


@ctl_app.command("chaos")
def chaos(
    kind: Annotated[str, typer.Argument(metavar="KIND", help=f"One of: {', '.join(KINDS)}.")],
    target: TargetOption,
    seconds: Annotated[
        float | None,
        typer.Option(
            help="Duration of hang_with_gil, stall (none = until healed or killed) and slow (per message)."
        ),
    ] = None,
    probability: Annotated[float | None, typer.Option(help="Chance of firing on each message.")] = None,
    count: Annotated[int | None, typer.Option(help="Fire at most this many times.")] = None,
    after: Annotated[int | None, typer.Option(help="Let this many matching messages through first.")] = None,
    message_type: Annotated[
        str | None, typer.Option("--message-type", help="Only messages of this type.")
    ] = None,
    peers: Annotated[
        list[str] | None,
        typer.Option(
            "--peers", help="partition: endpoints, worker names or WORKER/ACTOR; repeat the option."
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the probability draws, to replay a run.")] = None,
    node: NodeOption = DEFAULT_NODE_ENDPOINT,
    as_json: Annotated[bool, typer.Option("--json", help="Print the node's reply as JSON.")] = False,
    keys: KeysOption = None,
    timeout: TimeoutOption = 10.0,
) -> None:
    """Inject a fault: kill at once, or arm a fault that fires on the next matching message."""
    use_keys(keys)
    if kind not in KINDS:
        raise fail(f"unknown fault kind {kind!r}; use one of {', '.join(KINDS)}", 2)
    payload: dict[str, Any] = {
        "kind": kind,
        "target": target,
        "seconds": seconds,
        "probability": probability,
        "count": count,
        "after": after,
        "message_type": message_type,
        "peers": list(peers or []),
        "seed": seed,
    }
    wrong = options_not_for(kind, payload)
    if wrong:
        raise fail(wrong, 2)
    reply = run_async(_chaos, node, payload, timeout)
    if as_json:
        typer.echo(json.dumps(reply, indent=2, default=str))
        return
    if kind == "kill":
        for name, pid in reply["killed"].items():
            console.print(markup("SIGKILL sent to ", literal(name, "bold"), literal(f" (pid {pid})")))
        return
    for name, result in reply["workers"].items():
        if isinstance(result, dict) and "error" in result:
            console.print(markup(literal(name, "red"), literal(f": not armed: {result['error']}")))
        else:
            console.print(
                markup(literal(f"{kind} armed in "), literal(name, "bold"), literal(f": {reply['spec']}"))
            )


@ctl_app.command("heal")
def heal(
    target: Annotated[str, typer.Option("--target", "-t", help="WORKER or '*' (every worker).")] = "*",
    node: NodeOption = DEFAULT_NODE_ENDPOINT,
    as_json: Annotated[bool, typer.Option("--json", help="Print the node's reply as JSON.")] = False,
    keys: KeysOption = None,
    timeout: TimeoutOption = 10.0,
) -> None:
    """Clear every fault of the target workers (partitions end, stalls open) and show what fired."""
    use_keys(keys)
    reply = run_async(control, node, "heal", {"target": target}, timeout)
    if as_json:
        typer.echo(json.dumps(reply, indent=2, default=str))
        return
    if not reply["workers"]:  # it printed nothing at all
        console.print(literal(f"no worker matches {target} on {node}: nothing to heal"))
    for name, result in reply["workers"].items():
        if isinstance(result, dict) and "error" in result:
            console.print(markup(literal(name, "red"), literal(f": not healed: {result['error']}")))
        else:
            said = fired_words(result.get("fired") or {}, result.get("restarted_since_armed"))
            said += partition_words(result)
            console.print(literal(f"{name}: healed; {said}"))


def fired_words(fired: dict[str, Any], restarted: dict[str, Any] | None = None) -> str:
    """``nothing had fired`` or ``fired: drop 3 times, slow once`` (a bare ``fired {}`` before);
    for a worker restarted since its faults were armed (``restarted``: their kinds and how its
    process ended), that its record went with that process: it said nothing had fired."""
    if restarted and not fired:
        kinds = ", ".join(map(str, restarted.get("kinds") or ())) or "faults"
        ended = f" ({restarted['exit']})" if restarted.get("exit") else ""
        return (
            f"restarted since its faults ({kinds}) were armed: the process that had them ended{ended}, "
            "and what fired went with it"
        )
    if not fired:
        return "nothing had fired"
    said = [f"{kind} {'once' if n == 1 else f'{n} times'}" for kind, n in sorted(fired.items())]
    return "fired: " + ", ".join(said)


def partition_words(healed: dict[str, Any]) -> str:
    """``; a partition from P, Q ended (12 messages refused)``, or nothing: a partition fires
    no handler, so the heal of one that refused traffic for minutes said only what fired."""
    peers = healed.get("partitioned_peers") or []
    if not peers:
        return ""
    refused = sum(n for n in (healed.get("refused") or {}).values() if isinstance(n, int))
    return f"; a partition from {', '.join(map(str, peers))} ended ({refused} messages refused)"


async def _chaos(node: str, payload: dict[str, Any], timeout: float) -> Any:
    """The node's reply; a fault it refuses is said in this command's words (its options)."""
    try:
        return await control(node, "chaos", payload, timeout)
    except ConfigError as exc:
        raise ConfigError(as_options(str(exc))) from None


# The node names a fault's fields as a fault spec's keys (a JSON or TOML plan's); the command's
# user typed options: ``seconds must be ...; e.g. "seconds": 0.5`` said as ``--seconds``.
_AS_OPTIONS = (
    ('; e.g. "seconds": 0.5', "; e.g. --seconds 0.5"),
    ("): seconds must", "): --seconds must"),
    (
        """'peers', a non-empty list of peer addresses, e.g. ["tcp://127.0.0.1:5601"]""",
        "--peers (repeated: endpoints, workers or WORKER/ACTOR), e.g. --peers tcp://127.0.0.1:5601",
    ),
    ("'probability'", "--probability"),
    ("'count'", "--count"),
    ("'after'", "--after"),
    ("'message_type'", "--message-type"),
)


_TIMED_KINDS = ("hang_with_gil", "stall", "slow")
_ON_MESSAGES = ("crash", "hang_with_gil", "stall", "slow", "drop")
_OPTION_KINDS = {  # which kinds each option applies to, named as the command takes it
    "seconds": ("--seconds", _TIMED_KINDS),
    "probability": ("--probability", _ON_MESSAGES),
    "count": ("--count", _ON_MESSAGES),
    "after": ("--after", _ON_MESSAGES),
    "message_type": ("--message-type", _ON_MESSAGES),
    "peers": ("--peers", ("partition",)),
}


def options_not_for(kind: str, payload: dict[str, Any]) -> str | None:
    """The options given that do not apply to ``kind``, said as the command's options (the
    node's refusal named its fault spec's fields: ``allowed: actor, after, count, kind, ...``);
    None where every one applies."""
    wrong = [
        f"{option} applies to {', '.join(kinds)} only"
        for field, (option, kinds) in _OPTION_KINDS.items()
        if payload.get(field) not in (None, []) and kind not in kinds
    ]
    return f"{'; '.join(wrong)}, not to {kind}" if wrong else None


def as_options(message: str) -> str:
    """A fault's refusal with its fields named as this command's options."""
    for field, option in _AS_OPTIONS:
        message = message.replace(field, option)
    return message
