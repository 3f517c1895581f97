"""The README's "Your own pipeline" example is the one in docs/examples/own_pipeline, and it works
as the README says: its own test passes, and `troupe run` runs it from its folder."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "own_pipeline"


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Your own pipeline")
    return text[start : text.index("\n## ", start + 1)]


@pytest.mark.parametrize(
    ("lang", "name"), [("python", "stages.py"), ("toml", "pipeline.toml"), ("python", "test_stages.py")]
)
def test_the_readme_shows_the_example_files_as_they_are(lang: str, name: str) -> None:
    blocks = re.findall(rf"```{lang}\n(.*?)```", _readme_section(), re.S)
    assert (EXAMPLE / name).read_text(encoding="utf-8") in blocks


@pytest.mark.timeout(300)
def test_the_examples_own_test_passes_with_the_plugin(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_stages.py",
            "--basetemp",
            str(tmp_path / "t"),
        ],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=280,
        # A user's own run: not one of this suite's xdist workers (PYTEST_XDIST_WORKER...).
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout


@pytest.mark.timeout(300)
def test_troupe_run_runs_the_example_from_its_folder_and_reports_json(tmp_path: Path) -> None:
    work = tmp_path / "mine"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__", "test_*"))
    run = [sys.executable, "-m", "troupe.cli.main", "run", "pipeline.toml", "--items", "12", "--out", "out"]
    done = subprocess.run([*run, "--json"], cwd=work, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures = json.loads(done.stdout)
    assert figures["items"]["ok"] + figures["items"]["pruned"] == 12
    assert set(figures["stages"]) == {"generate", "smooth", "store"}
    assert figures["finals"]["store"]["summary"].startswith(f"{figures['items']['ok']} signals in ")
    index = json.loads((work / "out" / "signals" / "index.json").read_text())
    assert len(index["items"]) == figures["items"]["ok"]

    again = subprocess.run(run, cwd=work, capture_output=True, text=True, timeout=280)
    assert again.returncode == 0, again.stderr
    assert "already complete:" in again.stdout and "signals in" in again.stdout


@pytest.mark.timeout(300)
def test_troupe_run_finds_the_stages_in_its_folder_with_pythonsafepath_set(tmp_path: Path) -> None:
    """``PYTHONSAFEPATH=1`` keeps ``python -m`` from putting the current folder on the path of
    the processes troupe starts: the example was refused as 'No module named stages', looked for
    in the folder that held stages.py. ev 12"""
    work = tmp_path / "mine"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__", "test_*"))
    run = [sys.executable, "-m", "troupe.cli.main", "run", "pipeline.toml", "--items", "4", "--out", "out"]
    env = dict(os.environ, PYTHONSAFEPATH="1")
    done = subprocess.run(run, cwd=work, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(json.loads((work / "out" / "signals" / "index.json").read_text())["items"]) >= 1


@pytest.mark.timeout(300)
def test_troupe_run_imports_the_installed_packages_not_their_names_in_its_folder(tmp_path: Path) -> None:
    """A scratch ``msgpack.py`` or ``torch.py`` beside stages.py: the processes troupe starts put
    the folder first (``python -m``), so it ran in every worker, which failed deep in troupe
    ('module msgpack has no attribute Packer'). Its stages still import from there. ev 5"""
    work = tmp_path / "mine"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__", "test_*"))
    for name in ("msgpack", "torch"):
        (work / f"{name}.py").write_text(f"raise SystemExit('the scratch {name}.py ran')\n")
    # -P: as the console script, which has its own folder on its path, not this one
    run = [
        sys.executable,
        "-P",
        "-m",
        "troupe.cli.main",
        "run",
        "pipeline.toml",
        "--items",
        "4",
        "--out",
        "out",
    ]
    done = subprocess.run(run, cwd=work, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "scratch" not in done.stdout + done.stderr
    assert len(json.loads((work / "out" / "signals" / "index.json").read_text())["items"]) >= 1


@pytest.mark.timeout(300)
def test_fresh_drops_what_the_examples_earlier_runs_stored(tmp_path: Path) -> None:
    """``--fresh`` starts anew: the example's ``Store.start`` listed every .npy as kept, so a
    fresh run after a changed ``window`` ran nothing (``kept`` all) and left the old signals,
    and those of items the new run does not have (ap 4). Run twice with --fresh: the second
    run's items are made again, with its window, and nothing else is left in the folder."""
    work = tmp_path / "mine"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("__pycache__", "test_*"))
    base = [sys.executable, "-m", "troupe.cli.main", "run", "pipeline.toml", "--out", "out", "--json"]
    first = subprocess.run(
        [*base, "--items", "8", "--fresh"], cwd=work, capture_output=True, text=True, timeout=280
    )
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    toml = work / "pipeline.toml"
    toml.write_text(toml.read_text(encoding="utf-8").replace("window = 32", "window = 8"), encoding="utf-8")

    again = subprocess.run(
        [*base, "--items", "4", "--fresh"], cwd=work, capture_output=True, text=True, timeout=280
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    figures = json.loads(again.stdout)["items"]
    assert figures["kept"] == 0 and figures["ok"] + figures["pruned"] == 4, figures
    signals = work / "out" / "signals"
    stored = sorted(p.stem for p in signals.glob("*.npy"))
    assert stored == json.loads((signals / "index.json").read_text())["items"]
    assert len(stored) == figures["ok"], "the first run's items 4-7 are gone"
    assert _smoothed(work, stored[0], window=8).tolist() == np.load(signals / f"{stored[0]}.npy").tolist()


def _smoothed(work: Path, task_id: str, window: int) -> np.ndarray:
    """What the example's Generate and Smooth make of ``task_id`` with ``window``."""
    spec = importlib.util.spec_from_file_location("own_pipeline_stages", work / "stages.py")
    assert spec is not None and spec.loader is not None
    stages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stages)
    item = {"task_id": task_id, "seed": int(task_id.rsplit("-", 1)[1])}
    return stages.Smooth(window=window).process(stages.Generate().process(item))["smooth"]
