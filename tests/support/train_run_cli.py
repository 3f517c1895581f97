"""Helpers of the ``troupe run TRAIN.toml`` tests: test copies of the shipped configs, shrunk to
run in seconds, a tiny dataset, and the CLI in a subprocess whose every process is reaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from troupe.runtime.pipeline.config import load_pipeline
from troupe.runtime.pipeline.run_dir import RunDir
from troupe.runtime.pipeline.run_fingerprint import fingerprint
from troupe.runtime.testing.plugin import free_endpoint, reap

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

SMALL: dict[str, dict[str, Any]] = {
    "train": {"steps": 6, "batch_size": 2, "clip_frames": 4, "size": [16, 16], "warmup_steps": 0,
              "checkpoint_every": 3, "inflight": 2, "group_size": 1},
    "model": {"d_model": 32, "layers": 1, "heads": 2},
    "encoders": {"encoder_kwargs": {"base_channels": 4, "frames": 4, "seed": 0}, "memory_mb": 8.0,
                 "disk_mb": 16.0},
}  # fmt: skip


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    return repr(v)


def dump_toml(data: dict[str, dict[str, Any]]) -> str:
    """Tables of scalars, lists and inline tables, as TOML."""
    return "".join(
        f"[{name}]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in table.items()) + "\n"
        for name, table in data.items()
    )


def config_copy(
    dest: Path, shipped: str, changes: dict[str, dict[str, Any]] | None = None, small: bool = True
) -> Path:
    """A copy of ``configs/<shipped>`` at ``dest``, shrunk (``small``), with ``changes`` applied."""
    data = tomllib.loads((CONFIGS / shipped).read_text(encoding="utf-8"))
    for layer in ((SMALL if small else {}), changes or {}):
        for table, values in layer.items():
            data.setdefault(table, {}).update(values)
    if "datagen" in data:  # relative to the copy's folder: point at the shipped pipeline
        data["datagen"]["pipeline"] = str(CONFIGS / Path(data["datagen"]["pipeline"]).name)
    dest.write_text(dump_toml(data), encoding="utf-8")
    return dest


def datagen_made(dataset: Path, items: int) -> None:
    """``dataset`` as configs/datagen.toml's run of ``items`` items left it, one episode committed."""
    RunDir(dataset).prepare(fingerprint(load_pipeline(CONFIGS / "datagen.toml", items=items)), fresh=False)
    episode = dataset / ".troupe" / "episodes" / "committed" / "ep-0"
    episode.mkdir(parents=True)
    (episode / "frames.parquet").write_bytes(b"x")


@contextmanager
def troupe(*args: str, cwd: Path | None = None) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``troupe ARGS --endpoint E`` running; yields it and its node's endpoint E; reaped after."""
    endpoint = free_endpoint()
    command = [sys.executable, "-m", "troupe.cli.main", *args, "--endpoint", endpoint]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
    )
    seen: list[psutil.Process] = []
    try:
        yield proc, endpoint
    finally:
        try:
            seen += psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        survivors = reap(proc, seen)  # type: ignore[arg-type]
        assert not survivors, f"left behind: {survivors}"


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str, str]:
    """Wait for the command (bounded); its status, stdout and stderr."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run_cli(*args: str, timeout: float = 600) -> tuple[int, str, str]:
    """``troupe ARGS`` to the end."""
    with troupe(*args) as (proc, _):
        return finish(proc, timeout)
