"""Off loopback, a node or master listens only with CURVE keys, or when told ``--insecure``."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import check_bind, check_endpoint, check_loopback, load_node_config
from troupe.runtime.tasks.master.master_config import MasterConfig

OFF = "tcp://10.1.2.3:7470"
WAYS_OUT = (
    f"endpoint {OFF!r} is not on loopback and no CURVE keys are configured; pass --keys DIR (made "
    "by `troupe keys generate DIR`) to authenticate and encrypt, or --insecure to listen "
    "unauthenticated"
)


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://127.0.0.1:7470", "tcp://127.0.0.2:1", "tcp://localhost:7470", "tcp://[::1]:7470", "ipc:///tmp/x"],
)
def test_loopback_needs_nothing(endpoint: str) -> None:
    check_bind(endpoint, keys=None, insecure=False)
    check_loopback(endpoint)


@pytest.mark.parametrize("endpoint", [OFF, "tcp://0.0.0.0:7470", "tcp://*:7470", "tcp://node7.example:7470"])
def test_off_loopback_without_keys_is_refused_naming_both_ways_out(endpoint: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_bind(endpoint, keys=None, insecure=False)
    assert str(refused.value) == WAYS_OUT.replace(OFF, endpoint)
    check_bind(endpoint, keys=Path("keys"), insecure=False)
    check_bind(endpoint, keys=None, insecure=True)


def test_a_malformed_endpoint_is_still_refused_whatever_the_keys() -> None:
    with pytest.raises(ValueError, match="must be tcp://HOST:PORT"):
        check_bind("http://127.0.0.1:80", keys=Path("keys"), insecure=True)


def test_the_node_config_applies_it_to_its_endpoint_and_its_master(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_node_config(None, endpoint=OFF)
    assert str(refused.value) == f"command line: --endpoint: {WAYS_OUT}"
    with pytest.raises(ConfigError, match=r"master: endpoint 'tcp://10\.9\.9\.9:7480' is not on loopback"):
        load_node_config(None, master="tcp://10.9.9.9:7480")
    with pytest.raises(ConfigError) as both:  # the way out said once, not once for each
        load_node_config(None, endpoint=OFF, master="tcp://10.9.9.9:7480")
    assert str(both.value) == f"command line: --endpoint: {WAYS_OUT}"
    path = tmp_path / "node.toml"
    path.write_text(f'[node]\nendpoint = "{OFF}"\nkeys = "{tmp_path}"\n', encoding="utf-8")
    cfg = load_node_config(path)
    assert cfg.keys == tmp_path and not cfg.insecure
    assert load_node_config(None, endpoint=OFF, insecure=True).insecure
    with pytest.raises(ConfigError, match="insecure"):
        load_node_config(None, insecure="yes")  # a switch, strictly


def test_the_master_config_too() -> None:
    with pytest.raises(ConfigError) as refused:
        MasterConfig(endpoint=OFF)
    assert str(refused.value) == f"master endpoint: {WAYS_OUT}"
    assert MasterConfig(endpoint=OFF, insecure=True).insecure
    assert MasterConfig(endpoint=OFF, keys=Path("k")).keys == Path("k")


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://127.0.0.1:99999",  # the bind took it modulo 65536: 34463
        "tcp://127.0.0.1:0",
        "tcp://127.0.0.1",
        "tcp:/127.0.0.1:7710",  # a slash short
        "tcp://:7480",
        "tcp://127.0.0.1:7480/x",
    ],
)
def test_an_endpoint_that_is_no_tcp_host_and_port_is_refused_naming_the_option(endpoint: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_node_config(None, endpoint=endpoint)
    assert str(refused.value) == (
        f"command line: --endpoint: endpoint {endpoint!r} must be tcp://HOST:PORT (PORT 1-65535), "
        "ipc://PATH or inproc://NAME"
    )
    with pytest.raises(ValueError, match="PORT 1-65535"):
        check_endpoint(endpoint)


@pytest.mark.parametrize(
    "endpoint", ["tcp://127.0.0.1:7480", "tcp://127.0.0.1:*", "tcp://[::1]:1", "ipc:///tmp/n", "inproc://n"]
)
def test_well_formed_endpoints_pass(endpoint: str) -> None:
    assert check_endpoint(endpoint) == endpoint
