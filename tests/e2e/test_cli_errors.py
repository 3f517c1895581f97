"""Bad input to the troupe command: one line on stderr, exit status 2, and nothing started.

Each test runs the real command in a subprocess. "Nothing started" is checked by what the
command would have made first (the output or logs directory, the journal), not by timing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from troupe.cli.preflight import default_or_free
from troupe.runtime.tasks.journal_lock import JournalLock
from troupe.runtime.testing.plugin import free_endpoint, reap

pytestmark = pytest.mark.e2e

HANG_GUARD_S = 120  # only so a regression cannot hang the suite; no test measures speed
ROOT = Path(__file__).resolve().parents[2]


def troupe(*args: str, cwd: Path, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``troupe ARGS`` in ``cwd`` and capture its output."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "troupe.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "60"},  # a narrow terminal must not wrap the line either
    )


def one_line_error(out: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The single error line of a failed command (asserting that it is a single line)."""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == code, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and "MarkupError" not in out.stderr, out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: "), out.stderr
    return lines[0]


@contextmanager
def listening(endpoint: str, taken_already_ok: bool = False) -> Iterator[None]:
    """Another process's socket listening on ``endpoint``'s port. With ``taken_already_ok`` (a
    default port, which a run of another test may hold for a while): it waits until it holds the
    port itself, as a holder that let go before the command looked would leave it free; past
    ``HANG_GUARD_S``, a port still someone else's counts, taken either way."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: past TIME_WAIT
        deadline = time.monotonic() + (HANG_GUARD_S if taken_already_ok else 0)
        while True:
            try:
                sock.bind((host, int(port)))
                sock.listen()
                break
            except OSError:
                if not taken_already_ok:
                    raise
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        yield


def _without_dac_override() -> list[str]:
    """A command prefix under which permission bits bind this user (root ignores them)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a directory unwritable")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


def test_out_naming_a_file(tmp_path: Path) -> None:
    """--out naming a file: one line naming it, exit 2, the file untouched."""
    target = tmp_path / "taken"
    target.write_text("keep me")
    line = one_line_error(troupe("run", "--out", str(target), cwd=tmp_path))
    assert f"--out {target}: is a file, not a directory" in line
    assert target.read_text() == "keep me"


def test_out_in_an_unwritable_directory(tmp_path: Path) -> None:
    """--out under a directory nobody may write: one line with the reason, nothing created."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        out = troupe("run", "--out", str(locked / "out"), cwd=tmp_path, prefix=_without_dac_override())
        line = one_line_error(out)
        assert f"--out {locked / 'out'}: cannot write in {locked} (Permission denied)" in line
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_out_under_proc(tmp_path: Path) -> None:
    """--out under /proc is refused as a kernel file system."""
    line = one_line_error(troupe("run", "--out", "/proc/troupe-out", cwd=tmp_path))
    assert "--out /proc/troupe-out: /proc is a kernel file system" in line


@pytest.mark.parametrize("scenes", ["0", "-3"])
def test_scenes_below_one(tmp_path: Path, scenes: str) -> None:
    """--scenes 0 or negative: one line naming the option and the value, nothing written."""
    line = one_line_error(troupe("run", "--scenes", scenes, "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "--scenes must be between 1 and" in line and f"got {scenes}" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command",
    [
        ("run", "--out", "{tmp}/out"),
        ("demo", "--logs", "{tmp}/out"),
        ("node", "start", "--logs", "{tmp}/out"),
        ("master", "start", "--logs", "{tmp}/out", "--new", "--journal", "{tmp}/out/j.db"),
    ],
    ids=["run", "demo", "node start", "master start"],
)
def test_endpoint_in_use(tmp_path: Path, command: tuple[str, ...]) -> None:
    """A port another process listens on: one line naming the endpoint and the option to pass."""
    endpoint = free_endpoint()
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    with listening(endpoint):
        line = one_line_error(troupe(*args, "--endpoint", endpoint, cwd=tmp_path))
    who = "master" if command[0] == "master" else "node"
    assert f"endpoint {endpoint} is in use (another troupe {who}?); pass another --endpoint" in line
    assert not (tmp_path / "out").exists(), "nothing was started"


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (("run", "--out", "{tmp}/out", "--items", "2"), "--endpoint"),
        (("run", "--out", "{tmp}/out", "--items", "2"), "--master"),
        (("demo", "--logs", "{tmp}/out"), "--endpoint"),
    ],
    ids=["run endpoint", "run master", "demo"],
)
@pytest.mark.parametrize("host", ["0.0.0.0", "10.213.99.7"])  # every interface; an address not this host's
def test_an_endpoint_off_loopback_for_a_one_host_command(
    tmp_path: Path, command: tuple[str, ...], option: str, host: str
) -> None:
    """``troupe run`` and ``troupe demo`` take no CURVE keys: an endpoint reachable from other
    hosts is refused in one line that says how to serve them, and nothing is made (it was a
    pydantic traceback from inside the run, after --out had a journal and a log; an address
    this host does not have said only "cannot be bound ... pass another --endpoint")."""
    endpoint = free_endpoint().replace("127.0.0.1", host)
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    line = one_line_error(troupe(*args, option, endpoint, cwd=tmp_path))
    assert f"{option} {endpoint} is not on loopback" in line and "--cluster" in line, line
    assert not (tmp_path / "out").exists(), "nothing was started"


def test_node_actor_class_that_does_not_import(tmp_path: Path) -> None:
    """A node config naming a class that does not import: one line at its field, no worker, no log."""
    config = tmp_path / "node.toml"
    config.write_text(
        f'[node]\nendpoint = "{free_endpoint()}"\n[[workers]]\nname = "w-render"\n'
        'actors = [{ name = "render", class = "troupe_no_such_pkg.actors:Renderer" }]\n'
    )
    out = troupe("node", "start", "--config", str(config), "--logs", str(tmp_path / "logs"), cwd=tmp_path)
    line = one_line_error(out)
    assert (
        f"{config}: workers.w-render.actors.render.class: cannot import "
        "'troupe_no_such_pkg.actors:Renderer': No module named 'troupe_no_such_pkg'"
    ) in line
    assert not (tmp_path / "logs").exists(), "the node never started"


def test_run_master_endpoint_in_use(tmp_path: Path) -> None:
    """`troupe run` starts a master too: its port in use is named with --master."""
    master = free_endpoint()
    with listening(master):
        line = one_line_error(
            troupe(
                "run",
                "--out",
                str(tmp_path / "out"),
                "--endpoint",
                free_endpoint(),
                "--master",
                master,
                cwd=tmp_path,
            )
        )
    assert f"endpoint {master} is in use (another troupe master?); pass another --master" in line
    assert not (tmp_path / "out").exists(), "nothing was started"


def test_pipeline_actor_class_that_does_not_import(tmp_path: Path) -> None:
    """A pipeline stage whose class does not import: one line at the stage's field, no run."""
    pipeline = tmp_path / "pipe.toml"
    pipeline.write_text('[[stages]]\nname = "render"\nactor = "troupe_no_such_pkg.stages:Render"\n')
    out = troupe(
        "run",
        str(pipeline),
        "--out",
        str(tmp_path / "out"),
        "--endpoint",
        free_endpoint(),
        "--master",
        free_endpoint(),
        cwd=tmp_path,
    )
    line = one_line_error(out)
    assert f"{pipeline}: stages.render.actor: cannot import 'troupe_no_such_pkg.stages:Render'" in line
    assert not (tmp_path / "out").exists(), "the run never started"
    assert out.stdout == "", "nothing but the error is printed"


@pytest.mark.parametrize("command", [("ctl", "ping"), ("ctl", "status", "--master", "{free}")])
def test_ctl_with_no_node_listening(tmp_path: Path, command: tuple[str, ...]) -> None:
    """ctl ping / status with nothing at --node: exit 1 with what to do (not a timeout's wait)."""
    endpoint = free_endpoint()
    args = [a.replace("{free}", free_endpoint()) for a in command]
    line = one_line_error(troupe(*args, "--node", endpoint, "--timeout", "600", cwd=tmp_path), code=1)
    said = f"no node answers at {endpoint} (connection refused); start one with `troupe node start`"
    assert f"{said} or pass --node" in line


def test_toml_key_that_looks_like_markup(tmp_path: Path) -> None:
    """A key like [/x] is printed as written: one line, exit 2, no rich MarkupError."""
    config = tmp_path / "node.toml"
    config.write_text('[node]\n"[/x]" = 1\n')
    line = one_line_error(troupe("node", "start", "--config", str(config), cwd=tmp_path))
    assert f"{config}: node.[/x]: unknown key" in line
    pipeline = tmp_path / "[odd]" / "pipe.toml"
    pipeline.parent.mkdir()
    pipeline.write_text('"[/x]" = 1\n')
    line = one_line_error(troupe("run", str(pipeline), cwd=tmp_path))
    assert f"{pipeline}: unknown sections: '[/x]'" in line


def test_bad_config_value_is_one_line_with_field_and_value(tmp_path: Path) -> None:
    """Several bad fields of a pipeline: one line naming each by path, the stage by its name."""
    pipeline = tmp_path / "pipe.toml"
    pipeline.write_text(
        '[pipeline]\nitem = 3\n[[stages]]\nname = "render"\n'
        'actor = "troupe.actors.bench.synthetic:CostStage"\nreplicas = -1\n'
    )
    line = one_line_error(troupe("run", str(pipeline), "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "stages.render.replicas: must be >= 1 (got -1)" in line
    assert "pipeline.item: unknown key; did you mean 'items'?" in line


def test_with_master_takes_the_master_endpoint_from_the_config(tmp_path: Path) -> None:
    """`node start --config X --with-master` runs the master at X's [node] master."""
    master = free_endpoint()
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nendpoint = "{free_endpoint()}"\nmaster = "{master}"\n')
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "troupe.cli.main",
            "node",
            "start",
            "--config",
            str(config),
            "--with-master",
            "--new",
            "--journal",
            str(tmp_path / "journal.db"),
            "--logs",
            str(tmp_path / "logs"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        answered = None
        while time.monotonic() < deadline and proc.poll() is None:  # bounded poll of the node
            answered = troupe("ctl", "jobs", "--master", master, "--json", cwd=tmp_path)
            if answered.returncode == 0:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the node exited"
        assert answered is not None and answered.returncode == 0, answered and answered.stderr
        assert answered.stdout.strip().startswith("[") or answered.stdout.strip().startswith("{")
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        assert reap(proc, children) == []


def test_an_out_another_run_holds_is_named_before_the_endpoints(tmp_path: Path) -> None:
    """A second `troupe run` into the same --out is told that, not that the first run's node
    holds the endpoint it would also take."""

    out = tmp_path / "out"
    journal = out / ".troupe" / "journal.db"
    journal.parent.mkdir(parents=True)
    journal.touch()
    endpoint = free_endpoint()
    lock = JournalLock.acquire(journal)  # as the first run holds it
    try:
        with listening(endpoint):  # and its node listens where the second would
            line = one_line_error(troupe("run", "--out", str(out), "--endpoint", endpoint, cwd=tmp_path))
    finally:
        lock.release()
    assert f"--out {out} is in use by another troupe run (pid {os.getpid()})" in line, line


def test_a_second_run_takes_free_ports_when_the_defaults_are_taken(tmp_path: Path) -> None:
    """Two runs at once into two directories: the second's node and master listen on free
    ports and it says where, on stderr; stdout stays the JSON it was asked for."""
    with listening("tcp://127.0.0.1:7479", True), listening("tcp://127.0.0.1:7478", True):
        done = troupe("run", "--out", str(tmp_path / "out"), "--items", "2", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stderr.split())
    assert (
        "the default node's and master's endpoints are taken (another troupe run?): this run's node "
        "listens on tcp://127.0.0.1:" in said
    )
    assert json.loads(done.stdout)["items"]["ok"] == 2


def test_a_run_refused_by_a_stage_says_its_error_alone_when_the_defaults_are_taken(tmp_path: Path) -> None:
    """Where the run's node would listen is said once it starts: a run refused before that (a
    stage's kwarg, found as its classes are checked) prints its error alone."""
    text = (ROOT / "configs" / "datagen.toml").read_text(encoding="utf-8")
    pipeline = tmp_path / "pipe.toml"
    pipeline.write_text(text.replace("max_frames = 60", "max_frames = 0"), encoding="utf-8")
    with listening("tcp://127.0.0.1:7479", True), listening("tcp://127.0.0.1:7478", True):
        line = one_line_error(troupe("run", str(pipeline), "--out", str(tmp_path / "out"), cwd=tmp_path))
    assert "kwargs.max_frames must be at least 1, got 0" in line, line


@pytest.mark.parametrize("config", ["datagen", "train"])
@pytest.mark.parametrize("kind", ["symlink-loop", "name-too-long"])
def test_an_out_that_is_no_usable_path_is_one_line(tmp_path: Path, kind: str, config: str) -> None:
    """A loop of symlinks, a name over the file system's limit: one line, exit 2 (tracebacks;
    a training run's checks resolved the path first, and printed 57 lines)."""
    if kind == "symlink-loop":
        (tmp_path / "loop1").symlink_to("loop2")
        (tmp_path / "loop2").symlink_to("loop1")
        out = "loop1"
    else:
        out = "a" * 300
    line = one_line_error(
        troupe("run", str(ROOT / "configs" / f"{config}.toml"), "--items", "2", "--out", out, cwd=tmp_path)
    )
    assert f"--out {out}: not a usable path" in line, line


def test_an_out_whose_name_is_not_utf8_is_refused_before_it_is_made(tmp_path: Path) -> None:
    """A name of bytes no encoding reads (``o\\xff``): it failed late, in the run's first
    message that carried the path, after --out had a journal and a log."""
    out = str(tmp_path) + "/o" + os.fsdecode(b"\xff")
    line = one_line_error(troupe("run", "--items", "2", "--out", out, cwd=tmp_path))
    assert f"--out {tmp_path}/o\\xff: not valid UTF-8" in line, line
    assert not os.path.exists(out)


def test_given_endpoints_stay_where_they_were_given() -> None:
    """Only a default gives way: an endpoint the user gave is kept (and refused when taken)."""
    given = free_endpoint()
    assert default_or_free(given, "tcp://127.0.0.1:7479") == (given, False)
    taken = free_endpoint()
    with listening(taken):
        moved, was_taken = default_or_free(None, taken)
    assert was_taken and moved != taken and moved.startswith("tcp://127.0.0.1:")
    free = free_endpoint()
    assert default_or_free(None, free) == (free, False)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        (
            'kwargs = { fps = 10, max_frames = "sixty" }',
            "stages.plan.kwargs: troupe.actors.datagen.lifecycle:NavPlanner: kwargs.max_frames = 'sixty': "
            "Input should be a valid integer",
        ),
        (
            "kwargs = { fps = 10, max_frames = 0 }",
            "stages.plan.kwargs: troupe.actors.datagen.lifecycle:NavPlanner: kwargs.max_frames must be at "
            "least 1, got 0",
        ),
    ],
)
def test_a_stage_kwarg_of_the_wrong_value_is_refused_before_anything_starts(
    tmp_path: Path, kwargs: str, said: str
) -> None:
    """Its name is right, its value is not: one line, exit 2, nothing made in --out (it used to
    start the run and fail each replica as it started, with a worker's traceback)."""
    text = (ROOT / "configs" / "datagen.toml").read_text(encoding="utf-8")
    assert "kwargs = { fps = 10, max_frames = 60 }" in text, "configs/datagen.toml changed shape"
    pipeline = tmp_path / "pipe.toml"
    pipeline.write_text(text.replace("kwargs = { fps = 10, max_frames = 60 }", kwargs), encoding="utf-8")
    out = tmp_path / "out"
    line = one_line_error(troupe("run", str(pipeline), "--out", str(out), cwd=tmp_path))
    assert said in line, line
    assert not out.exists()
