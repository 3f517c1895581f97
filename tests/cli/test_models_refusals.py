"""``troupe models`` refuses bad input in one stderr line, exit status 2, before anything is
trained or written: an ``--out`` whose folder is a file or under /proc (tracebacks after the
training before), a learning rate that is not finite or absurd (``inf`` wrote a NaN checkpoint),
a ``--size`` or model whose training cannot fit in memory (an out-of-memory traceback), a batch
larger than the training clips; ``info`` of an empty file ("Aborted."), of a file holding a bare
tensor (an IndexError traceback), or of random bytes (torch's advice to load with
weights_only=False, which would run the file's code, was passed on)."""

from __future__ import annotations

import pickle
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from support.cli_session import troupe_in_session
from troupe.cli.commands import vae_checks
from troupe.cli.main import app
from troupe.models.video_vae import VideoVAEConfig

pytestmark = pytest.mark.usefixtures("restore_threads")  # tests/cli/conftest.py

HANG_S = 120  # a guard against a hang only: every refusal here comes before training starts

TINY = ["--clip-frames", "4", "--size", "16x16", "--base-channels", "4", "--batch-size", "2"]
TINY += ["--threads", "1", "--steps", "1"]


def troupe(*args: str) -> subprocess.CompletedProcess[str]:
    return troupe_in_session(*args, timeout=HANG_S)


def files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def assert_refused(code: int, stdout: str, stderr: str, said: str) -> None:
    assert code == 2, (stdout, stderr)
    assert "Traceback" not in stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and said in lines[0], lines[0]
    assert stdout == "", stdout  # refused before training: not even the "training on" line


# --- train-vae --out: checked before the training (it trained, then failed with a traceback) ---


def test_train_vae_refuses_an_out_under_a_file(run: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("keep")
    before = files(tmp_path)
    done = troupe("models", "train-vae", str(run), "--out", str(tmp_path / "afile" / "x.pt"), *TINY)
    assert_refused(done.returncode, done.stdout, done.stderr, "afile: is a file, not a directory")
    assert files(tmp_path) == before and (tmp_path / "afile").read_text() == "keep"


def test_train_vae_refuses_an_out_under_proc(run: Path, tmp_path: Path) -> None:
    before = files(run)
    done = troupe("models", "train-vae", str(run), "--out", "/proc/x.pt", *TINY)
    assert_refused(done.returncode, done.stdout, done.stderr, "/proc is a kernel file system")
    assert not Path("/proc/x.pt").exists() and files(run) == before


# --- train-vae's numbers (in process, as tests/cli/test_models_command.py runs the command) ---


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--lr", "inf"], "--lr inf: expected a finite learning rate > 0 and at most 10"),
        (["--lr", "nan"], "--lr nan: expected a finite learning rate > 0 and at most 10"),
        (["--lr", "1e300"], "--lr 1e+300: expected a finite learning rate > 0 and at most 10"),
        (["--lr", "0"], "--lr 0.0: expected a finite learning rate > 0"),
        (["--size", "100000x100000"], "--size 100000x100000: each side must be at most 4096"),
        (
            ["--size", "4096x4096", "--clip-frames", "64", "--batch-size", "4", "--base-channels", "4096"],
            "training on 4 clips of 64 frames of 4096x4096 with --base-channels 4096 needs at least",
        ),
        (["--batch-size", "1000"], "--batch-size 1000: more than the 4 clips DATA has for training"),
        (["--batch-size", "5"], "--batch-size 5: more than the 4 clips DATA has for training (5 in all"),
        (["--seed", str(2**64)], f"--seed {2**64}: expected an integer from"),
        (["--threads", "100000"], "--threads 100000: expected at most 1024"),
        (["--base-channels", "100000"], "--base-channels 100000: expected at most 4096"),
        (["--size", "18x16"], "clips of 4 frames of 18x16 do not fit the VAE (video height=18"),
    ],
)
def test_train_vae_refuses_a_bad_number(run: Path, tmp_path: Path, option: list[str], said: str) -> None:
    out = tmp_path / "vae.pt"
    before = files(run)
    result = CliRunner().invoke(app, ["models", "train-vae", str(run), "--out", str(out), *TINY, *option])
    assert isinstance(result.exception, SystemExit), result.exception
    assert_refused(result.exit_code, result.stdout, result.stderr, said)
    assert list(tmp_path.iterdir()) == [] and files(run) == before


def test_train_vae_refuses_a_disk_without_room_for_the_checkpoint(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint's size is known from the model's parameters: on a nearly full disk it trained
    every step, then failed with torch's 'unexpected pos 109376 vs 109264'."""
    need = vae_checks.checkpoint_bytes(VideoVAEConfig(base_channels=4, latent_channels=4, frames=4))
    usage = SimpleNamespace(total=1 << 30, used=1 << 30, free=need - 1)
    monkeypatch.setattr(vae_checks.shutil, "disk_usage", lambda _: usage)
    out = tmp_path / "vae.pt"
    result = CliRunner().invoke(app, ["models", "train-vae", str(run), "--out", str(out), *TINY])
    assert isinstance(result.exception, SystemExit), result.exception
    said = f"--out {out}: the disk holding it has {(need - 1) / 2**20:.2f} MiB free, less than the"
    assert_refused(result.exit_code, result.stdout, result.stderr, said)
    assert list(tmp_path.iterdir()) == []


def test_the_checkpoint_size_is_what_a_save_writes_or_more(tmp_path: Path) -> None:
    from troupe.models.video_vae import VideoVAE

    config = VideoVAEConfig(base_channels=8, latent_channels=4, frames=8)
    VideoVAE(config).save(tmp_path / "v.pt")
    written = (tmp_path / "v.pt").stat().st_size
    assert written <= vae_checks.checkpoint_bytes(config) <= written + (1 << 20)


# --- info: one line saying why the file is no checkpoint ---


def write_bytes(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 4)


def write_pickle(path: Path) -> None:
    path.write_bytes(pickle.dumps({"a": 1}, protocol=4))  # torch warned on stderr about protocol 4


@pytest.mark.parametrize(
    ("write", "said"),
    [
        (lambda p: p.write_bytes(b""), "not a troupe VAE checkpoint: the file is empty (0 bytes)"),
        (
            lambda p: torch.save(torch.zeros(3), p),
            "not a troupe VAE checkpoint: it holds a Tensor, not the dict of 'config' and 'state_dict'",
        ),
        (write_bytes, "not a troupe VAE checkpoint: not a file torch can load safely"),
        (write_pickle, "not a troupe VAE checkpoint: not a file torch can load safely"),
    ],
    ids=["empty", "tensor", "random-bytes", "pickle"],
)
def test_info_says_why_a_file_is_no_checkpoint(
    tmp_path: Path, write: Callable[[Path], object], said: str
) -> None:
    path = tmp_path / "x.pt"
    write(path)
    before = {p: p.read_bytes() for p in files(tmp_path)}
    done = troupe("models", "info", str(path))
    assert_refused(done.returncode, done.stdout, done.stderr, f"PATH {path}: {said}")
    assert "weights_only" not in done.stderr and "arbitrary code" not in done.stderr
    assert {p: p.read_bytes() for p in files(tmp_path)} == before
