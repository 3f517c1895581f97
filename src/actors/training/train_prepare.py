"""Before a training run starts anything: its config loaded and made absolute (``steps`` applied,
paths this folder's), the dataset, or the data generation pipeline beside, checked, and the
output folder checked, made and held (``train_dir``: emptied of what a run wrote with
``fresh``)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from troupe.runtime.errors import ConfigError
from troupe.runtime.pipeline.config import load_pipeline
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_fingerprint import fingerprint, first_difference

from .dataset_identity import DatasetIdentity, dataset_identity
from .train_dir import TrainDir, made_with

__all__ = ["cache_dir_problem", "check_datagen", "check_dataset", "prepare_run", "train_dir", "trained_on"]


def prepare_run(
    config: Any, out: str | os.PathLike[str], steps: int | None, fresh: bool
) -> tuple[Any, Path, TrainDir, list[str]]:
    """The run's config (a ``TrainConfig``), its output folder, made, with ``logs`` inside, the
    folder, held (``TrainDir.release`` it when the run ends: that takes this code back from the
    record where the run committed no checkpoint), and the lines the run says before it starts
    (the dataset grew since the checkpoints began; other troupe code trained the checkpoints it
    resumes).

    Raises ConfigError for a bad config or ``steps``, a missing dataset, a bad datagen pipeline,
    a latent cache folder that is one of the run's own (:func:`cache_dir_problem`), an ``out``
    another run uses, made with another model, holding someone else's files, or
    whose checkpoints were trained on another dataset than ``train.dataset`` holds now.
    """
    from .train_config import TrainConfig, load_train_config

    cfg = config if isinstance(config, TrainConfig) else load_train_config(config)
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"steps={steps!r}: expected an integer >= 1")
        cfg = _with_steps(cfg, steps)
    out_dir = Path(out).resolve()
    cfg = cfg.with_out(out_dir)
    # Workers may run elsewhere than this process's folder: relative paths are this folder's.
    train = cfg.train.model_copy(
        update={k: str(Path(getattr(cfg.train, k)).resolve()) for k in ("dataset", "checkpoint_dir")}
    )
    cfg = cfg.model_copy(update={"train": train})
    shared = cache_dir_problem(cfg, out_dir)
    if shared is not None:
        raise ConfigError(shared)
    if cfg.datagen is None:
        check_dataset(Path(cfg.train.dataset))
    else:  # refused now, not after the workers started
        check_datagen(cfg, out_dir, fresh)
    folder = train_dir(cfg, out_dir)
    folder.prepare(made_with(cfg, out_dir), fresh, trained_on(cfg))
    try:
        (out_dir / "logs").mkdir(exist_ok=True)
    except BaseException:
        folder.release()
        raise
    return cfg, out_dir, folder, [line for line in (folder.grown, folder.other_code) if line]


def cache_dir_problem(cfg: Any, out_dir: Path) -> str | None:
    """Why the latent cache's folder (``encoders.cache_dir`` of ``cfg``, ``{out}`` replaced)
    cannot be this run's: it is, holds or lies in one of the run's own folders (``--out``
    itself, ``train.checkpoint_dir``, ``train.dataset``, ``logs``, ``.troupe-train``; lying in
    ``--out`` is its place); None where it can, or where there is no disk tier. The cache
    refuses a folder holding files it did not write: ``"{out}/checkpoints"`` was taken by the
    first run, which put the cache beside its checkpoints, and every later run was refused,
    ``--fresh`` too, naming the run's own checkpoints; ``"{out}"`` failed in the encoder worker
    once the run had started (report lc 7)."""
    if cfg.encoders.disk_mb <= 0 or cfg.train.local_encoding:
        return None
    cache, out = Path(cfg.encoders.cache_dir).resolve(), out_dir.resolve()
    own = [
        ("--out", out),
        ("train.checkpoint_dir", Path(cfg.train.checkpoint_dir).resolve()),
        ("train.dataset", Path(cfg.train.dataset).resolve()),
        ("logs folder", out / "logs"),
        ("record folder", out / ".troupe-train"),
    ]
    for what, path in own:
        if cache == path:
            how = f"is the run's {what}"
        elif path.is_relative_to(cache):
            how = f"holds the run's {what} {path}"
        elif cache.is_relative_to(path) and path != out:
            how = f"lies in the run's {what} {path}"
        else:
            continue
        return (
            f"encoders.cache_dir {cache} {how}: the latent cache needs a folder of its own (it "
            'refuses one holding files it did not write); give it one, as "{out}/latent-cache"'
        )
    return None


def trained_on(cfg: Any) -> DatasetIdentity | None:
    """The identity of the dataset ``cfg`` (its paths resolved) trains on; None with a data
    generation beside (the dataset is the run's own, checked by its pipeline's record)."""
    return None if cfg.datagen is not None else dataset_identity(Path(cfg.train.dataset))


def train_dir(cfg: Any, out_dir: Path) -> TrainDir:
    """The output folder of a run of ``cfg`` (paths resolved against ``out_dir``), with the
    folders the run writes there."""
    written = [Path(cfg.train.checkpoint_dir), Path(cfg.encoders.cache_dir)]
    if cfg.datagen is not None:  # its dataset is the run's; a dataset given is the user's
        written.append(Path(cfg.train.dataset))
    return TrainDir(out_dir, [p.resolve() for p in written], Path(cfg.train.checkpoint_dir).resolve())


def check_datagen(cfg: Any, out_dir: Path, fresh: bool, flag: str = "--items") -> None:
    """ConfigError where the data generation of ``cfg`` (a ``TrainConfig`` with ``[datagen]``,
    its paths resolved) cannot feed this run: fewer items than ``train.min_episodes``, or a
    dataset folder an earlier run made with another pipeline (``flag``: the option of the items).
    """
    pipeline = load_pipeline(Path(cfg.datagen.pipeline), items=cfg.datagen.items)
    if pipeline.items < cfg.train.min_episodes:  # the ranks would wait for ever, then fail
        raise ConfigError(
            f"[datagen] makes {pipeline.items} episode(s) at most (its items), fewer than "
            f"train.min_episodes = {cfg.train.min_episodes}: raise the items ({flag}) or lower "
            "train.min_episodes"
        )
    if fresh:
        return  # the data generation starts anew too
    data, made = RunDir(Path(cfg.train.dataset).resolve()), fingerprint(pipeline)
    recorded = data.recorded()
    diff = None if recorded is None else first_difference(recorded, made)
    if diff is not None and recorded is not None:
        # The pipeline's own refusal came once the cluster was up, naming --out/data, and its
        # --fresh would have deleted the checkpoints and the latent cache as well.
        where = f"--out {out_dir}" if data.out.parent == out_dir else f"train.dataset {data.out}"
        items = diff[0].startswith("items=")
        keep = f"{flag} {recorded['items']} to train on what it made, or " if items else ""
        raise ConfigError(
            f"{where} holds a data generation made with {diff[0]}, this run asks {diff[1]}: run "
            f"with {keep}--fresh to start everything anew (its checkpoints and latent cache deleted too)"
        )
    data.check(made, fresh)  # the rest it would refuse as it starts (in use, someone's files)


def _with_steps(cfg: Any, steps: int) -> Any:
    train = cfg.train.model_copy(update={"steps": steps})
    return cfg.model_copy(update={"train": train})


def check_dataset(path: Path) -> None:
    """ConfigError unless ``path`` holds a LeRobot dataset or a troupe run's folder."""
    if not path.exists():
        raise ConfigError(
            f"train.dataset: no dataset at {path}; make one first: "
            f"troupe run configs/datagen.toml --out {shlex.quote(str(path))}"
        )
    if not path.is_dir():
        raise ConfigError(f"train.dataset: {path} is a file; give the folder of a LeRobot dataset")
    if (path / ".troupe-train").is_dir():
        raise ConfigError(
            f"train.dataset: {path} is a training run's --out, not a dataset; give the dataset it "
            "trained on (its train.dataset), or make one: troupe run configs/datagen.toml --out DIR"
        )
    info = path / "meta" / "info.json"
    if not (info.is_file() or (path / ".troupe" / "episodes").is_dir()):
        raise ConfigError(
            f"train.dataset: {path} is not a LeRobot dataset nor a troupe run's folder; "
            f"make one: troupe run configs/datagen.toml --out {shlex.quote(str(path))}"
        )
    if info.is_file():
        _check_version(path, info)


def _check_version(path: Path, info: Path) -> None:
    """ConfigError unless ``info`` says LeRobot v3: another layout (v2.1: a parquet per episode,
    episodes.jsonl) read as none, and the ranks failed on 0 episodes once the cluster was up."""
    try:
        data = json.loads(info.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"train.dataset: {info} cannot be read ({why})") from None
    version = data.get("codebase_version") if isinstance(data, dict) else None
    if isinstance(version, str) and version.startswith("v3."):
        return
    found = "no codebase_version" if version is None else f"codebase_version {version}"
    raise ConfigError(
        f"train.dataset: {path} is a LeRobot dataset of {found} (meta/info.json); troupe reads "
        "LeRobot v3.0: convert it (lerobot's convert_dataset_v21_to_v30), or make one: "
        "troupe run configs/datagen.toml --out DIR"
    )
