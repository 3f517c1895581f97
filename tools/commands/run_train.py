"""``troupe run TRAIN.toml``: training with encoder actors and trainer ranks, with progress.

The work is :func:`troupe.actors.training.train_run.run_training`'s; this module shows its
progress and events, and at the end a table of its figures, or one JSON object.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from troupe.cli.literal import literal
from troupe.cli.preflight import full_disk_problem, writable_problem
from troupe.cli.stop_signals import lines_above, stop_came
from troupe.cli.tables import print_whole
from troupe.runtime.errors import ConfigError, TroupeError

from .model_memory import world_model_problem
from .moved_endpoint import moved_note, say_moved
from .train_report import bar_fields, final_line, result_json, result_table

__all__ = [
    "config_problem",
    "finish_train",
    "is_train_config",
    "result_json",
    "result_table",
    "resume_step",
    "unused_endpoint_note",
]

console = Console()


def is_train_config(path: Path) -> bool:
    """Whether the TOML at ``path`` declares a training run (it has a ``[train]`` table).

    A file that cannot be read or parsed is not one: the pipeline loader reports it.
    """
    try:
        with path.open("rb") as f:
            return isinstance(tomllib.load(f).get("train"), dict)
    except (OSError, ValueError):  # not TOML, or not UTF-8 text (UnicodeDecodeError)
        return False


def config_problem(path: Path) -> str | None:
    """Why the TOML at ``path`` cannot be read as a config at all (unreadable, not TOML, empty),
    or None: said before ``--steps`` is refused for a pipeline config, since a broken file may
    be the training config the user meant (it was reported as a pipeline's misplaced --steps)."""
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        return f"{path}: cannot read it ({exc.strerror or exc})"
    except UnicodeDecodeError:
        return f"{path}: not UTF-8 text; save the config as UTF-8"
    except tomllib.TOMLDecodeError as exc:
        return f"{path}: not valid TOML: {exc}"
    if not data:
        return f"{path}: the file is empty; expected a pipeline or a training config"
    return None


def check_train(
    config: Path,
    out: Path,
    steps: int | None,
    items: int | None,
    fresh: bool = False,
    flag: str = "--items",
    master: str | None = None,
) -> Any:
    """The config loaded and the options checked before anything starts (ConfigError: exit 2);
    ``flag``: the option that gave ``items`` (``--items`` or ``--scenes``), named in its errors;
    ``master``: the cluster the run trains on (its hosts' folders are not this host's)."""
    from troupe.actors.encoders.cache_folder import foreign_problem
    from troupe.actors.training.dataset_identity import dataset_identity
    from troupe.actors.training.train_config import load_train_config
    from troupe.actors.training.train_dir import made_with
    from troupe.actors.training.train_prepare import (
        cache_dir_problem,
        check_datagen,
        check_dataset,
        train_dir,
    )

    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    cfg = load_train_config(config)
    if items is not None:
        if cfg.datagen is None:
            raise ConfigError(f"{flag} {items}: {config} has no [datagen] table; {flag} sets its items")
        cfg = cfg.model_copy(update={"datagen": cfg.datagen.model_copy(update={"items": items})})
    dataset = Path(cfg.with_out(out.resolve()).train.dataset).resolve()
    if dataset == out.resolve():
        raise ConfigError(
            f"--out {out}: it is the dataset's folder (train.dataset); give the training its own --out"
        )
    if cfg.datagen is None:  # before the progress bar and the imports of the run: one line only
        check_dataset(dataset)
    resolved = cfg.with_out(out.resolve())
    shared = cache_dir_problem(resolved, out.resolve())  # the first run took it; each later, refused
    if shared:
        raise ConfigError(shared)
    encoders = resolved.encoders
    if master is None and encoders.disk_mb > 0 and not resolved.train.local_encoding:
        # Found by the encoder workers, it failed them as they started, with the cluster up.
        unusable = writable_problem(Path(encoders.cache_dir), "encoders.cache_dir")
        # The cache deletes its own files when its index is damaged: a folder holding others'
        # is not given to it (the whole folder used to be renamed, then deleted).
        unusable = unusable or foreign_problem(Path(encoders.cache_dir), "encoders.cache_dir")
        unusable = unusable or full_disk_problem(Path(encoders.cache_dir), "encoders.cache_dir")
        if unusable:
            raise ConfigError(unusable)
    if master is None:  # the ranks train on this host (on a cluster, on hosts of their own)
        too_big = world_model_problem(resolved)
        if too_big:
            raise ConfigError(too_big)
    # With [datagen] the dataset is the run's own; with --fresh there is nothing to hold it to.
    identity = None if fresh or cfg.datagen is not None else dataset_identity(dataset)
    train_dir(resolved, out.resolve()).check(made_with(resolved, out.resolve()), fresh, identity)
    if cfg.datagen is not None:
        check_datagen(resolved, out.resolve(), fresh, flag)
    return cfg


def finish_train(
    config: Path,
    out: Path,
    steps: int | None,
    items: int | None,
    endpoint: str | None,
    master: str | None,
    fresh: bool,
    as_json: bool,
    default_endpoint: str,
    flag: str = "--items",
    keys: Path | None = None,
) -> None:
    """The body of ``troupe run TRAIN.toml``; ``endpoint``: the one given (None: the default,
    ``default_endpoint``, or a free port where it is taken, chosen once the config is checked:
    its check takes seconds, in which another run may take the default); ``keys``: the
    ``--master`` cluster's CURVE keys directory (``--keys``, or ``$TROUPE_KEYS``)."""
    from troupe.cli.client import fail, run_async
    from troupe.cli.preflight import (
        default_or_free,
        endpoint_problem,
        endpoint_shape_problem,
        loopback_problem,
    )

    given_endpoint = endpoint
    unusable = writable_problem(out, "--out")  # first: the checks resolve it (a loop raised)
    unusable = unusable or full_disk_problem(out, "--out")
    if unusable:
        raise fail(unusable, 2)
    shape = endpoint_shape_problem(master, "--master")
    if shape:
        raise fail(shape, 2)
    if master is not None:  # first, in a moment: the config's checks take seconds
        absent = _master_absent(master)
        if absent is not None:
            raise fail(*absent)
        unanswered = run_async(_master_unanswered, master, keys)  # with the keys, before --out
        if unanswered is not None:
            raise fail(*unanswered)
    try:
        cfg = check_train(config, out, steps, items, fresh, flag, master)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    problem = (None if master or endpoint is None else endpoint_problem(endpoint, "--endpoint")) or (
        None if master or endpoint is None else loopback_problem(endpoint, "--endpoint", "troupe run")
    )
    if problem:
        raise fail(problem, 2)
    # A default taken meanwhile (a second run at once) gives way to a free port, as a pipeline's:
    # now, or as the node binds it (the check of the checkpoints below takes seconds).
    may_move = master is None and endpoint is None
    if master is None:
        endpoint, moved = default_or_free(endpoint, default_endpoint)
        note = moved_note(endpoint, moved)
        if note is not None:
            say_moved(note)
    else:
        endpoint = endpoint or default_endpoint
    done = None
    if not fresh:
        from troupe.actors.training.checkpoint import CheckpointUnreadable  # torch: not for --fresh

        try:
            done = _trained_already(cfg, out, steps)
        except CheckpointUnreadable as exc:  # the resume would refuse it too, once the cluster started
            raise fail(str(exc), 1) from None
    if done is not None:  # nothing to train: no cluster started (10 s) to say "0.00 samples/s"
        _say_complete("already complete", done, steps or cfg.train.steps, as_json)
        return
    if master is not None and given_endpoint is not None:  # taken, and unused: said, not silent
        say_moved(unused_endpoint_note(given_endpoint))
    # A stop that came once the training was complete: what a rerun would say, exit 0.
    run_async(
        _train, cfg, out, steps, endpoint, master, fresh, as_json, may_move, keys, done_if_returned=True
    )


def _master_absent(master: str) -> tuple[str, int] | None:
    """Why nothing at ``master`` can take the training, and the exit status (2: nothing listens
    there, bad input; 1: the network did not carry the connect); None where something listens.

    A plain connect first, as ``ctl`` does: a refused one is answered at once (the run asked
    ``status`` and said AskTimeout 5 s later, its --out made). The flag's other meaning is said:
    a pipeline's --master is where the run starts its own, a training's is a running one.
    """
    from troupe.cli.master_client import nobody_listens, unreachable_why, what_to_do

    absent = unreachable_why(master, "master")
    if absent is None:
        return None
    meaning = (
        "with a training config, --master is a running master whose nodes train (`troupe master "
        "start`); leave --master out to train on this host"
    )
    said = what_to_do(absent, meaning)  # where nothing listens, the meaning is the advice
    if nobody_listens(absent):
        return f"--master: {said}", 2
    return f"--master: {said}; {meaning}", 1


def unused_endpoint_note(endpoint: str) -> str:
    """What a training run with ``--master`` says of the ``--endpoint`` it was given: it starts
    no node to listen there, and ``ctl status --node E`` found nothing at E (the README sent
    the user there); where to watch the ranks instead. Said, not refused: the command lines
    that give both (a pipeline's, reused) run as they did."""
    return (
        f"note: --endpoint {endpoint} is not used with --master: this run starts no node (its ranks "
        "and encoders run on the cluster's nodes, named by the placing line); watch a rank with "
        "`troupe ctl status --node NODE` on its node (its training ranks table; --json: "
        "workers[].runtime.actor_metrics)"
    )


async def _master_unanswered(master: str, keys: Path | None) -> tuple[str, int] | None:
    """Why the master at ``master``, which listens, cannot take the training, asked for its
    status with ``keys`` (exit 1; 2 where the keys do not load or it is no master); None where
    it answered. A keyless run against a keyed master is told so at once, the transport's words
    naming the keys it lacks: it had recorded --out, then said no master answered 5 s later."""
    from troupe.actors.training.train_cluster import check_master

    try:
        await check_master(master, keys)
    except ConfigError as exc:
        return f"--master: {exc}", 2
    except TroupeError as exc:
        return f"--master: {exc}", 1
    return None


def _say_complete(lead: str, done: tuple[int, Path], target: int, as_json: bool) -> None:
    """What a run whose last checkpoint ``done`` (its step, its folder) reaches the steps asked
    says: ``already complete``, or ``complete when the stop came`` (with --json, the same object)."""
    if as_json:
        print(json.dumps({"already_complete": True, "step": done[0], "checkpoint": str(done[1])}))
        return
    console.print(
        literal(
            f"{lead}: {done[1]} is step {done[0]}, as far as {target} steps "
            "go; give more --steps to train on, or --fresh to start over"
        ),
        soft_wrap=True,
    )


async def _complete_now(cfg: Any, out: Path, steps: int | None) -> tuple[int, Path] | None:
    """:func:`_complete_when_stopped` off the event loop (it hashes the checkpoint's files),
    shielded: the command's scope is cancelled by then, and a second Ctrl-C must still be heard."""
    with anyio.CancelScope(shield=True):
        complete = await anyio.to_thread.run_sync(_complete_when_stopped, cfg, out, steps)
    return complete


def _stopped_line(cfg: Any, out: Path) -> str:
    """What a training run stopped by a signal says last: its newest committed checkpoint, read
    from the disk (the step each rank saved as it stopped), and how to go on."""
    try:
        newest = _newest_checkpoint(cfg, out)
    except OSError as exc:  # the stop must still end with its status, not this
        return f"stopped; its checkpoints in {_checkpoint_dir(cfg, out)} could not be read: {exc}"
    if newest is None:
        return "stopped before any checkpoint was committed: the same command run again starts at step 0"
    step, last = newest
    return f"stopped: checkpoint at step {step} in {last}; the same command run again resumes from it"


def _complete_when_stopped(cfg: Any, out: Path, steps: int | None) -> tuple[int, Path] | None:
    """What :func:`_trained_already` says of a run a stop signal reached, None where it cannot
    tell (a checkpoint that does not read or pass the check: CheckpointUnreadable is a
    ValueError): the run then says it stopped, as it did."""
    try:
        return _trained_already(cfg, out, steps)
    except (ValueError, OSError):
        return None


def _trained_already(cfg: Any, out: Path, steps: int | None) -> tuple[int, Path] | None:
    """The step and folder of ``out``'s last committed checkpoint when it reaches the run's
    steps (and its data generation, if it has one, finished too), else None.

    Raises:
        CheckpointUnreadable: that checkpoint does not hold what its marker says (a folder name
            and an empty marker had said "already complete" over a damaged or stray checkpoint).
    """
    from troupe.runtime.pipeline.run_dir import RunDir

    resolved = cfg.with_out(out.resolve())
    if cfg.datagen is not None and not RunDir(Path(resolved.train.dataset).resolve()).is_complete():
        return None
    return _newest_checkpoint(cfg, out, complete_at=steps or cfg.train.steps)


def resume_step(cfg: Any, out: Path) -> int:
    """The step a run into ``out`` resumes from, as far as its newest committed checkpoint says
    (0: none, or none could be read): where the progress bar starts before the ranks answer."""
    try:
        newest = _newest_checkpoint(cfg, out)
    except OSError:
        return 0
    return 0 if newest is None else newest[0]


def _checkpoint_dir(cfg: Any, out: Path) -> Path:
    return Path(cfg.with_out(out.resolve()).train.checkpoint_dir).resolve()


def _newest_checkpoint(cfg: Any, out: Path, complete_at: int | None = None) -> tuple[int, Path] | None:
    """The step and folder of the run's newest committed checkpoint; None when there is none.

    ``complete_at``: None unless it reaches that step and passes the check a resume applies
    before it loads (also None where reading it failed: an OSError may pass, and the run tries it
    as a resume does).

    Raises:
        CheckpointUnreadable: ``complete_at`` given, and it does not pass that check.
    """
    from troupe.actors.training.checkpoint import CheckpointUnreadable, latest, verify

    last = latest(_checkpoint_dir(cfg, out))
    if last is None:
        return None
    step = int(last.name.removeprefix("step-"))
    if complete_at is not None:
        if step < complete_at:
            return None
        try:
            verify(last)
        except CheckpointUnreadable as exc:
            if exc.final:
                raise
            return None
    return step, last


async def _train(
    cfg: Any,
    out: Path,
    steps: int | None,
    endpoint: str,
    master: str | None,
    fresh: bool,
    as_json: bool,
    may_move: bool = False,
    keys: Path | None = None,
) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from troupe.actors.training.train_run import TrainProgress, run_training

    progress = Progress(
        TextColumn("train"),
        BarColumn(),
        TextColumn("{task.fields[at]}"),  # the step reached of the target; the bar: this run's part
        TextColumn("{task.fields[note]}", markup=False),  # paths: text, not markup
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    )
    target = cfg.train.steps if steps is None else steps
    start = 0 if fresh else resume_step(cfg, out)  # until the ranks say where they resumed
    bar = progress.add_task("train", **bar_fields(start, target, start), note="")

    def show(p: TrainProgress) -> None:
        loss = "-" if p.loss is None else f"{p.loss:.4f}"
        note = f"loss {loss}  {p.samples_per_s:.1f} samples/s"
        if p.checkpoint is not None:
            note += f"  checkpoint @ {p.checkpoint}"
        if p.restarts:
            note += f"  restarts {p.restarts}"
        progress.update(bar, **bar_fields(p.step, p.steps, p.resumed_from or 0), note=note)

    def event(line: str) -> None:
        if as_json:  # stdout is the JSON object's
            Console(stderr=True).print(literal(line), soft_wrap=True)
        else:
            progress.console.print(literal(line), soft_wrap=True)

    complete: tuple[int, Path] | None = None  # a stop came once the training was complete
    with lines_above(console):  # a stop's lines above the bar, not over it
        progress.start()
        try:
            result = await run_training(
                cfg,
                out,
                steps=steps,
                master=master,
                on_progress=show,
                on_event=event,
                fresh=fresh,
                node_endpoint=endpoint,
                endpoint_may_move=may_move,
                keys=keys,
            )
        except anyio.get_cancelled_exc_class():  # Ctrl-C or SIGTERM: the ranks saved where they stopped
            progress.stop()
            complete = await _complete_now(cfg, out, steps)
            if complete is None:
                Console(stderr=True).print(literal(_stopped_line(cfg, out)), soft_wrap=True)
                raise
            # The ranks were done, their final checkpoint committed, when the stop came (it
            # landed as the workers and the node stopped): it stopped nothing; said below.
        finally:
            progress.stop()
    if complete is None and stop_came():  # the run returned: the stop came as its processes stopped
        complete = await _complete_now(cfg, out, steps)
    if complete is not None:  # said as the rerun would say it, exit 0
        _say_complete("complete when the stop came", complete, steps or cfg.train.steps, as_json)
        return
    if as_json:
        print(json.dumps(result_json(result), indent=2))
        return
    print_whole(console, result_table(result), unwrapped=True)
    console.print(literal(final_line(result, str(_checkpoint_dir(cfg, out)))), soft_wrap=True)
