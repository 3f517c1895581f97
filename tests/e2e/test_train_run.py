"""``troupe run configs/train.toml`` end to end on a tiny dataset: progress, loss and samples/s,
checkpoints, ``--json``, a second run that resumes, ``--fresh``, bad input refused in one line,
and the shipped configs valid.

Each run is a real one-host cluster (a node, encoder actor workers, a trainer rank worker) on a
test copy of the shipped config, shrunk to run in seconds.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from support.cli_session import troupe_in_session
from support.clip_data import write_run
from support.train_run_cli import CONFIGS, config_copy, run_cli
from troupe.actors.training.checkpoint import COMMITTED
from troupe.actors.training.train_config import load_train_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JSON_KEYS = {"steps", "loss", "losses", "samples_per_s", "timings", "requests", "restarts", "checkpoints",
             "placement", "wall_s", "latent_cache", "steps_this_run"}  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A troupe run's folder with four committed episodes of 24 frames."""
    root = tmp_path_factory.mktemp("dataset")
    write_run(root, {f"ep{i}": 24 for i in range(4)})
    return root


def _committed(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob("step-*") if (p / COMMITTED).is_file())


def test_every_shipped_train_config_loads() -> None:
    for path in sorted(CONFIGS.glob("*.toml")):
        if "[train]" in path.read_text(encoding="utf-8"):
            cfg = load_train_config(path)
            assert cfg.encoders.count >= 1 and cfg.trainers.ranks >= 1, path
    assert load_train_config(CONFIGS / "datagen-train.toml").datagen is not None


def test_train_toml_trains_prints_loss_and_rate_and_writes_checkpoints(tmp_path: Path, dataset: Path) -> None:
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out))
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert "loss at step 1 / 6" in stdout and "samples/s" in stdout, stdout
    assert "requests to train-encode-0" in stdout and "requests to train-encode-1" in stdout, stdout
    assert "trained 6 steps" in stdout, stdout
    assert _committed(out) == ["step-000000003", "step-000000006"]
    # The run's log is its record (lc 6: it said nothing of the training).
    lines = (out / "logs" / "local.jsonl").read_text(encoding="utf-8").splitlines()
    events = [e for e in map(json.loads, lines) if e["event"].startswith("train_")]
    named = {e["event"]: e for e in events}
    assert (named["train_started"]["steps"], named["train_started"]["resumed_from"]) == (6, None), named
    committed = [e["step"] for e in events if e["event"] == "train_checkpoint_committed"]
    assert committed == [3, 6], events  # each one, however the polls fell (tr 2: 3 could be left out)
    assert named["train_progress"]["step"] == 6 and named["train_progress"]["loss"] is not None
    assert (named["train_finished"]["step"], named["train_finished"]["steps_this_run"]) == (6, 6)
    assert any(e["event"] == "train_said" and e["line"].startswith("placing ") for e in events)


def test_json_keys_then_a_second_run_resumes_and_fresh_starts_over(tmp_path: Path, dataset: Path) -> None:
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), "--json", "--steps", "3")
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    first = json.loads(stdout)
    assert set(first) >= JSON_KEYS, sorted(first)
    assert first["steps"] == first["steps_this_run"] == 3 and len(first["losses"]) == 3
    assert first["restarts"] == 0
    assert first["loss"] == first["losses"][-1]
    assert first["samples_per_s"] > 0
    assert set(first["timings"]["0"]) == {"read_s", "wait_s", "train_s"}
    assert set(first["requests"]) == {"train-encode-0", "train-encode-1"}
    assert all(n > 0 for n in first["requests"].values()), first["requests"]
    assert set(first["placement"]) == {"train-encode-0", "train-encode-1", "train-rank-0"}
    assert set(first["placement"].values()) == {"local"}
    assert [Path(c).name for c in first["checkpoints"]] == ["step-000000003"]
    assert first["resumed_from"] is None
    cache = first["latent_cache"]  # asked of the encoder actors before they stopped
    assert cache["groups_encoded"] > 0 and cache["misses"] >= cache["groups_encoded"], cache
    assert cache["partial"] is False and cache["corrupt"] == 0, cache
    assert {"disk_writes", "disk_writes_skipped", "disk_errors"} <= set(cache), cache  # the writes too

    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), "--steps", "6")
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert "resuming from step 3" in stdout, stdout
    assert "trained 3 steps (4-6, resumed from step 3)" in stdout, stdout  # not "trained 6 steps"
    assert "loss at step 4 / 6" in stdout, stdout
    assert _committed(out) == ["step-000000003", "step-000000006"]

    # Trained that far already: said, and nothing starts (it printed "0.00 samples/s", or 12/3).
    for n in ("6", "4"):
        code, stdout, stderr = run_cli("run", str(config), "--out", str(out), "--steps", n)
        assert code == 0, stdout[-3000:] + stderr[-3000:]
        assert "already complete:" in stdout and "step-000000006 is step 6" in stdout, stdout

    code, stdout, stderr = run_cli("run", str(config), "--out", str(out), "--json", "--steps", "3", "--fresh")
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    again = json.loads(stdout)
    assert again["resumed_from"] is None and len(again["losses"]) == 3
    assert again["losses"] == first["losses"]  # same seeds, started over: the same steps
    assert _committed(out) == ["step-000000003"]
    assert (tmp_path / "train.toml").is_file() and dataset.is_dir()  # --fresh deletes only the run's


def test_missing_dataset_says_to_generate_it_first(tmp_path: Path) -> None:
    missing = tmp_path / "no-data"
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(missing)}})
    code, stdout, stderr = run_cli("run", str(config), "--out", str(tmp_path / "out"), timeout=120)
    assert code == 2, stdout + stderr
    assert "train.dataset" in stderr and "troupe run configs/datagen.toml --out" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stdout == "", stdout  # refused before the progress bar showed
    assert not (tmp_path / "out").exists()


def test_bad_field_is_one_line_naming_it(tmp_path: Path, dataset: Path) -> None:
    config = config_copy(
        tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset), "batch_size": -1}}
    )
    code, stdout, stderr = run_cli("run", str(config), "--out", str(tmp_path / "out"), timeout=120)
    assert code == 2, stdout + stderr
    assert "train.batch_size" in stderr and "-1" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


def test_steps_only_for_training_and_out_not_the_dataset(tmp_path: Path, dataset: Path) -> None:
    pipeline = str(CONFIGS / "datagen.toml")
    code, _, stderr = run_cli("run", pipeline, "--out", str(tmp_path / "o"), "--steps", "3")
    assert code == 2 and "--steps 3" in stderr, stderr
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})
    code, _, stderr = run_cli("run", str(config), "--out", str(dataset))
    assert code == 2 and "--out" in stderr and "dataset" in stderr, stderr
    # The pipeline's cluster options are refused, not ignored (it trained locally).
    for option in (["--cluster", "tcp://127.0.0.1:9"], ["--nodes", "2"]):
        code, _, stderr = run_cli("run", str(config), "--out", str(tmp_path / "o"), *option, timeout=120)
        assert code == 2 and f"{option[0]}: a training run does not take it" in stderr, stderr
    # A broken file is reported as such, --steps or not: it may be the training config meant.
    broken = tmp_path / "broken.toml"
    broken.write_text('[train]\ndataset = "x"\nsteps = = 3\n', encoding="utf-8")
    code, _, stderr = run_cli("run", str(broken), "--out", str(tmp_path / "o"), "--steps", "3")
    assert code == 2 and "not valid TOML" in stderr and "line 3" in stderr, stderr
    assert "--steps" not in stderr, stderr
    # Bytes that are not UTF-8 text: one line, with --steps or without (a traceback before).
    broken.write_bytes(b'[train]\ndataset = "x"\n\xff\xfe\n')
    for steps in ([], ["--steps", "3"]):
        code, _, stderr = run_cli("run", str(broken), "--out", str(tmp_path / "o"), *steps)
        assert code == 2 and stderr.startswith(f"error: {broken}: not UTF-8 text"), stderr
        assert len(stderr.strip().splitlines()) == 1, stderr


def test_a_second_run_at_once_takes_a_free_port_when_the_default_is_taken(
    tmp_path: Path, dataset: Path
) -> None:
    """The default node endpoint held (by another troupe run, here a bare socket): the run takes
    a free port and says so on stderr, as a pipeline's run does; it was refused, exit 2."""
    config = config_copy(tmp_path / "train.toml", "train.toml", {"train": {"dataset": str(dataset)}})
    holder = socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 7479))  # RUN_NODE_ENDPOINT's port
        holder.listen()
    except OSError:
        pass  # held already: the case under test all the same
    try:
        done = troupe_in_session(
            "run", str(config), "--out", str(tmp_path / "out"), "--steps", "1", timeout=600
        )
    finally:
        holder.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the default endpoint is taken" in done.stderr, done.stderr
    assert "trained 1 steps" in done.stdout, done.stdout
