"""Before a training run starts anything: its config loaded and made absolute (``steps`` applied,
paths this folder's), the output folder made (emptied of what a run wrote with ``fresh``), and
the dataset, or the data generation pipeline beside, checked."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from troupe.runtime.errors import ConfigError

__all__ = ["check_dataset", "prepare_run"]


def prepare_run(config: Any, out: str | os.PathLike[str], steps: int | None, fresh: bool) -> tuple[Any, Path]:
    """The run's config (a ``TrainConfig``) and its output folder, made, with ``logs`` inside.

    Raises ConfigError for a bad config or ``steps``, a missing dataset, a bad datagen pipeline.
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
    if fresh:
        _delete_written(cfg, out_dir)
    if cfg.datagen is None:
        check_dataset(Path(cfg.train.dataset))
    else:  # refused now, not after the workers started
        from troupe.runtime.pipeline.config import load_pipeline

        load_pipeline(Path(cfg.datagen.pipeline), items=cfg.datagen.items)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "logs").mkdir(exist_ok=True)
    return cfg, out_dir


def _with_steps(cfg: Any, steps: int) -> Any:
    train = cfg.train.model_copy(update={"steps": steps})
    return cfg.model_copy(update={"train": train})


def _delete_written(cfg: Any, out_dir: Path) -> None:
    """Checkpoints, logs, and the latent cache where it lies inside ``out``: what a run wrote."""
    for path in (Path(cfg.train.checkpoint_dir), out_dir / "logs", Path(cfg.encoders.cache_dir)):
        if path.is_dir() and (path == out_dir / "logs" or out_dir in path.resolve().parents):
            shutil.rmtree(path)


def check_dataset(path: Path) -> None:
    """ConfigError unless ``path`` holds a LeRobot dataset or a troupe run's folder."""
    if not path.exists():
        raise ConfigError(
            f"train.dataset: no dataset at {path}; make one first: "
            f"troupe run configs/datagen.toml --out {path}"
        )
    if not ((path / "meta" / "info.json").is_file() or (path / ".troupe" / "episodes").is_dir()):
        raise ConfigError(
            f"train.dataset: {path} is not a LeRobot dataset nor a troupe run's folder; "
            f"make one: troupe run configs/datagen.toml --out {path}"
        )
