"""On a run's own node a stage's resources place nothing: one that asks a GPU where torch sees
no CUDA device, or more CPUs than the host has, is said as the run starts (cf 3: the run was
silent, and a ``gpu = 1`` stage ran on the CPU without a word). Whether CUDA is there is told
without importing torch."""

from __future__ import annotations

import importlib.metadata

import pytest

from troupe.runtime.pipeline import resource_notes as notes
from troupe.runtime.pipeline.config import PipelineConfig


def _pipeline(**resources: object) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "stages": [
                {"name": "load", "actor": "support.hook_stages:EchoStage"},
                {"name": "render", "actor": "support.hook_stages:EchoStage", "resources": resources},
            ]
        }
    )


def test_a_gpu_stage_without_cuda_is_said_in_one_line() -> None:
    (line,) = notes.resource_notes(_pipeline(gpu=1), cpus=2, no_cuda="the NVIDIA driver lists no GPU")
    assert line == (
        "stages.render asks gpu = 1, but torch sees no CUDA device here (the NVIDIA driver lists "
        "no GPU): it runs on the CPU (on one host, resources place nothing)"
    )


def test_more_cpus_than_the_host_has_is_said() -> None:
    (line,) = notes.resource_notes(_pipeline(cpu=1000.0), cpus=2, no_cuda=None)
    assert line.startswith("stages.render asks cpu = 1000, but this host has 2 CPU(s)"), line


def test_needs_the_host_meets_say_nothing() -> None:
    assert notes.resource_notes(_pipeline(cpu=2.0, gpu=1), cpus=2, no_cuda=None) == []
    assert notes.resource_notes(_pipeline(), cpus=1, no_cuda="none") == [], "gpu = 0 needs no CUDA"


@pytest.mark.parametrize(
    ("gpus", "visible", "torch_version", "expected"),
    [
        (0, None, "2.13.0", "the NVIDIA driver lists no GPU"),
        (0, "", "2.13.0", "CUDA_VISIBLE_DEVICES names none"),
        (1, None, "2.13.0+cpu", "torch 2.13.0+cpu is built without CUDA"),
        (1, None, "2.13.0+cu128", None),
        (1, None, "2.13.0", None),
    ],
)
def test_why_torch_sees_no_cuda(
    monkeypatch: pytest.MonkeyPatch, gpus: int, visible: str | None, torch_version: str, expected: str | None
) -> None:
    monkeypatch.setattr(notes, "count_gpus", lambda: gpus)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: torch_version)
    assert notes.no_cuda_reason() == expected


def test_warned_lines_go_to_the_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notes, "no_cuda_reason", lambda: "the NVIDIA driver lists no GPU")
    said: list[str] = []
    notes.warn_of_resources(_pipeline(gpu=2), said.append)
    assert len(said) == 1 and "asks gpu = 2" in said[0], said
    notes.warn_of_resources(_pipeline(gpu=2), None)  # a program without a callback: the log only
