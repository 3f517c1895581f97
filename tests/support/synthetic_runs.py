"""``troupe run`` of the synthetic pipeline (two ``CostStage`` stages at a millisecond an item) as a
real command, on loopback ports of the suite's range: quick, and every stage ends in the run's
own process tree, reaped by the command itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.port_range import test_endpoint

__all__ = ["synthetic_pipeline", "troupe", "troupe_run"]


def synthetic_pipeline(
    folder: Path, name: str = "synthetic", items: int = 4, plan: str = "cost_s = 0.001"
) -> Path:
    """Write the pipeline ``name`` of ``items`` items to ``folder/NAME.toml``; ``plan``: its first
    stage's kwargs (``cost_s = 0.001, prune_every = 4``, say)."""
    path = folder / f"{name}.toml"
    path.write_text(
        f"""\
[pipeline]
name = "{name}"
items = {items}

[[stages]]
name = "plan"
actor = "troupe.actors.bench.synthetic:CostStage"
kwargs = {{ {plan} }}

[[stages]]
name = "store"
actor = "troupe.actors.bench.synthetic:CostStage"
kwargs = {{ cost_s = 0.001 }}
""",
        encoding="utf-8",
    )
    return path


def troupe(*args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    """``troupe ARGS``, its output captured, on a terminal wide enough that no line wraps."""
    command = [sys.executable, "-m", "troupe.cli.main", *args]
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def troupe_run(
    pipeline: Path, out: Path, *args: str, timeout: float = 200
) -> subprocess.CompletedProcess[str]:
    """``troupe run PIPELINE --out OUT ARGS`` on two free loopback ports."""
    ports = ("--endpoint", test_endpoint(), "--master", test_endpoint())
    return troupe("run", str(pipeline), "--out", str(out), *ports, *args, timeout=timeout)
