"""A run on its own node whose stage asks a GPU where torch sees no CUDA device, and more CPUs
than the host has (cf 3: it ran, silent): each is said once, as a warning, as the run starts,
and the run goes on and ends ok. The replicas import ``tests/support/hook_stages.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from troupe.runtime.pipeline import resource_notes
from troupe.runtime.pipeline.runner import run_pipeline_sync
from troupe.runtime.testing.plugin import free_endpoint, import_path

pytestmark = pytest.mark.e2e

PIPELINE = """\
[pipeline]
name = "resources"
items = 2

[[stages]]
name = "render"
actor = "support.hook_stages:EchoStage"
resources = { cpu = 100000, gpu = 1 }
"""


@pytest.fixture(autouse=True)
def workers_import_the_test_stages(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PYTHONPATH", import_path())
    yield


def test_needs_the_host_lacks_are_warned_before_the_run_and_it_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resource_notes, "count_gpus", lambda: 0)  # whatever this host has
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    toml = tmp_path / "resources.toml"
    toml.write_text(PIPELINE, encoding="utf-8")
    events: list[str] = []
    result = run_pipeline_sync(
        toml,
        out=tmp_path / "out",
        node_endpoint=free_endpoint(),
        master_endpoint=free_endpoint(),
        on_warning=events.append,
        on_start=lambda _start: events.append("started"),
    )
    assert result.counts()["ok"] == 2
    *said, last = events
    assert last == "started", "said before the run starts"
    assert [line.split(",")[0] for line in said] == [
        "stages.render asks gpu = 1",
        "stages.render asks cpu = 100000",
    ], said
    assert "torch sees no CUDA device here (the NVIDIA driver lists no GPU): it runs on the CPU" in said[0]
