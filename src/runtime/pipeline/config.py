"""Pipeline declarations: a graph of stages in a TOML file, validated once.

::

    [pipeline]
    name = "indoor-nav"
    items = 64            # tasks: seeds seed_start .. seed_start + items - 1
    seed_start = 0
    slots = 4             # replica budget the scheduler may distribute (default, and least: sum of replicas)
    data_plane = "direct" # outputs go replica to replica ("engine": through the engine process)
    inline_below = 4096   # outputs smaller than this many bytes still go inline through the engine
    max_message_mb = 256  # the replicas' and the engine's message bound, for large items

    [[stages]]
    name = "plan"
    actor = "troupe.actors.datagen.lifecycle:NavPlanner"
    replicas = 1          # at start
    min_replicas = 1
    max_replicas = 3
    batch = 1             # items per call
    inflight = 2          # calls in flight per replica: the next is waiting when one ends
    queue = 8             # bound of this stage's input queue
    resources = { cpu = 1, gpu = 0, tags = [] }  # on a cluster: nodes with them (placement.fits)
    kwargs = { }          # constructor arguments

Stages form a chain in file order unless a stage names its input with ``after``. ``{out}`` in a
string kwarg stands for the run's output directory (:meth:`PipelineConfig.with_out`).
Counts are strict integers (``replicas = "2"`` is refused, not read as 2).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictFloat, StrictInt, ValidationError, model_validator

from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import (
    MAX_MESSAGE_MB,
    MAX_NAME,
    MIN_MESSAGE_MB,
    Duration,
    _Frozen,
    read_toml,
    validation_message,
)
from troupe.runtime.tasks.jobspec import MAX_COUNT

from .handoff import INLINE_BELOW

__all__ = ["PipelineConfig", "Resources", "StageConfig", "load_pipeline"]


class Resources(_Frozen):
    """What one replica of a stage needs of its node. On a cluster run a replica goes only to a
    node with every tag and at least ``cpu`` CPUs and ``gpu`` GPUs; none is reserved. On a run's
    own node they place nothing: a need the host lacks is said as the run starts
    (``resource_notes``)."""

    cpu: StrictFloat = Field(default=1.0, ge=0)
    gpu: StrictInt = Field(default=0, ge=0)
    # On a cluster run, only nodes carrying every one of these tags ([node] tags) run the stage.
    tags: tuple[str, ...] = ()


class StageConfig(_Frozen):
    """One stage: its actor class and how it scales."""

    name: str = Field(min_length=1, max_length=MAX_NAME, pattern=r"^[A-Za-z0-9_\-]+$")
    actor: str = Field(min_length=3)
    replicas: StrictInt = Field(default=1, ge=1)
    min_replicas: StrictInt = Field(default=1, ge=0)
    max_replicas: StrictInt | None = Field(default=None, ge=1)
    batch: StrictInt = Field(default=1, ge=1)
    inflight: StrictInt = Field(default=2, ge=1, le=64)
    queue: StrictInt = Field(default=8, ge=1)
    resources: Resources = Resources()
    kwargs: dict[str, Any] = Field(default_factory=dict)
    after: str | None = None
    # Seconds a replica may work on one call without reporting progress before its node's
    # supervisor kills it as hung (None: the node's own, 30 s; 0: never). The run's own node
    # only: on a cluster, or with --node, that node's [supervision.kinds.STAGE] decides.
    progress_timeout_s: Duration | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> StageConfig:
        top = self.max_replicas if self.max_replicas is not None else self.replicas
        if not self.min_replicas <= self.replicas <= top:
            raise ValueError(
                "need min_replicas <= replicas <= max_replicas, got "
                f"{self.min_replicas} <= {self.replicas} <= {top}"
            )
        return self

    @property
    def most(self) -> int:
        """The largest number of replicas this stage may have."""
        return self.max_replicas if self.max_replicas is not None else self.replicas


class PipelineConfig(_Frozen):
    """A whole pipeline: its stages, the items to run and the replica budget."""

    # The name is also the job name the master knows the items by (jobspec's rule for names).
    name: str = Field(
        default="pipeline", min_length=1, max_length=MAX_NAME, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$"
    )
    items: StrictInt = Field(default=64, ge=1, le=MAX_COUNT)
    seed_start: StrictInt = Field(default=0, ge=-(2**63), le=2**63 - 1 - MAX_COUNT)
    slots: StrictInt | None = Field(default=None, ge=1)
    max_attempts: StrictInt = Field(default=3, ge=1)
    scale_interval_s: Duration = Field(default=0.5, gt=0)
    # "direct": a stage's outputs go from its replica straight to the next stage's (handoff);
    # "engine": every output passes through the engine, as before the direct data plane.
    data_plane: Literal["direct", "engine"] = "direct"
    inline_below: StrictInt = Field(default=INLINE_BELOW, ge=0)  # smaller outputs go inline
    # The replicas' message size bound (MB), over their nodes' max_message_mb, and the engine's
    # process's (``run_cluster.engine_codec``): an output handed to the next stage travels as
    # one message (640x480 RGB-D, 60 frames: ~130 MB).
    max_message_mb: StrictFloat | None = Field(default=None, ge=MIN_MESSAGE_MB, le=MAX_MESSAGE_MB)
    stages: tuple[StageConfig, ...]

    @model_validator(mode="after")
    def _graph(self) -> PipelineConfig:
        if not self.stages:
            raise ValueError("a pipeline needs at least one [[stages]] table")
        for stage in self.stages:
            _no_near_out(stage)
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        for i, stage in enumerate(self.stages):
            if stage.after is not None and stage.after not in names[:i]:
                raise ValueError(f"stages.{stage.name}.after = {stage.after!r} must name an earlier stage")
        self._slots_hold_the_start()
        return self

    def _slots_hold_the_start(self) -> None:
        """Every stage starts with its ``replicas`` whatever the budget, so a ``slots`` below
        their sum was silently exceeded (``slots = 2``: four replicas ran at once)."""
        start = sum(s.replicas for s in self.stages)
        if self.slots is not None and self.slots < start:
            raise ValueError(
                f"pipeline.slots: {self.slots} is fewer than the stages' starting replicas ({start}); "
                f"set slots to {start} or more, or lower a stage's replicas"
            )

    @property
    def slot_budget(self) -> int:
        """Replicas the scheduler may run at once (default: the starting replicas)."""
        return self.slots if self.slots is not None else sum(s.replicas for s in self.stages)

    def with_out(self, out: Path | str) -> PipelineConfig:
        """This pipeline with ``{out}`` in every string of its kwargs replaced by ``out``, in
        lists and tables too (``dirs = ["{out}/a"]`` made a folder named ``{out}`` in the
        current directory, outside --out)."""
        stages = []
        for stage in self.stages:
            kwargs = {k: _with_out(v, str(out)) for k, v in stage.kwargs.items()}
            stages.append(stage.model_copy(update={"kwargs": kwargs}))
        return self.model_copy(update={"stages": tuple(stages)})

    def upstream(self, index: int) -> int | None:
        """Index of the stage feeding stage ``index`` (None for the first)."""
        stage = self.stages[index]
        if stage.after is not None:
            return [s.name for s in self.stages].index(stage.after)
        return index - 1 if index > 0 else None

    def downstream(self, index: int) -> list[int]:
        """Indexes of the stages fed by stage ``index``."""
        return [j for j in range(len(self.stages)) if self.upstream(j) == index]


def load_pipeline(path: Path, **overrides: Any) -> PipelineConfig:
    """Load and validate a pipeline TOML file; ``overrides`` replace [pipeline] fields.

    Raises:
        ConfigError: missing file, bad TOML, or invalid fields (named with the file).
    """
    raw = read_toml(path, "pipeline", {"pipeline"}, {"stages"}, "[pipeline] and [[stages]]")
    data = dict(raw.get("pipeline", {}))
    rename = {key: f"pipeline.{key}" for key in data}  # [pipeline]'s keys sit at the top level
    given = {k: v for k, v in overrides.items() if v is not None}
    data.update(given)
    for key in given:
        rename.pop(key, None)
    data["stages"] = raw.get("stages", [])
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(str(path), exc, data, PipelineConfig, rename)) from None


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _with_out(value: Any, out: str) -> Any:
    """``value`` with ``{out}`` replaced in each of its strings, however deep in lists and tables."""
    if isinstance(value, str):
        return value.replace("{out}", out)
    if isinstance(value, list):
        return [_with_out(v, out) for v in value]
    if isinstance(value, dict):
        return {k: _with_out(v, out) for k, v in value.items()}
    return value


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Each string in ``value`` with its key path (``dirs[1]``, ``paths.c``), however deep."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}")


def _no_near_out(stage: StageConfig) -> None:
    """A string kwarg's ``{outt}`` (``{output}``, ``{ou}``) is a typo of ``{out}``, the one
    placeholder: taken literally, it made a folder named ``{outt}`` in the current directory.
    Strings in lists and tables are looked at too. Other braces (a format string of the
    stage's own, ``frame_{index}.png``) pass."""
    for key, value in stage.kwargs.items():
        for path, text in _strings(value, key):
            for name in _PLACEHOLDER.findall(text):
                if name != "out" and difflib.get_close_matches(name, ["out"], n=1, cutoff=0.6):
                    raise ValueError(
                        f"stages.{stage.name}.kwargs.{path} = {text!r}: {{{name}}} is no placeholder; "
                        "did you mean {out} (the run's --out)?"
                    )
