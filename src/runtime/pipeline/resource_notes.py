"""What a run on one node says of the resources its stages ask: there they place nothing.

On a cluster, a stage's ``resources`` place its replicas: only a node with every tag and at
least ``cpu`` CPUs and ``gpu`` GPUs takes one (``placement.fits``). A run's own node takes every
replica whatever it asks, so that a config written for a cluster runs unchanged on a laptop; a
``gpu = 1`` stage on a host without a CUDA device then ran on the CPU without a word (as torch
code must, it picks CUDA only where torch has it). Such a run now says so once, as it starts,
and goes on.

Whether CUDA is there is asked without importing torch (the runtime imports none, and the run
would wait seconds for it): the GPUs CUDA lets this host's processes use
(``CUDA_VISIBLE_DEVICES``, else the NVIDIA driver's list: ``master_link.count_gpus``), and the
installed torch's build, whose local version label says a CPU-only wheel (``2.13.0+cpu``).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable

import psutil

from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.master_link import count_gpus

from .config import PipelineConfig

__all__ = ["host_cpus", "no_cuda_reason", "resource_notes", "warn_of_resources"]

log = get_logger(__name__)


def warn_of_resources(cfg: PipelineConfig, on_warning: Callable[[str], None] | None) -> None:
    """Log each of :func:`resource_notes` for this host, and tell ``on_warning`` its line."""
    asked_gpu = any(s.resources.gpu >= 1 for s in cfg.stages)
    for line in resource_notes(cfg, host_cpus(), no_cuda_reason() if asked_gpu else None):
        log.warning("stage_resources_not_here", detail=line)
        if on_warning is not None:
            on_warning(line)


def resource_notes(cfg: PipelineConfig, cpus: int, no_cuda: str | None) -> list[str]:
    """A line for each stage that asks more than this host has, for a run on its own node.

    Args:
        cfg: the pipeline.
        cpus: this host's CPUs.
        no_cuda: why torch sees no CUDA device here (:func:`no_cuda_reason`); None: it may.
    """
    notes = []
    for stage in cfg.stages:
        res = stage.resources
        if res.gpu >= 1 and no_cuda is not None:
            notes.append(
                f"stages.{stage.name} asks gpu = {res.gpu}, but torch sees no CUDA device here "
                f"({no_cuda}): it runs on the CPU (on one host, resources place nothing)"
            )
        if res.cpu > cpus:
            notes.append(
                f"stages.{stage.name} asks cpu = {res.cpu:g}, but this host has {cpus} CPU(s): "
                "its replicas share them (on one host, resources place nothing)"
            )
    return notes


def no_cuda_reason() -> str | None:
    """Why torch can see no CUDA device on this host, or None where it may (see the module)."""
    if count_gpus() == 0:
        masked = os.environ.get("CUDA_VISIBLE_DEVICES") is not None
        return "CUDA_VISIBLE_DEVICES names none" if masked else "the NVIDIA driver lists no GPU"
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    if version.partition("+")[2] == "cpu":
        return f"torch {version} is built without CUDA"
    return None


def host_cpus() -> int:
    """This host's CPUs, as a node's beat counts them for a cluster's placement."""
    return psutil.cpu_count() or 1
