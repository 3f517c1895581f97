"""Bad node configs: one line naming the file, the field path and the value; actor classes checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from troupe.runtime.core.loading import check_node_actors
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import (
    MAX_DURATION_S,
    MAX_HWM,
    MAX_NAME,
    KindSupervision,
    NodeConfig,
    RestartConfig,
    SupervisionConfig,
    load_node_config,
)
from troupe.runtime.pipeline.config import PipelineConfig, StageConfig

WORKER = """
[[workers]]
name = "w-a"
actors = [{ name = "echo", class = "troupe.actors.demo.actors:Echo" }]
"""


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_node_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message, "one line"
    return message


BAD = [
    ('[node]\nhwm = "8"\n', "node.hwm: must be an integer (got '8')"),
    ("[node]\nhwm = 2147483648\n", f"node.hwm: must be <= {MAX_HWM} (got 2147483648)"),
    ("[node]\nhwm = 0\n", "node.hwm: must be >= 1 (got 0)"),
    # Below four batch frames (wire/batch_frames.py), a peer's batch would cost the connection.
    ("[node]\nmax_message_mb = 0.01\n", "node.max_message_mb: must be >= 0.0625 (got 0.01)"),
    # As a worker's and a pipeline's: 2**43 MB and more overflowed ZMQ_MAXMSGSIZE at the bind.
    ("[node]\nmax_message_mb = 9e12\n", "node.max_message_mb: must be <= 4096.0 (got 9000000000000.0)"),
    # No duration over a year: interval_s = 1e299 killed every worker's heartbeat thread.
    (
        "[supervision]\ninterval_s = 1e299\nheartbeat_timeout_s = 1e300\n",
        "supervision.interval_s: must be <= 31536000.0 (got 1e+299); "
        "supervision.heartbeat_timeout_s: must be <= 31536000.0 (got 1e+300)",
    ),
    ("[restart]\nperiod_s = 1e20\n", "restart.period_s: must be <= 31536000.0 (got 1e+20)"),
    ("[node]\nask_timeout_s = 1e10\n", "node.ask_timeout_s: must be <= 31536000.0 (got 10000000000.0)"),
    (
        "[supervision.kinds.gpu]\nstart_timeout_s = 4e7\n",
        "supervision.kinds.gpu.start_timeout_s: must be <= 31536000.0 (got 40000000.0)",
    ),
    ("[restart]\nmax_restarts = 2.5\n", "restart.max_restarts: must be an integer (got 2.5)"),
    ("[node]\nask_timeout_s = nan\n", "node.ask_timeout_s: must be a finite number (got nan)"),
    ("[node]\nstop_grace_s = inf\n", "node.stop_grace_s: must be a finite number (got inf)"),
    ('[node]\nstop_grace_s = "5"\n', "node.stop_grace_s: must be a number (got '5')"),
    ("[supervision]\nenabled = 1\n", "supervision.enabled: must be true or false (got 1)"),
    ("[node]\nhwmm = 3\n", "node.hwmm: unknown key; did you mean 'hwm'?"),
    (
        "[supervision.kinds.gpu]\ninterval_sx = 1\n",
        "supervision.kinds.gpu.interval_sx: unknown key; did you mean 'interval_s'?",
    ),
    (
        '[node]\nname = "a/b"\n',
        "node.name: may hold only ASCII letters (a-z, A-Z), digits, '.', '_' and '-' (got 'a/b')",
    ),
    (  # a letter, but not an ASCII one: "may hold only letters" refused it as if it were none
        '[node]\nname = "ñode"\n',
        "node.name: may hold only ASCII letters (a-z, A-Z), digits, '.', '_' and '-' (got 'ñode')",
    ),
    (f'[node]\nname = "{"n" * 300}"\n', f"node.name: must have at most {MAX_NAME} characters"),
    (
        '[[workers]]\nname = "w-a"\nactors = [{ name = "echo" }]\n',
        "workers.w-a.actors.echo.class: is missing",
    ),
    (
        '[[workers]]\nname = "w-a"\nactors = [{ name = "echo", class = "x:Y", kwarg = {} }]\n',
        "workers.w-a.actors.echo.kwarg: unknown key; did you mean 'kwargs'?",
    ),
    ('[[workers]]\nname = "w-a"\nkind = ""\n', "workers.w-a.kind: must not be empty (got '')"),
    (  # refused at load: the worker refused the second at its start and crash-looped
        '[[workers]]\nname = "w-a"\nactors = [{ name = "echo", class = "x:Y" },'
        ' { name = "b", class = "x:Y" }, { name = "echo", class = "x:Z" }]\n',
        "workers.w-a.actors: actor names must be unique in a worker, repeated: ['echo']",
    ),
    ("", "the config file is empty"),
    ("# only a comment\n", "the config file is empty"),
    ("[node]\nworkers = []\n", "node.workers: belongs in its own [[workers]] table"),
    ("node = 3\n", "node must be a [node] table, got 3"),
    ("[nodes]\n", "unknown sections: 'nodes' (did you mean [node]?)"),
    ('[node]\n"[/x]" = 1\n', "node.[/x]: unknown key"),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[b[1][:40] for b in BAD])
def test_bad_node_config_is_one_line_naming_field_and_value(tmp_path: Path, text: str, expected: str) -> None:
    """Each mistake is refused in one line with the file, the field path and the bad value."""
    assert expected in _error(tmp_path, text)


@pytest.mark.parametrize(
    "model", [NodeConfig, SupervisionConfig, KindSupervision, RestartConfig, PipelineConfig, StageConfig]
)
def test_every_duration_of_a_config_has_the_one_upper_bound(model: type[BaseModel]) -> None:
    """Every ``*_s`` key (seconds; not a rate ``*_per_s``) is at most MAX_DURATION_S: one
    added later without it would take 1e300, and overflow the first wait made with it."""
    durations = [n for n in model.model_fields if n.endswith("_s") and not n.endswith("_per_s")]
    assert durations
    for name in durations:
        field = TypeAdapter(model.model_fields[name].rebuild_annotation())
        assert field.validate_python(MAX_DURATION_S) == MAX_DURATION_S
        with pytest.raises(ValidationError) as info:
            field.validate_python(MAX_DURATION_S * 2)
        assert [e["type"] for e in info.value.errors()] == ["less_than_equal"], f"{model.__name__}.{name}"


def test_a_long_value_is_shortened(tmp_path: Path) -> None:
    """A very long bad value is cut, so the line stays readable."""
    message = _error(tmp_path, f'[node]\nname = "{"n" * 5000}"\n')
    assert len(message) < 400 and "..." in message


def test_unknown_key_lists_only_keys_of_that_table(tmp_path: Path) -> None:
    """The known keys offered for [node] are [node]'s own, not the tables loaded beside it."""
    message = _error(tmp_path, "[node]\ncolour = 1\n")
    assert "known keys: advertise, ask_timeout_s" in message and "workers" not in message


def test_several_mistakes_share_one_line(tmp_path: Path) -> None:
    """Every bad field is named, joined on the one line."""
    message = _error(tmp_path, '[node]\nhwm = -1\nendpoint = "tcp://10.1.2.3:7000"\n')
    assert "node.hwm: must be >= 1 (got -1)" in message and "node.endpoint:" in message
    assert "loopback" in message


def test_a_cli_option_is_named_as_the_option(tmp_path: Path) -> None:
    """A bad override (a command option) is not blamed on the file's [node] table: it is named
    as the user gave it, on the command line; a bad key of the file beside it names the file."""
    path = tmp_path / "node.toml"
    path.write_text('[node]\nendpoint = "tcp://127.0.0.1:7470"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^command line: --endpoint: endpoint 'ipc' must be"):
        load_node_config(path, endpoint="ipc")
    path.write_text('[node]\nlog_level = "loud"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"node.toml: --endpoint: .*; node.log_level: unknown log level"):
        load_node_config(path, endpoint="ipc")


def test_good_config_still_loads() -> None:
    """The shipped example config loads, and its actor classes import."""
    path = Path(__file__).resolve().parents[3] / "configs" / "node.toml"
    cfg = load_node_config(path)
    check_node_actors(cfg, str(path))


def _node_with(tmp_path: Path, cls: str) -> str:
    path = tmp_path / "node.toml"
    path.write_text(f'[[workers]]\nname = "w-r"\nactors = [{{ name = "render", class = "{cls}" }}]\n')
    with pytest.raises(ConfigError) as info:
        check_node_actors(load_node_config(path), "node.toml")
    message = str(info.value)
    assert message.startswith("node.toml: workers.w-r.actors.render.class: "), message
    assert "\n" not in message
    return message


def test_actor_module_that_does_not_import(tmp_path: Path) -> None:
    """A missing module is named with the class path and Python's reason."""
    message = _node_with(tmp_path, "troupe_no_such_pkg.actors:Renderer")
    assert (
        "cannot import 'troupe_no_such_pkg.actors:Renderer': No module named 'troupe_no_such_pkg'" in message
    )


def test_actor_module_that_raises_while_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that fails while importing is reported with its exception, on one line."""
    (tmp_path / "troupe_test_raises.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    monkeypatch.chdir(tmp_path)
    message = _node_with(tmp_path, "troupe_test_raises:A")
    assert "RuntimeError: boom second line" in message


def test_missing_class_and_non_actor(tmp_path: Path) -> None:
    """A name the module lacks, and a class that is no Actor, are both refused with the reason."""
    assert "module 'troupe.actors.demo.actors' has no 'Nope'" in _node_with(
        tmp_path, "troupe.actors.demo.actors:Nope"
    )
    assert "is not a subclass of troupe.runtime.core.actor.Actor" in _node_with(tmp_path, "pathlib:Path")


@pytest.mark.parametrize("safe_path", ["", "1"])
def test_actor_classes_import_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, safe_path: str
) -> None:
    """As in a worker, a module in cwd imports, with ``PYTHONSAFEPATH`` set too (which keeps
    ``python -m`` from putting the cwd on the path: ev 12); what it prints while importing does
    not confuse the check, and it stays out of this process."""
    monkeypatch.setenv("PYTHONSAFEPATH", safe_path)
    (tmp_path / "troupe_test_cwd_actor.py").write_text(
        "print('{not json')\nfrom troupe.runtime import Actor\n\nclass Mine(Actor):\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "node.toml"
    path.write_text(
        '[[workers]]\nname = "w"\nactors = [{ name = "m", class = "troupe_test_cwd_actor:Mine" }]\n'
    )
    check_node_actors(load_node_config(path), str(path))
    assert "troupe_test_cwd_actor" not in sys.modules, "imported in a child, not here"


def test_an_actor_kwarg_its_class_does_not_take(tmp_path: Path) -> None:
    """A node actor's kwargs are checked against its constructor as its class is imported."""
    path = tmp_path / "node.toml"
    path.write_text(
        '[[workers]]\nname = "w"\nactors = [{ name = "e", class = "troupe.actors.demo.actors:Echo",'
        " kwargs = { delay = 1 } }]\n"
    )
    with pytest.raises(ConfigError) as info:
        check_node_actors(load_node_config(path), "node.toml")
    message = str(info.value)
    assert message.startswith("node.toml: workers.w.actors.e.kwargs: troupe.actors.demo.actors:Echo: ")
    assert "takes no argument 'delay'" in message, message


def test_actor_module_that_exits_while_importing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that ends the interpreter is still reported at its field, with its last words."""
    (tmp_path / "troupe_test_exits.py").write_text("import sys\nsys.exit('no GPU here')\n")
    monkeypatch.chdir(tmp_path)
    message = _node_with(tmp_path, "troupe_test_exits:A")
    assert "importing it ended the process (exit status 1): 'no GPU here'" in message


def test_an_option_is_named_as_the_command_line_spells_it() -> None:
    """``--tag`` (repeatable) and ``--logs``: the error said ``--tags``, an option that does not exist."""
    with pytest.raises(ConfigError, match=r"^command line: --tag: tag 'bad tag!' must be"):
        load_node_config(None, tags=("bad tag!",))


def _loaded(tmp_path: Path, text: str) -> NodeConfig:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return load_node_config(path)


def test_settings_that_do_nothing_are_named_for_a_warning(tmp_path: Path) -> None:
    """cf 6: a kind table under a typo and an advertise the endpoint never uses started the node
    without a word; each is named in one line (the node logs it as config_setting_ignored)."""
    cfg = _loaded(
        tmp_path,
        '[node]\nendpoint = "tcp://127.0.0.1:42150"\nadvertise = "10.9.9.9"\n'
        "[supervision.kinds.rendr]\nprogress_timeout_s = 120\n"
        '[[workers]]\nname = "w1"\nkind = "render"\n',
    )
    assert cfg.ignored_settings() == [
        "supervision.kinds.rendr: no [[workers]] table has kind 'rendr' (kinds: default, render), so "
        "it applies to no worker of the file; did you mean 'render'?",
        "node.advertise: ignored: used only with an endpoint that binds every interface "
        "(tcp://0.0.0.0:PORT), and node.endpoint is 'tcp://127.0.0.1:42150'",
    ]


def test_kind_tables_of_a_node_without_workers_are_for_pipeline_stages(tmp_path: Path) -> None:
    """A cluster node's kind tables name the stages whose replicas it will host: no warning; nor
    for a kind its workers have, nor for advertise with a wildcard endpoint."""
    stages_only = _loaded(tmp_path, "[supervision.kinds.render]\nprogress_timeout_s = 120\n")
    assert stages_only.ignored_settings() == []
    cfg = _loaded(
        tmp_path,
        '[node]\nendpoint = "tcp://0.0.0.0:42151"\nadvertise = "10.9.9.9"\ninsecure = true\n'
        "[supervision.kinds.render]\nprogress_timeout_s = 120\n"
        '[[workers]]\nname = "w1"\nkind = "render"\n',
    )
    assert cfg.ignored_settings() == []
