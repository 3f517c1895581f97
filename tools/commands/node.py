"""``troupe node start``: run this host's node in the foreground.

A node started by another program for its own use (the pytest plugin's ``troupe_cluster``)
dies with that program: the program passes its pid in ``TROUPE_PARENT_PID``, as a node does
to its workers (``child.die_with_parent``). A pytest killed by SIGKILL (a CI timeout) left its
nodes running, their workers and ports with them. A node started by hand has no such variable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from troupe.cli.client import err_console, run_async
from troupe.cli.literal import literal
from troupe.cli.master_client import node_name_problem
from troupe.cli.preflight import check_node_start
from troupe.runtime.errors import ConfigError
from troupe.runtime.logs import configure_logging
from troupe.runtime.node.child import PARENT_PID_ENV, die_with_parent
from troupe.runtime.node.config import NodeConfig, load_node_config
from troupe.runtime.node.leftovers import live_namesake
from troupe.runtime.node.name_lock import hold_name
from troupe.runtime.node.node import Node
from troupe.runtime.security.process import KEYS_ENV, install, keys_for
from troupe.runtime.tasks.master.master import Master
from troupe.runtime.tasks.master.master_config import MasterConfig

from .keys_option import from_environment, insecure_with_keys
from .master import (
    DEFAULT_JOURNAL,
    InsecureOption,
    KeysOption,
    MetricsOption,
    load_journal,
    run_node_with_master,
)

__all__ = ["node_app"]

node_app = typer.Typer(no_args_is_help=True)


@node_app.command("start")
def start(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Node TOML file.")] = None,
    name: Annotated[str | None, typer.Option(help="Node name (default: host name).")] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="Control endpoint (off loopback: --keys or --insecure).")
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(help="With --endpoint tcp://0.0.0.0:PORT: the address other hosts reach this one at."),
    ] = None,
    log_dir: Annotated[Path | None, typer.Option("--logs", help="Directory of the JSON-lines logs.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    master: Annotated[str | None, typer.Option(help="Join the master at this endpoint.")] = None,
    with_master: Annotated[
        bool, typer.Option("--with-master", help="Run the master in this node's process too.")
    ] = False,
    journal: Annotated[
        Path, typer.Option(help="With --with-master: the master's journal.")
    ] = DEFAULT_JOURNAL,
    new: Annotated[
        bool, typer.Option("--new", help="With --with-master: create the journal if missing.")
    ] = False,
    keys: KeysOption = None,
    insecure: InsecureOption = None,
    metrics: MetricsOption = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag", help="A resource tag this node offers; repeat for more (replaces \\[node] tags)."
        ),
    ] = None,
) -> None:
    """Start a node: spawn the configured workers and answer control messages until SIGTERM."""
    if os.environ.get(PARENT_PID_ENV):  # started for a program's own use: it dies with it
        die_with_parent()
    # $TROUPE_KEYS serves where neither --keys nor the config's [node] keys name keys (kl 1).
    env_keys = keys if from_environment(ctx, "keys") else None
    # None: the file's value
    options = {
        "keys": None if env_keys is not None else keys,
        "insecure": insecure or None,
        "metrics": metrics,
        "tags": tag or None,
        "advertise": advertise,
    }
    master = check_node_start(
        config,
        with_master,
        env_keys,
        name=name,
        endpoint=endpoint,
        log_dir=log_dir,
        log_level=log_level,
        master=master,
        **options,
    )  # exits 2 on bad input

    async def main() -> None:
        cfg = load_node_config(
            config,
            env_keys=env_keys,
            name=name,
            endpoint=endpoint,
            log_dir=log_dir,
            log_level=log_level,
            master=master,
            **options,
        )
        if cfg.insecure and cfg.keys is not None:  # before anything is made (kl 4)
            raise ConfigError(
                _insecure_with_keys(config, cfg.keys, keys_given=keys, env_keys=env_keys, insecure=insecure)
            )
        if env_keys is not None and cfg.keys is not None and not _same_folder(cfg.keys, env_keys):
            _say_keys_ignored(config, cfg.keys, env_keys)
        if cfg.master is not None and not with_master:  # asked first: a refusal makes no --logs
            install(keys_for(cfg.keys) if cfg.keys is not None else None)  # as the node will
            taken = await node_name_problem(cfg.master, cfg.name, cfg.endpoint)
            if taken is not None:
                raise ConfigError(taken)
        # Taken before the records are read and held for the node's life: of two namesakes
        # started at once, exactly one holds it (a record is written only as the node serves).
        with hold_name(cfg.log_dir, cfg.name) as hold:
            # The records: a node of an older troupe (no lock), or where no lock can be had.
            namesake = hold.holder or live_namesake(cfg.log_dir, cfg.name)
            if namesake is not None:  # before our first line goes into its log
                raise ConfigError(
                    f"node {cfg.name!r} already runs with its log in {cfg.log_dir} (pid {namesake}): both "
                    f"would write {cfg.name}.jsonl; stop it, or give this node another --name or --logs"
                )
            await _serve(cfg, with_master, journal, new)

    run_async(main)


def _same_folder(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _insecure_with_keys(
    config: Path | None, used: Path, *, keys_given: Path | None, env_keys: Path | None, insecure: bool | None
) -> str:
    """The refusal of ``insecure`` with keys, each named where it was given."""
    if keys_given is not None and env_keys is None:
        keys_from = f"--keys {used}"
    elif env_keys is not None and _same_folder(used, env_keys):
        keys_from = f"${KEYS_ENV} ({env_keys})"
    else:
        keys_from = f"[node] keys ({used}) of {config}"
    return insecure_with_keys("--insecure" if insecure else f"[node] insecure of {config}", keys_from)


def _say_keys_ignored(config: Path | None, used: Path, env_keys: Path) -> None:
    """One line at start where the config's ``[node] keys`` and ``$TROUPE_KEYS`` differ: the
    environment's were taken over the file's without a word (report kl 1)."""
    said = (
        f"note: keys: {used}, the [node] keys of {config}, are used; ${KEYS_ENV} ({env_keys}) is "
        "ignored (a node's config file wins over the environment, and --keys DIR over both)"
    )
    err_console.print(literal(said), highlight=False, soft_wrap=True)


async def _serve(cfg: NodeConfig, with_master: bool, journal: Path, new: bool) -> None:
    """Run the node of ``cfg`` (and with ``with_master``, the master on ``journal``) to its stop."""
    configure_logging(
        cfg.name,
        "node",
        cfg.log_dir,
        console=True,
        level=cfg.log_level,
        rotate_at_bytes=cfg.log_max_bytes,
        keep=cfg.log_keep,
    )
    if not with_master:
        await Node(cfg, handle_signals=False, reap_orphans=True).run()
        return
    assert cfg.master is not None
    opened, book = load_journal(journal, new)  # task dispatch: the master lives here too
    try:
        node = Node(cfg, handle_signals=False, reap_orphans=True)
        control_plane = Master(MasterConfig(cfg.master, keys=cfg.keys, insecure=cfg.insecure), opened, book)
        if cfg.metrics is not None:  # one process, one endpoint: the master's metrics join the node's
            from troupe.runtime.metrics.master_metrics import MasterCollector

            # The process's CURVE families once, the node's: not twice in one scrape.
            node.metrics_collectors.append(MasterCollector(control_plane, security=False))
        await run_node_with_master(node, control_plane)
    finally:
        opened.close()
