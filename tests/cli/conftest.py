"""Fixtures of the `troupe models` tests: a tiny run folder to train on (``run``), and torch's
thread count put back after a command that sets it in this process (``restore_threads``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from support.clip_data import write_run


@pytest.fixture
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()  # an in-process --threads sets this process's torch threads
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """5 clips of 4 frames (4 for training, 1 held out)."""
    root = tmp_path_factory.mktemp("models") / "run"
    write_run(root, {"ep-a": 12, "ep-b": 10})
    return root
