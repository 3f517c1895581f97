"""The pytest plugin as a user meets it: a fresh project, the documented examples, no config.

The project is built from the code blocks of docs/WRITING_ACTORS.md that name a file, plus the
README's ``troupe_cluster`` example copied verbatim, so that the documentation cannot drift
from what works. It has a pyproject.toml with no pytest section, no conftest and no ini file;
its tests run in a pytest subprocess of their own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import kill_all_in, left_working_in, working_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "WRITING_ACTORS.md"

# A fenced block whose first line is a comment naming a file: "# mypkg/actors.py".
_FILE_BLOCK = re.compile(r"```(?:python|toml)\n# ([\w./-]+)\n(.*?)```", re.S)

BROKEN_TEST = '''
MISSING = """
[[workers]]
name = "w-broken"
actors = [{ name = "broken", class = "mypkg.missing:Nope" }]
"""

BAD_KWARGS = """
[[workers]]
name = "w-broken"
actors = [{ name = "render", class = "mypkg.actors:Renderer", kwargs = { colour = "red" } }]
"""


async def test_missing_module(troupe_cluster):
    troupe_cluster(MISSING)


RAISES = """
[[workers]]
name = "w-broken"
actors = [{ name = "raises", class = "mypkg.raising:Raises" }]
"""


async def test_bad_kwargs(troupe_cluster):
    troupe_cluster(BAD_KWARGS)


async def test_constructor_raises(troupe_cluster):
    troupe_cluster(RAISES)
'''

RAISING_ACTOR = """
from troupe.runtime import Actor


class Raises(Actor):
    def __init__(self) -> None:
        raise RuntimeError("no renderer on this host")
"""


def guide_files() -> dict[str, str]:
    """The example project's files, by path, as docs/WRITING_ACTORS.md writes them."""
    return {path: f"# {path}\n{body}" for path, body in _FILE_BLOCK.findall(GUIDE.read_text())}


def readme_example() -> str:
    """The first Python block of the README's section on testing actors, verbatim."""
    text = README.read_text()
    section = text[text.index("\n## Testing your actors") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the README's testing section has no Python example"
    return match.group(1)


def fresh_project(where: Path) -> Path:
    """Write the example project: the guide's files and the README's test."""
    project = where / "proj"
    for path, text in guide_files().items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text)
    (project / "tests" / "test_readme.py").write_text(readme_example())
    (project / "pyproject.toml").write_text('[project]\nname = "mypkg"\nversion = "0.1"\n')
    return project


def run_pytest(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pytest`` as a user would run it: none of this suite's settings or paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )


def test_the_guide_names_every_file_the_examples_need() -> None:
    """The guide's file blocks make a whole project: the package, its actors and its tests."""
    assert {
        "mypkg/__init__.py",
        "mypkg/actors.py",
        "mypkg/client.py",
        "mypkg/tasks.py",
        "mypkg/stages.py",
        "jobs/squares.toml",
        "pipelines/tokens.toml",
        "tests/test_mypkg.py",
    } <= set(guide_files())


def test_the_documented_examples_pass_in_a_fresh_project(tmp_path: Path) -> None:
    """The README's example and the guide's tests (actor, stage, task actor with a master) pass
    as written, with no pytest configuration and async tests run by the plugin."""
    project = fresh_project(tmp_path)
    done = run_pytest(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout, done.stdout


def test_workers_import_the_project_wherever_pytest_runs_and_without_pytest_asyncio(tmp_path: Path) -> None:
    """Run from another folder, with pytest-asyncio disabled: the workers still import mypkg
    (they get the test's import path) and the async test still runs."""
    project = fresh_project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = run_pytest(elsewhere, "-p", "no:asyncio", str(project / "tests" / "test_readme.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout, done.stdout


def test_a_worker_that_cannot_start_fails_the_fixture_at_once_with_its_error(tmp_path: Path) -> None:
    """A class that does not import, a kwarg its constructor does not take, or a constructor
    that raises: the fixture fails as soon as the node or the worker exits, with its error in
    the test's failure, not after a timeout."""
    project = fresh_project(tmp_path)
    (project / "tests" / "test_broken.py").write_text(BROKEN_TEST)
    (project / "mypkg" / "raising.py").write_text(RAISING_ACTOR)
    done = run_pytest(project, "tests/test_broken.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "3 failed" in done.stdout, done.stdout
    assert "No module named 'mypkg.missing'" in done.stdout, done.stdout
    said = " ".join(done.stdout.split())
    assert "actors.render.kwargs: mypkg.actors:Renderer: takes no argument 'colour'" in said, said
    assert "worker 'w-broken' of troupe node 't' could not start" in done.stdout, done.stdout
    assert "RuntimeError: no renderer on this host" in done.stdout, done.stdout
    assert "not ready within" not in done.stdout


WAITING_TEST = '''
RENDER = """
[[workers]]
name = "w-render"
actors = [{ name = "render", class = "mypkg.actors:Renderer" }]
"""


async def test_never(troupe_cluster):
    cluster = troupe_cluster(RENDER)
    await cluster.wait_for(lambda s: cluster.worker_in(s, "w-render")["restarts"] == 5, timeout=1)
'''


def test_a_wait_for_that_never_holds_says_what_it_waited_for_and_what_it_saw(tmp_path: Path) -> None:
    """``cluster.wait_for`` past its timeout: the failure names the predicate and each worker
    as last told (a bare ``TimeoutError`` left a user to guess which wait failed, and why)."""
    project = fresh_project(tmp_path)
    (project / "tests" / "test_waiting.py").write_text(WAITING_TEST)
    done = run_pytest(project, "tests/test_waiting.py")
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "wait_for: still false after 1 s" in said, said
    assert 'cluster.worker_in(s, "w-render")["restarts"] == 5' in said, said
    assert "w-render: running, restarts 0" in said, said


def test_the_documented_pipeline_runs_with_troupe_run(tmp_path: Path) -> None:
    """`troupe run pipelines/tokens.toml` in the project runs the guide's two stages: of 12
    seeds, the 4 divisible by 3 are pruned and 8 pass both stages."""
    from troupe.runtime.testing.plugin import free_endpoint

    project = fresh_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONPATH")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "troupe.cli.main",
            "run",
            "pipelines/tokens.toml",
            "--out",
            str(tmp_path / "out"),
            "--endpoint",
            free_endpoint(),
            "--master",
            free_endpoint(),
        ],
        cwd=project,
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 ok, 4 pruned, 0 dead" in done.stdout, done.stdout


KILLED_HOLDER = """
import sys
from pathlib import Path

from troupe.runtime.testing.plugin import start_cluster

CONFIG = '''
[[workers]]
name = "w"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
'''

cluster = start_cluster(Path("cluster"), CONFIG)
print(cluster.proc.pid, [p.pid for p in cluster.descendants()], flush=True)
sys.stdin.read()  # until the test kills this process
"""


def test_a_node_the_plugin_started_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A pytest killed by SIGKILL (a CI's timeout) cannot reap its nodes: each dies with it,
    and its workers with the node, rather than holding their ports until someone finds them."""
    (tmp_path / "holder.py").write_text(KILLED_HOLDER, encoding="utf-8")
    with subprocess.Popen(
        [sys.executable, "holder.py"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            first = holder.stdout.readline()  # the node is up once this line comes
            assert first.strip(), "the holder ended before its node was up"
            node_pid = int(first.split()[0])
            assert node_pid in {p.pid for p in working_in(tmp_path)}  # a node and its workers run there
            holder.kill()
            holder.wait(timeout=30)
            assert left_working_in(tmp_path, 30) == []
        finally:
            kill_all_in(tmp_path, holder)
