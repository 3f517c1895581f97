"""A node's ``[node] preload`` names modules no worker imports of its own accord: one misspelt or
not installed was skipped by the template in an info line, and nothing ever said so. `troupe node
start` now refuses it in one line (exit 2) before anything starts; one that is found but raises
as it imports is logged by the template at warning."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from support.cli_session import troupe_in_session
from support.local_node import READY_WITHIN_S, echo_node_config, running_node
from troupe.runtime.core.loading import check_node_preload
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.transports.loopback import free_endpoint

REFUSAL_S = 60  # a refusal comes before anything starts; a bound only, should it start after all


@pytest.mark.parametrize("entry", ["trch", "no_such_pkg_xyz.sub:Cls"])
def test_node_start_refuses_a_preload_that_is_not_installed(tmp_path: Path, entry: str) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nname = "n1"\npreload = ["{entry}"]\n')
    done = troupe_in_session(
        "node",
        "start",
        "--config",
        str(config),
        "--endpoint",
        free_endpoint(),
        "--logs",
        str(tmp_path / "logs"),
        timeout=REFUSAL_S,
    )
    top = entry.partition(".")[0].partition(":")[0]
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(
        f"error: {config}: node.preload: {entry!r} is not installed here: No module named {top!r}"
    ), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


async def test_a_preload_that_raises_as_it_imports_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "boom_preload_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # found here, as by the node start's check
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # and by the template, which imports it
    cfg = echo_node_config(tmp_path, "np", preload=("boom_preload_mod",))
    with capture_logs() as logs:
        async with running_node(cfg) as node:
            assert node.template is not None
            with anyio.fail_after(READY_WITHIN_S):
                await node.template.settled()
    skipped = [e for e in logs if e["event"] == "template_skipped_modules"]
    assert skipped and skipped[0]["log_level"] == "warning", logs
    assert skipped[0]["skipped"] == {"boom_preload_mod": "RuntimeError: boom at import"}


def test_a_preload_of_the_folder_the_node_starts_in_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`troupe` as a console script has its own folder first on its path, not the current one,
    where the node's template and workers (``python -m``) have the current folder: a module of
    the folder the node started in was refused as "not installed here", advising to run from the
    folder it was run from."""
    (tmp_path / "own_preload_mod_xyz.py").write_text("VALUE = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    cfg = NodeConfig(name="n1", preload=("own_preload_mod_xyz", "own_preload_mod_xyz:VALUE"))
    check_node_preload(cfg, "node.toml")
    assert str(tmp_path) not in sys.path  # looked there for the check only
    with pytest.raises(ConfigError, match="'elsewhere_xyz' is not installed here"):
        check_node_preload(NodeConfig(name="n1", preload=("elsewhere_xyz",)), "node.toml")
