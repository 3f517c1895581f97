"""The data generation lifecycle, Load -> Plan -> Render -> Store, as pipeline stage actors.

Base classes fix each step's contract; the ``Nav*`` and ``LeRobot*`` classes implement indoor
navigation on top of them. Items travel between stages as msgpack-able dicts (``scene_wire``):

=============  ==========================================  ====================================
stage          input item                                  output item
=============  ==========================================  ====================================
load           ``{task_id, seed}``                         ``+ scene`` (randomized, wire form)
plan           ``+ scene``                                 ``+ plan``; unreachable goals prune
render         ``+ scene, plan``                           ``{task_id, seed, plan, rgb, depth}``
store          ``{task_id, seed, plan, rgb, depth}``       ``{task_id, frames, committed}``
=============  ==========================================  ====================================
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import numpy as np

from troupe.actors.lerobot.dataset_drafts import DRAFTS_DIR, DatasetDrafts, clear_stale
from troupe.actors.lerobot.episode import EpisodeConfig, EpisodeData
from troupe.actors.lerobot.format import DATA_FILES_SIZE_IN_MB, VIDEO_FILES_SIZE_IN_MB
from troupe.actors.lerobot.writer import AsyncWriter
from troupe.runtime.errors import ConfigError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.pipeline.stage import StageActor, StageRun
from troupe.runtime.tasks.output_store import OutputStore

from .dataset_root import claim_dataset_root, dataset_root
from .randomize import RandomizeConfig, randomize
from .scene import Scene, SceneConfig, generate_scene
from .scene_wire import plan_from_wire, plan_to_wire, scene_from_wire, scene_to_wire
from .trajectory import Plan, PlanConfig, plan_episode

log = get_logger(__name__)

__all__ = [
    "BaseLoader",
    "BasePlanner",
    "BaseRandomizer",
    "BaseRenderer",
    "BaseWriter",
    "LeRobotWriter",
    "NavPlanner",
    "RaycastRenderer",
    "SceneLoader",
]

TASK_TEXT = "navigate to the goal"


class BaseLoader(StageActor):
    """Load: make (or read) the scene of a task. Input ``{task_id, seed}``; adds ``scene``."""

    def load(self, task_id: str, seed: int) -> Scene:
        """Return the task's scene."""
        raise NotImplementedError

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        scene = self.load(item["task_id"], int(item["seed"]))
        return {**item, "scene": scene_to_wire(scene)}


class BaseRandomizer(BaseLoader):
    """Load with domain randomization applied after loading, seeded by the task."""

    def randomize(self, scene: Scene, seed: int) -> Scene:
        """Return a randomized copy of ``scene``."""
        raise NotImplementedError

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        seed = int(item["seed"])
        scene = self.randomize(self.load(item["task_id"], seed), seed)
        return {**item, "scene": scene_to_wire(scene)}


class BasePlanner(StageActor):
    """Plan: a trajectory through the scene. Adds ``plan``; raises ItemFailed to prune."""

    def plan(self, scene: Scene, seed: int) -> Plan:
        """Return the trajectory, or raise PlanFailed."""
        raise NotImplementedError

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        plan = self.plan(scene_from_wire(item["scene"]), int(item["seed"]))
        return {**item, "plan": plan_to_wire(plan)}


class BaseRenderer(StageActor):
    """Render: every frame of the trajectory. Replaces the scene with ``rgb`` and ``depth``."""

    def render(self, scene: Scene, plan: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(rgb uint8 (T,H,W,3), depth float32 (T,H,W))``."""
        raise NotImplementedError

    def process(self, item: dict[str, Any]) -> dict[str, Any]:
        rgb, depth = self.render(scene_from_wire(item["scene"]), item["plan"])
        return {
            "task_id": item["task_id"],
            "seed": item["seed"],
            "plan": item["plan"],
            "rgb": rgb,
            "depth": depth,
        }


class BaseWriter(StageActor):
    """Store: persist the episode exactly once (commit keyed by task id)."""


class SceneLoader(BaseRandomizer):
    """Procedural indoor scenes with domain randomization (same seed, same scene).

    Args:
        width: image width the scene's camera renders at.
        height: image height.
    """

    @classmethod
    def check_kwargs(cls, kwargs: dict[str, Any]) -> None:
        """An image size that is not positive, before any replica starts."""
        RandomizeConfig(**{k: kwargs[k] for k in ("width", "height") if k in kwargs})

    def __init__(self, width: int = 96, height: int = 72) -> None:
        self.scene_config = SceneConfig()
        self.randomize_config = RandomizeConfig(width=width, height=height)

    def load(self, task_id: str, seed: int) -> Scene:
        return generate_scene(seed, self.scene_config)

    def randomize(self, scene: Scene, seed: int) -> Scene:
        return randomize(scene, seed, self.randomize_config, layout=self.scene_config)


class NavPlanner(BasePlanner):
    """A* on the occupancy grid, shortened by line of sight, sampled at a fixed speed and rate.

    Args:
        fps: frame rate of the trajectory.
        max_frames: the longest episode.
        speed: metres per second.
        min_frames: a shorter episode is pruned; None: 10, or ``max_frames`` if that is less
            (a config that lowered ``max_frames`` below 10 failed every replica's start on a
            bound it could not set).
        min_length: a path shorter than this (metres) is pruned.
    """

    @classmethod
    def check_kwargs(cls, kwargs: dict[str, Any]) -> None:
        """A rate, length or speed that is not positive, or a shortest episode longer than the
        longest, before any replica starts."""
        _at_least(kwargs, "max_frames", 1)
        if kwargs.get("min_frames") is not None:
            _at_least(kwargs, "min_frames", 1)
        for name in ("fps", "speed"):
            if name in kwargs and not kwargs[name] > 0:
                raise ConfigError(f"kwargs.{name} must be > 0, got {kwargs[name]!r}")
        if "min_length" in kwargs and not kwargs["min_length"] >= 0:
            raise ConfigError(f"kwargs.min_length must be >= 0 (metres), got {kwargs['min_length']!r}")
        longest = kwargs.get("max_frames", 60)
        if kwargs.get("min_frames") is not None and kwargs["min_frames"] > longest:
            raise ConfigError(
                f"kwargs.min_frames ({kwargs['min_frames']}) must not exceed max_frames ({longest}): "
                "every episode would be pruned"
            )

    def __init__(
        self,
        fps: int = 10,
        max_frames: int = 60,
        speed: float = 1.0,
        min_frames: int | None = None,
        min_length: float = 1.0,
    ) -> None:
        shortest = min(10, max_frames) if min_frames is None else min_frames
        self.config = PlanConfig(
            fps=fps, max_frames=max_frames, speed=speed, min_frames=shortest, min_length=min_length
        )

    def plan(self, scene: Scene, seed: int) -> Plan:
        return plan_episode(scene, seed, self.config)


class RaycastRenderer(BaseRenderer):
    """Ray casting against the scene's boxes with torch, all frames in one batched call.

    Args:
        device: "cpu", "cuda", or None for the GPU when one is present.
        threads: torch CPU threads for this replica (None leaves torch's default).
    """

    # Imported lazily here (the other stages never pay for torch); a node's template imports
    # them ahead, once, for every replica it forks (``[node] fast_start``).
    preload_modules = ("torch", "troupe.actors.datagen.render")

    @classmethod
    def check_kwargs(cls, kwargs: dict[str, Any]) -> None:
        """A device torch does not know, or a negative thread count, before any replica starts."""
        if kwargs.get("threads") is not None:
            _at_least(kwargs, "threads", 0)  # 0: torch's default, as None
        device = kwargs.get("device")
        if device is not None:
            import torch  # the template has it already (preload_modules)

            try:
                torch.device(device)
            except RuntimeError as exc:
                raise ConfigError(f"kwargs.device = {device!r}: {exc}") from None

    def __init__(self, device: str | None = None, threads: int | None = 1) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        from troupe.models.raycast import default_device

        self.device = device or default_device()

    def render(self, scene: Scene, plan: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        from .render import render_plan

        # Under a runtime (a replica), each batch of frames is progress: a long episode at a
        # real size must not read as a hang to the supervisor.
        runtime = getattr(self, "runtime", None)
        on_frames = None if runtime is None else (lambda n: runtime.progress(n, "frames rendered"))
        return render_plan(scene, plan_from_wire(plan), self.device, on_frames=on_frames)


class LeRobotWriter(BaseWriter):
    """Writes episodes on background threads, committed exactly once per task id; at the end
    of the run, writes every committed episode as one LeRobot v3.0 dataset.

    Its hooks: ``start`` takes the dataset's folder (``dataset_root``: a ``dataset`` other than
    the run's out must be new, empty, or this store's), clears what a writer killed mid-episode
    left (and, for a fresh run, every episode) and names the episodes committed already, which
    the run keeps (every one: an episode that earlier runs made and is gone now is made again);
    ``finalize`` writes the dataset (``finalize_dataset``) into ``dataset`` or the run's out.

    Args:
        store: directory of the OutputStore the episodes are committed to.
        max_pending: episodes queued to the writer threads before ``process`` waits.
        threads: writer threads.
        dataset: where the dataset is written (default: the run's output directory); a relative
            path is taken from the run's output directory.
        fps: the dataset's frame rate (default: that of the episodes).
        robot_type: recorded in the dataset's info.json.
    """

    mailbox_capacity = 4
    # What only finalize reads: a rerun with one changed writes the dataset again, not refused.
    finalize_kwargs = ("dataset", "fps", "robot_type")

    @classmethod
    def check_kwargs(cls, kwargs: dict[str, Any]) -> None:
        """No room for an episode, no thread to write it, or no frame rate, before any replica starts."""
        _at_least(kwargs, "max_pending", 1)
        _at_least(kwargs, "threads", 1)
        if kwargs.get("fps") is not None:
            _at_least(kwargs, "fps", 1)

    @classmethod
    def check_stages(cls, kwargs: dict[str, Any], others: dict[str, tuple[type, dict[str, Any]]]) -> None:
        """A dataset frame rate that is not that of the planner's episodes: finalize would refuse
        every one of them, once they were all made."""
        fps = kwargs.get("fps")
        if fps is None:
            return
        for name, (other, given) in others.items():
            planned = _planned_fps(other, given)
            if planned is not None and planned != fps:
                raise ConfigError(
                    f"kwargs.fps = {fps!r}, but stage {name} plans its episodes at {planned} fps, and "
                    f"a dataset has one rate: leave fps out (the episodes' rate is taken) or give {planned}"
                )

    def __init__(
        self,
        store: str,
        max_pending: int = 2,
        threads: int = 1,
        dataset: str | None = None,
        fps: int | None = None,
        robot_type: str = "troupe_nav_camera",
    ) -> None:
        self.store = OutputStore(Path(store))
        self.writer = AsyncWriter(
            self.store, max_pending=max_pending, threads=threads, config=EpisodeConfig()
        )
        # The dataset's files, written as the episodes commit: finalize has less left to do.
        mb = 1 << 20
        self.drafts = DatasetDrafts(
            self.store.root / DRAFTS_DIR, int(VIDEO_FILES_SIZE_IN_MB * mb), int(DATA_FILES_SIZE_IN_MB * mb)
        )
        self.dataset = dataset
        self.fps = fps
        self.robot_type = robot_type

    start_lists_every_output = True

    def start(self, run: StageRun) -> list[str]:
        """Before any item: no writer is writing, so what is staged is a dead writer's. An
        episode damaged since its commit (a file cut short or deleted) is set aside, under
        the store's ``.damaged/``, and left out of the list: the run makes it again, and says
        so, rather than every finalize failing on it. A dataset folder that is not this store's
        is refused here, before any item runs, not replaced as the run ends."""
        root = dataset_root(self.dataset, run.out)
        if root is not None:
            claim_dataset_root(root, self.store.root, run.out)
        if run.fresh:
            self.store.clear()
        self.store.sweep_staging()
        clear_stale(self.drafts.folder)
        self.drafts.expect(run.task_ids())  # drafted as they come, none held back at the end
        committed = []
        for task_id in self.store.committed():
            damage = self.store.damage(task_id)
            if damage is None:
                committed.append(task_id)
                continue
            aside = self.store.set_aside(task_id)
            log.warning("episode_damaged", task_id=task_id, damage=damage, set_aside=str(aside))
        return committed

    def committed_among(self, task_ids: list[str]) -> list[str]:
        """Those of ``task_ids`` whose episode is committed (whole): a replica that committed
        one and died before it answered left it in the dataset, and the run counts it ok rather
        than dead or made again (``pipeline/committed_check.py``)."""
        return [t for t in task_ids if self.store.is_committed(t) and self.store.damage(t) is None]

    def finalize(self, run: StageRun) -> dict[str, Any]:
        """Write the dataset over the committed episodes of the run's items; say what it holds,
        and name a committed episode of no item of the run (another run's, copied in), left
        out: it had gone into the dataset, of a config this run's record does not name."""
        from troupe.actors.lerobot.finalize import DatasetConfig, episode_fps, finalize_dataset
        from troupe.actors.lerobot.published import published_task_ids, renumbered

        root = dataset_root(self.dataset, run.out)
        if root is None:
            raise ConfigError(
                f"stage {run.stage}: LeRobotWriter has nowhere to write the dataset; give the run "
                "an out directory or the stage a dataset kwarg"
            )
        ours = frozenset(run.task_ids())
        fps = self.fps or episode_fps(self.store, ours) or 10
        published = published_task_ids(root)
        summary = finalize_dataset(
            self.store, root, DatasetConfig(fps=fps, robot_type=self.robot_type), self.drafts, ours
        )
        said = (
            f"dataset: {summary.total_episodes} episodes, {summary.total_frames} frames, "
            f"LeRobot v3.0 at {summary.root}"
        )
        moved = renumbered(published, summary.task_ids)
        if moved:
            said += (
                f"; {moved} of the {len(published)} episodes published there before have new indices "
                "(episodes are numbered in task id order: those made since took their places among "
                "them), so a split or episodes=[...] by index names other episodes now"
            )
        if summary.strays:
            shown = ", ".join(summary.strays[:3]) + (
                f" and {len(summary.strays) - 3} more" if len(summary.strays) > 3 else ""
            )
            said += (
                f"; left out {len(summary.strays)} committed episode(s) in {self.store.committed_dir} "
                f"that are no item of this run ({run.items} items): {shown}"
            )
        return {
            "episodes": summary.total_episodes,
            "frames": summary.total_frames,
            "root": str(summary.root),
            "outputs": [str(path) for path in summary.files],
            **({"left_out": list(summary.strays)} if summary.strays else {}),
            **({"renumbered": moved} if moved else {}),
            "summary": said,
        }

    async def process(self, item: dict[str, Any]) -> dict[str, Any]:
        plan = item["plan"]
        episode = EpisodeData(
            task_id=item["task_id"],
            task=TASK_TEXT,
            fps=int(plan["fps"]),
            rgb=np.asarray(item["rgb"]),
            depth=np.asarray(item["depth"], dtype=np.float32),
            ego=np.asarray(plan["actions"], dtype=np.float32),
            extra={"seed": int(item["seed"])},
        )
        future = await self.writer.submit_async(episode)
        committed = (
            await asyncio.wrap_future(future) if not isinstance(future, asyncio.Future) else await future
        )
        if committed:
            self.drafts.committed(item["task_id"], self.store.committed_path(item["task_id"]))
        return {"task_id": item["task_id"], "frames": int(episode.rgb.shape[0]), "committed": bool(committed)}

    async def stopping(self) -> None:
        self.writer.close(timeout=60)
        self.drafts.close()


def _planned_fps(cls: type, kwargs: dict[str, Any]) -> Any:
    """The frame rate a planner stage of class ``cls`` makes its episodes at, from its kwargs or
    its constructor's default; None for a stage that is no planner or takes no ``fps``."""
    if not issubclass(cls, BasePlanner):
        return None
    if "fps" in kwargs:
        return kwargs["fps"]
    param = inspect.signature(cls).parameters.get("fps")
    return None if param is None or param.default is param.empty else param.default


def _at_least(kwargs: dict[str, Any], name: str, least: int) -> None:
    if name in kwargs and isinstance(kwargs[name], bool):  # a TOML true ran as 1
        raise ConfigError(f"kwargs.{name} must be a whole number, got {kwargs[name]!r}")
    if name in kwargs and not kwargs[name] >= least:
        raise ConfigError(f"kwargs.{name} must be at least {least}, got {kwargs[name]!r}")
