"""Where a node's workers listen, and the address a node gives other hosts.

Workers bind their node's own host address on free ports, so actors on other hosts reach
their mailboxes directly; a node bound on every interface needs ``advertise`` to say where.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from troupe.cli.main import app
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import load_node_config
from troupe.runtime.node.reach import LOOPBACK_ANY_PORT, advertised_endpoint, is_wildcard, worker_bind
from troupe.runtime.transports.zmq import ZmqTransport


@pytest.mark.parametrize(
    ("endpoint", "advertise", "bind"),
    [
        ("tcp://127.0.0.1:7470", None, "tcp://127.0.0.1:*"),
        ("tcp://10.213.7.2:7470", None, "tcp://10.213.7.2:*"),
        ("tcp://10.213.7.2:7470", "ignored.example", "tcp://10.213.7.2:*"),
        ("tcp://[::1]:7470", None, "tcp://[::1]:*"),
        ("tcp://0.0.0.0:7470", "10.0.0.5", "tcp://10.0.0.5:*"),
        ("tcp://*:7470", "10.0.0.5", "tcp://10.0.0.5:*"),
        ("ipc:///tmp/troupe-node", None, LOOPBACK_ANY_PORT),
    ],
)
def test_workers_bind_their_nodes_host(endpoint: str, advertise: str | None, bind: str) -> None:
    assert worker_bind(endpoint, advertise) == bind


def test_a_wildcard_node_without_advertise_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match=r"node\.advertise: required .*'tcp://0\.0\.0\.0:7470'"):
        worker_bind("tcp://0.0.0.0:7470", None)
    with pytest.raises(ConfigError, match=r"node\.advertise: cannot resolve 'no-such-host\.invalid'"):
        worker_bind("tcp://0.0.0.0:7470", "no-such-host.invalid")


def test_an_advertised_name_is_resolved_for_the_workers_bind() -> None:
    assert worker_bind("tcp://0.0.0.0:7470", "localhost") in ("tcp://127.0.0.1:*", "tcp://[::1]:*")


def test_other_hosts_are_given_the_advertised_address_of_a_wildcard_bind() -> None:
    assert (
        is_wildcard("tcp://0.0.0.0:7470") and is_wildcard("tcp://*:1") and not is_wildcard("tcp://10.0.0.1:1")
    )
    assert advertised_endpoint("tcp://0.0.0.0:7470", "gpu-07") == "tcp://gpu-07:7470"
    assert advertised_endpoint("tcp://10.0.0.7:7470", "gpu-07") == "tcp://10.0.0.7:7470"
    assert advertised_endpoint("tcp://0.0.0.0:7470", None) == "tcp://0.0.0.0:7470"


def test_actor_mailboxes_listen_on_the_interface_of_their_process(tmp_path: Path) -> None:
    transport = ZmqTransport(bind="tcp://127.0.0.2:*")
    try:
        assert transport.address.startswith("tcp://127.0.0.2:")
        assert transport.open_mailbox().startswith("tcp://127.0.0.2:")
    finally:
        transport.close()
    loopback = ZmqTransport(bind=f"ipc://{tmp_path}/node.sock")
    try:
        assert loopback.open_mailbox().startswith("tcp://127.0.0.1:")
    finally:
        loopback.close()


def test_the_config_refuses_a_wildcard_without_advertise_and_a_host_that_is_no_host(tmp_path: Path) -> None:
    """As the file loads, named with it (it was found as the node started, with no file named;
    a host name with a space was taken and never checked on a loopback node)."""
    path = tmp_path / "node.toml"
    path.write_text('[node]\nendpoint = "tcp://0.0.0.0:7470"\ninsecure = true\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}: node\.advertise: required when node\.endpoint binds"):
        load_node_config(path)
    path.write_text('[node]\nadvertise = "bad host!"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"'bad host!' is no host name or IP address"):
        load_node_config(path)
    for good in ("gpu-07", "10.0.0.7", "::1", "node7.example.org"):
        path.write_text(f'[node]\nadvertise = "{good}"\n', encoding="utf-8")
        assert load_node_config(path).advertise == good


def test_the_wildcard_endpoint_and_its_address_may_both_come_from_the_command_line(tmp_path: Path) -> None:
    """`node start --endpoint tcp://0.0.0.0:7470` with a file that names neither: the error named
    the file's node.advertise, and only an edit of the file could give it."""
    path = tmp_path / "node.toml"
    path.write_text("[node]\ninsecure = true\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"node\.advertise, or --advertise"):
        load_node_config(path, endpoint="tcp://0.0.0.0:7470")
    cfg = load_node_config(path, endpoint="tcp://0.0.0.0:7470", advertise="10.0.0.7")
    assert (cfg.endpoint, cfg.advertise) == ("tcp://0.0.0.0:7470", "10.0.0.7")
    assert "--advertise" in _node_start_help()


def _node_start_help() -> str:
    runner = CliRunner()
    return runner.invoke(app, ["node", "start", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}).output
