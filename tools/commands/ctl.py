"""``troupe ctl``: control messages to a running node (and, through it, the cluster)."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from rich.console import Console

from troupe.cli.client import (
    control,
    endpoint_option,
    err_console,
    fail,
    node_status,
    run_async,
    seconds_option,
)
from troupe.cli.drain_wait import drain_and_wait
from troupe.cli.literal import literal, markup
from troupe.cli.master_client import (
    absent_master,
    jobs_tables,
    master_call,
    master_status,
    master_tables,
    reachable,
    submit_job,
)
from troupe.cli.reply_shape import shaped_as
from troupe.cli.stop_signals import lines_above, say_if_heard
from troupe.cli.stream_encoding import spinner_for
from troupe.cli.tables import print_whole, status_tables
from troupe.runtime.errors import ConfigError, TroupeError, Unreachable
from troupe.runtime.node.config import DEFAULT_NODE_ENDPOINT
from troupe.runtime.tasks.jobspec import load_job
from troupe.runtime.tasks.master.job_listing import STATUS_FINISHED_JOBS, recent_jobs
from troupe.runtime.tasks.master.master_config import DEFAULT_MASTER_ENDPOINT
from troupe.runtime.tasks.state import JobState

from .keys_option import KeysOption, use_keys
from .top import top

__all__ = ["MasterOption", "NodeOption", "ctl_app"]

ctl_app = typer.Typer(no_args_is_help=True)
ctl_app.command("top")(top)  # the live view (commands/top.py)
console = Console()
_SAYS_WAITING = 50_000  # tasks in a job from which `ctl submit` shows that it waits (a second or more)
_REPLY_S = 10.0  # the master's reply to a drain, and to each look of a drain's --wait

NodeOption = Annotated[
    str,
    typer.Option(
        "--node", envvar="TROUPE_NODE", help="Endpoint of the node to talk to.", callback=endpoint_option
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for the reply.", callback=seconds_option)
]
MasterOption = Annotated[
    str,
    typer.Option(
        "--master",
        envvar="TROUPE_MASTER",
        help="Endpoint of the master to talk to.",
        callback=endpoint_option,
    ),
]


@ctl_app.callback()
def _ctl(keys: KeysOption = None) -> None:
    """Send control messages to a running cluster."""
    use_keys(keys)  # `troupe ctl --keys DIR COMMAND`: for every command, also those without --keys


@ctl_app.command("ping")
def ping(
    node: NodeOption = DEFAULT_NODE_ENDPOINT, timeout: TimeoutOption = 5.0, keys: KeysOption = None
) -> None:
    """Check that a node answers, and how fast."""
    use_keys(keys)
    start = time.perf_counter()
    reply: Any = run_async(control, node, "ping", None, timeout, reader=True)
    ms = (time.perf_counter() - start) * 1000
    if not (isinstance(reply, dict) and "node" in reply):
        raise fail(f"{node} answered in {ms:.1f} ms, but not as a node (--node takes a node's endpoint)")
    console.print(
        markup(
            "node ", literal(reply["node"], "bold"), literal(f" (pid {reply['pid']}) answered in {ms:.1f} ms")
        )
    )


@ctl_app.command("status")
def status(
    node: NodeOption = DEFAULT_NODE_ENDPOINT,
    master: MasterOption = DEFAULT_MASTER_ENDPOINT,
    as_json: JsonOption = False,
    timeout: TimeoutOption = 5.0,
    keys: KeysOption = None,
) -> None:
    """Show the node, its workers and their actors; and the master's view when one answers."""
    use_keys(keys)
    node_reply, master_reply, errors = run_async(_both_status, node, master, timeout, reader=True)
    if as_json:
        reply = dict(node_reply) if node_reply is not None else {"node_error": errors.get("node", "")}
        if master_reply is not None:
            reply["master"] = master_reply
        elif "master" in errors:
            reply["master_error"] = errors["master"]
        typer.echo(json.dumps(reply, indent=2, default=str))
        return
    not_shown = _recent_jobs_only(master_reply)
    # Built before anything is printed: a reply of another shape is one line, not half a view.
    with shaped_as(node, "node"):
        node_tables = status_tables(node_reply) if node_reply is not None else []
    with shaped_as(master, "master"):
        master_view = master_tables(master_reply) if master_reply is not None else []
    for table in node_tables:
        print_whole(console, table)
    # A master that is not there is no news (nodes run without one); one that answered wrong is.
    for error in errors.values():
        err_console.print(markup("[yellow]note:[/] ", literal(error)), highlight=False, soft_wrap=True)
    for table in master_view:
        print_whole(console, table)
    if master_reply is not None and not_shown:
        jobs = "job" if not_shown == 1 else "jobs"
        console.print(literal(f"{not_shown} finished {jobs} not shown: `troupe ctl jobs` lists them all"))


def _recent_jobs_only(reply: Any) -> int:
    """Keep the running jobs and the last finished ones of a master's ``status`` reply (a master
    older than that sends every job it has); return how many finished jobs are not shown."""
    if not (isinstance(reply, dict) and isinstance(reply.get("jobs"), list)):
        return 0
    reply["jobs"], trimmed = recent_jobs(reply["jobs"], _running_job, STATUS_FINISHED_JOBS)
    not_shown = reply.get("jobs_not_shown")
    return trimmed + (not_shown if isinstance(not_shown, int) else 0)


def _running_job(job: Any) -> bool:
    return not isinstance(job, dict) or job.get("state") == "running"  # another shape: shown, refused there


async def _both_status(node: str, master: str, timeout: float) -> tuple[Any, Any, dict[str, str]]:
    """The node's status and the master's (None where nothing answers), and why one did not
    answer (the master's only where something listens there); fail if neither does."""
    replies: dict[str, Any] = {}
    errors: dict[str, TroupeError] = {}

    async def ask(key: str, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            replies[key] = await call()
        except TroupeError as exc:
            errors[key] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, "node", partial(node_status, node, timeout))
        if reachable(master):
            tg.start_soon(ask, "master", partial(master_status, master, timeout))
        elif (absent := absent_master(master)) is not None:
            errors["master"] = Unreachable(absent)
    if "node" not in replies and "master" not in replies:
        raise errors["node"]
    return replies.get("node"), replies.get("master"), {key: str(exc) for key, exc in errors.items()}


# --------------------------------------------------------------------------- the master's jobs


def _job_payload(job_file: Path, job_id: str | None) -> tuple[dict[str, Any], int]:
    """The submit's payload, and how many tasks the job has."""
    try:
        spec = load_job(job_file)  # every mistake is named here, with the file and the field
        spec.checked_id(job_id)  # and an id whose task ids are too long, before the master is asked
        data = tomllib.loads(job_file.read_text(encoding="utf-8"))
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    tasks = spec.count if spec.count is not None else len(spec.entries)
    return {"job": data, "source": str(job_file), "job_id": job_id}, tasks


@ctl_app.command("submit")
def submit(
    job_file: Annotated[
        Path,
        typer.Argument(
            metavar="JOB.toml",
            help="The job's TOML file (see configs/job-example.toml: `troupe configs job-example.toml`).",
        ),
    ],
    master: MasterOption = DEFAULT_MASTER_ENDPOINT,
    job_id: Annotated[str | None, typer.Option("--id", help="Job id (default: the job's name).")] = None,
    as_json: JsonOption = False,
    timeout: TimeoutOption = 60.0,
    keys: KeysOption = None,
) -> None:
    """Submit a job file to the master; it is journaled before this returns.

    Submitting the same file (same id, same content) again is safe: the master says it has the
    job already. The same id with other content is refused.
    """
    use_keys(keys)
    payload, tasks = _job_payload(job_file, job_id)
    name = literal(job_id or payload["job"]["job"]["name"], "bold")
    waiting = (  # seconds of checking and journaling: say what the wait is
        err_console.status(
            markup("the master is taking in job ", name, f": {tasks:,} tasks"),
            spinner=spinner_for(err_console),
        )
        if tasks >= _SAYS_WAITING
        else nullcontext()
    )
    with waiting, lines_above(err_console):  # a stop's lines above the spinner, not beside it
        reply = run_async(submit_job, master, payload, timeout)
    if as_json:
        # A new job's reply carries no state (null), one from an older master no key at all.
        typer.echo(json.dumps({**reply, "state": reply.get("state")}))
    if reply.get("already") and reply.get("state") == "cancelled":
        # Nothing was submitted: a script must not read it as done, with --json too.
        plain = str(reply["job_id"])
        raise fail(
            f"job {plain} was submitted before and cancelled: its tasks do not run again; "
            f"submit the file under a new id to run it (--id {plain}-2)"
        )
    if as_json:
        return
    job = literal(reply["job_id"], "bold")
    if reply.get("already"):
        state = reply.get("state", "running")
        console.print(
            markup(
                "job ",
                job,
                literal(f" is already submitted ({reply['tasks']} tasks, same content, {state}); ")
                + "see `troupe ctl jobs`",
            )
        )
        return
    console.print(markup("submitted job ", job, literal(f": {reply['tasks']} tasks")))


@ctl_app.command("jobs")
def jobs(
    master: MasterOption = DEFAULT_MASTER_ENDPOINT,
    running: Annotated[bool, typer.Option("--running", help="Only the running jobs.")] = False,
    last: Annotated[
        int | None,
        typer.Option("--last", min=0, metavar="N", help="The running jobs and the last N finished ones."),
    ] = None,
    as_json: JsonOption = False,
    timeout: TimeoutOption = 10.0,
    keys: KeysOption = None,
) -> None:
    """List the master's jobs with their tasks by state (every job the master has, by default)."""
    use_keys(keys)
    if running and last is not None:
        raise fail("--running and --last together: --running is --last 0; give one", 2)
    last = 0 if running else last
    payload = None if last is None else {"last": last}
    reply = run_async(master_call, master, "jobs", payload, timeout, reader=True)
    if last is not None and isinstance(reply, list):  # a master older than `last` sends them all
        reply, _ = recent_jobs(reply, _running_job, last)
    if as_json:
        typer.echo(json.dumps(reply, indent=2))
        return
    with shaped_as(master, "master"):
        tables = jobs_tables(reply)
    for table in tables:
        print_whole(console, table)


@ctl_app.command("cancel")
def cancel(
    job: Annotated[str, typer.Argument(metavar="JOB", help="The job id.")],
    master: MasterOption = DEFAULT_MASTER_ENDPOINT,
    timeout: TimeoutOption = 10.0,
    keys: KeysOption = None,
) -> None:
    """Cancel a job: its unfinished tasks are cancelled and running copies stopped."""
    use_keys(keys)
    ended = run_async(_cancel, master, job, timeout)
    if ended is None:
        console.print(markup("job ", literal(job, "bold"), " cancelled"))
    else:  # said again, or after it ended: what was asked holds (exit 0, as a second drain)
        console.print(
            markup("job ", literal(job, "bold"), literal(f" ended already ({ended}): nothing to cancel"))
        )


async def _cancel(master: str, job: str, timeout: float) -> str | None:
    """Cancel ``job``; the state it had ended in instead, when it had (a repeated cancel)."""
    jobs = await master_call(master, "jobs", None, timeout)
    known = next((j for j in jobs or [] if isinstance(j, dict) and j.get("job_id") == job), None)
    if known is not None and known.get("state") != JobState.RUNNING:
        return str(known.get("state"))
    await master_call(master, "cancel", {"job_id": job}, timeout)
    return None


@ctl_app.command("retry")
def retry(
    job: Annotated[str, typer.Argument(metavar="JOB", help="The job id.")],
    master: MasterOption = DEFAULT_MASTER_ENDPOINT,
    timeout: TimeoutOption = 10.0,
    keys: KeysOption = None,
) -> None:
    """Run a job's dead-lettered tasks again, with their attempts counted from zero (say, after
    the full disk that killed them was cleared); a job that ended failed runs again."""
    use_keys(keys)
    reply = run_async(master_call, master, "retry_dead", {"job_id": job}, timeout)
    with shaped_as(master, "master"):
        retried = int(reply["retried"])
    if not retried:
        said = f" has no dead-lettered tasks ({reply.get('state')}): nothing to retry"
        console.print(markup("job ", literal(job, "bold"), literal(said)))
        return
    tasks = f"{retried} dead-lettered task{'s' if retried > 1 else ''}"
    follow = literal(f": {tasks} run again; ") + "`troupe ctl jobs` follows them"
    console.print(markup("job ", literal(job, "bold"), follow))


@ctl_app.command("drain")
def drain(
    node_name: Annotated[str, typer.Argument(metavar="NODE", help="The node's name.")],
    master: MasterOption = DEFAULT_MASTER_ENDPOINT,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Return once the node holds no task (safe to stop), saying what it holds meanwhile.",
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds to wait for the reply (default 10); with --wait, for the drain (no default bound).",
            callback=seconds_option,
        ),
    ] = None,
    keys: KeysOption = None,
) -> None:
    """Drain a node: no new tasks; once its running tasks end, the node stops its workers."""
    use_keys(keys)
    if wait:
        reply_s = _REPLY_S if timeout is None else min(_REPLY_S, timeout)
        say = partial(say_if_heard, console)
        done = run_async(drain_and_wait, master, node_name, reply_s, timeout, say, reader=True)
        console.print(literal(done))
        return
    run_async(master_call, master, "drain", {"node": node_name}, _REPLY_S if timeout is None else timeout)
    console.print(
        markup(
            "node ",
            literal(node_name, "bold"),
            " draining: it takes no new task and stops its workers once the tasks it holds are "
            "done (`troupe ctl drain --wait` waits for that; `troupe ctl undrain` resumes it)",
        )
    )


@ctl_app.command("undrain")
def undrain(
    node_name: Annotated[str, typer.Argument(metavar="NODE", help="The node's name.")],
    master: MasterOption = DEFAULT_MASTER_ENDPOINT,
    timeout: TimeoutOption = 10.0,
    keys: KeysOption = None,
) -> None:
    """Resume a drained node: it takes tasks again; the workers the drain stopped start again."""
    use_keys(keys)
    reply = run_async(master_call, master, "undrain", {"node": node_name}, timeout)
    with shaped_as(master, "master"):
        said = _undrain_said(reply)
    console.print(markup("node ", literal(node_name, "bold"), literal(said)))


def _undrain_said(reply: dict[str, Any]) -> str:
    """What an undrain did, by how the master has the node (``state``: an older master says
    none). One stopped or dead, or that did not answer, is told at its next beat."""
    state = reply.get("state", "alive")
    if state == "stopped":
        return " takes tasks again once it starts (it is stopped now)"
    if state == "dead":
        return " takes tasks again once it is back (the master has it as dead now: it went silent)"
    if "not_told" in reply:
        return (
            f" takes tasks again; it did not answer the undrain now ({reply['not_told']}): "
            "it is told again when it next beats"
        )
    started = ", ".join(map(str, reply["restarted"]))
    return " takes tasks again" + (f"; workers started again: {started}" if started else "")


@ctl_app.command("dead")
def dead(
    job: Annotated[str, typer.Argument(metavar="JOB", help="The job id.")],
    master: MasterOption = DEFAULT_MASTER_ENDPOINT,
    as_json: JsonOption = False,
    traceback: Annotated[bool, typer.Option("--traceback", help="Also print each traceback.")] = False,
    timeout: TimeoutOption = 10.0,
    keys: KeysOption = None,
) -> None:
    """List a job's dead-lettered tasks with their last error."""
    use_keys(keys)
    letters = run_async(master_call, master, "dead", {"job_id": job}, timeout, reader=True)
    if as_json:
        typer.echo(json.dumps(letters, indent=2))
        return
    if not letters:
        console.print(literal(f"job {job} has no dead-lettered task"))
        return
    # Plain lines, not a table: errors are long and get copied into bug reports whole.
    with shaped_as(master, "master"):
        lines = [f"dead letters of job {job}: {len(letters)}"]
        for d in letters:
            lines.append(f"{d['task_id']}  after {d['attempts']} attempts: {d['error']}")
            if traceback:
                lines.append(d["traceback"] or "(no traceback)")
    for line in lines:
        typer.echo(line)
