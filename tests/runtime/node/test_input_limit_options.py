"""The node options of the input limits (core/throttle.py, wire/codec.py): their defaults, and
a bad value refused in one line that names the option and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.runtime.core.throttle import (
    DEFAULT_BAD_FRAMES_BURST,
    DEFAULT_BAD_FRAMES_PER_S,
    DEFAULT_THROTTLE_S,
)
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import NodeConfig, load_node_config
from troupe.runtime.node.worker_process import WorkerLaunch
from troupe.runtime.wire.codec import DEFAULT_MAX_FRAMES


def test_the_defaults_are_the_runtimes_own() -> None:
    """A node, its workers (their launch spec) and a bare runtime apply the same limits."""
    cfg = NodeConfig()
    launch = WorkerLaunch(node="n", process="w", node_endpoint="tcp://127.0.0.1:1")
    for holder in (cfg, launch):
        assert holder.max_frames == DEFAULT_MAX_FRAMES
        assert holder.bad_frames_burst == DEFAULT_BAD_FRAMES_BURST
        assert holder.bad_frames_per_s == DEFAULT_BAD_FRAMES_PER_S
        assert holder.throttle_s == DEFAULT_THROTTLE_S


def test_the_options_are_read_from_the_node_table(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        "[node]\nmax_frames = 8\nbad_frames_burst = 5\nbad_frames_per_s = 1\nthrottle_s = 600\n",
        encoding="utf-8",
    )
    cfg = load_node_config(path)
    assert (cfg.max_frames, cfg.bad_frames_burst, cfg.bad_frames_per_s, cfg.throttle_s) == (8, 5, 1.0, 600.0)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("max_frames = 1", "node.max_frames: must be >= 2 (got 1)"),
        ("max_frames = 2.5", "node.max_frames: must be an integer (got 2.5)"),
        ("bad_frames_burst = 0", "node.bad_frames_burst: must be >= 1 (got 0)"),
        ("bad_frames_per_s = 0", "node.bad_frames_per_s: must be > 0.0 (got 0)"),
        ("bad_frames_per_s = nan", "node.bad_frames_per_s: must be a finite number (got nan)"),
        ('throttle_s = "10"', "node.throttle_s: must be a number (got '10')"),
        ("throttle_s = -1", "node.throttle_s: must be > 0.0 (got -1)"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_it(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "node.toml"
    path.write_text(f"[node]\n{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    message = str(info.value)
    assert "\n" not in message and expected in message, message
