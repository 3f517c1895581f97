"""Node tags: validated in the config and on the command line, carried by beats, kept by the
master's node table, read back as placement hosts (dead nodes left out)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from troupe.cli.main import app
from troupe.runtime.errors import BadRequest, ConfigError
from troupe.runtime.node.config import MAX_TAGS, load_node_config
from troupe.runtime.placement import Host, hosts_of_status, place
from troupe.runtime.tasks.master.controls import NodeBeatControl
from troupe.runtime.tasks.master.nodes import NodeTable


def test_config_tags_are_read_and_said_once(tmp_path: Path) -> None:
    cfg = load_node_config(None)
    assert cfg.tags == ()
    path = tmp_path / "node.toml"
    path.write_text('[node]\ntags = ["encoder", "gpu-small", "encoder"]\n')
    assert load_node_config(path).tags == ("encoder", "gpu-small")
    assert load_node_config(path, tags=["trainer"]).tags == ("trainer",)  # --tag replaces the file's


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('["encoder", "gpu small"]', "node.tags: tag 'gpu small'"),
        ('["a/b"]', "node.tags: tag 'a/b'"),
        ('[""]', "node.tags: tag ''"),
        ("[3]", "node.tags: tag 3"),
        ('"encoder"', "node.tags: must be a list (got 'encoder')"),
        (f'["{"t" * 101}"]', "node.tags: tag 'ttt"),
        (
            str([f"t{i}" for i in range(MAX_TAGS + 1)]),
            f"node.tags: at most {MAX_TAGS} tags, got {MAX_TAGS + 1}",
        ),
    ],
)
def test_a_bad_tag_is_named(tmp_path: Path, value: str, expected: str) -> None:
    path = tmp_path / "node.toml"
    path.write_text(f"[node]\ntags = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {expected}"), message
    assert "\n" not in message


def test_node_start_refuses_a_bad_tag_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["node", "start", "--logs", str(tmp_path), "--tag", "encoder", "--tag", "bad tag"]
    )
    assert result.exit_code == 2, result.output
    assert "tag 'bad tag'" in result.output, result.output


def test_beats_carry_tags_and_old_beats_mean_none() -> None:
    assert NodeBeatControl.decode({"node": "a", "tags": ["encoder", "gpu"]}).tags == ("encoder", "gpu")
    assert NodeBeatControl.decode({"node": "a"}).tags == ()  # an older node
    for bad, said in ((["a b"], "tag 'a b'"), ("enc", "must be list"), ([1], "list of str")):
        with pytest.raises(BadRequest, match=said):
            NodeBeatControl.decode({"node": "a", "tags": bad})
    with pytest.raises(BadRequest, match=f"at most {MAX_TAGS} tags"):
        NodeBeatControl.decode({"node": "a", "tags": [f"t{i}" for i in range(MAX_TAGS + 1)]})


def test_node_table_keeps_the_last_tags() -> None:
    table = NodeTable(timeout_s=10.0)
    table.beat("a", "tcp://127.0.0.1:1", {"gpus": 1}, now=0.0)
    table.set_tags("a", ("encoder",))
    assert table.nodes()[0].tags == ("encoder",)
    table.set_tags("a", ())  # restarted without tags
    assert table.nodes()[0].tags == ()


def _status(*nodes: dict[str, object]) -> dict[str, object]:
    return {"master": "master", "nodes": list(nodes)}


def test_hosts_of_a_master_status() -> None:
    status = _status(
        {"node": "b", "endpoint": "tcp://10.0.0.2:7470", "alive": True, "resources": {"gpus": 2},
         "tags": ["trainer"]},
        {"node": "a", "endpoint": "tcp://10.0.0.1:7470", "alive": True, "resources": {"gpus": 0},
         "tags": ["encoder", "cpu"]},
        {"node": "c", "endpoint": "tcp://10.0.0.3:7470", "alive": False, "resources": {}, "tags": []},
        {"node": "d", "endpoint": "tcp://10.0.0.4:7470", "alive": True, "resources": {}},  # older node
    )  # fmt: skip
    hosts = hosts_of_status(status)
    assert hosts == [
        Host("a", "tcp://10.0.0.1:7470", frozenset({"encoder", "cpu"}), 0),
        Host("b", "tcp://10.0.0.2:7470", frozenset({"trainer"}), 2),
        Host("d", "tcp://10.0.0.4:7470", frozenset(), 0),
    ]
    assert [h.name for h in place(4, hosts, tags=["encoder"])] == ["a"] * 4
    assert [h.name for h in place(2, hosts, gpus=1)] == ["b", "b"]
    with pytest.raises(ConfigError, match=r"no node has tags \['gpu-big'\]"):
        place(1, hosts, tags=["gpu-big"], what="encoders")


def test_a_draining_node_stays_a_host_but_takes_no_new_replica() -> None:
    """Drained (``troupe ctl drain``), a node keeps the replicas it runs (it is still listed,
    so a run does not count them lost) and gets no new one: a stranger's drained node took a
    pipeline's replicas. With only drained nodes fitting, the error names the undrain."""
    status = _status(
        {"node": "a", "endpoint": "tcp://10.0.0.1:7470", "alive": True, "resources": {}, "tags": ["x"],
         "draining": True},
        {"node": "b", "endpoint": "tcp://10.0.0.2:7470", "alive": True, "resources": {}, "tags": []},
    )  # fmt: skip
    hosts = hosts_of_status(status)
    assert [(h.name, h.draining) for h in hosts] == [("a", True), ("b", False)]
    assert [h.name for h in place(3, hosts)] == ["b"] * 3
    with pytest.raises(ConfigError, match=r"a \(tags \['x'\], gpus 0, draining: troupe ctl undrain a\)"):
        place(1, hosts, tags=["x"], what="stages.store")
