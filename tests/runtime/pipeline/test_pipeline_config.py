"""Pipeline TOML files: a good one loads into frozen configs, every bad one is named with its field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from troupe.actors.datagen.config import DEFAULT_PIPELINE, default_pipeline
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.config import MAX_NAME
from troupe.runtime.pipeline.config import PipelineConfig, load_pipeline
from troupe.runtime.tasks.jobspec import MAX_COUNT, generated_task_id
from troupe.runtime.tasks.output_store import TASK_ID_MOST_BYTES, OutputStore

REPO = Path(__file__).resolve().parents[3]

GOOD = """
[pipeline]
name = "two-step"
items = 10
seed_start = 100
slots = 3
max_attempts = 2
scale_interval_s = 0.25

[[stages]]
name = "first"
actor = "troupe.actors.bench.synthetic:CostStage"
replicas = 1
max_replicas = 2
batch = 2
queue = 5
resources = { cpu = 0.5, gpu = 0 }
kwargs = { cost_s = 0.01 }

[[stages]]
name = "second"
actor = "troupe.actors.bench.synthetic:CostStage"
min_replicas = 0

[[stages]]
name = "side"
actor = "troupe.actors.bench.synthetic:CostStage"
after = "first"
"""

ONE_STAGE = """
[[stages]]
name = "{name}"
actor = "troupe.actors.bench.synthetic:CostStage"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipe.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    message = str(info.value)
    assert str(path) in message, "the error names the file"
    return message


def test_good_file_loads_every_field(tmp_path: Path) -> None:
    """A complete file loads with its values, stage defaults filled in, and the graph resolved."""
    cfg = load_pipeline(_write(tmp_path, GOOD))
    assert (cfg.name, cfg.items, cfg.seed_start, cfg.slot_budget) == ("two-step", 10, 100, 3)
    assert (cfg.max_attempts, cfg.scale_interval_s) == (2, 0.25)
    first, second, _side = cfg.stages
    assert (first.replicas, first.most, first.batch, first.queue) == (1, 2, 2, 5)
    assert first.resources.cpu == 0.5 and first.kwargs == {"cost_s": 0.01}
    assert (second.replicas, second.min_replicas, second.most, second.queue) == (1, 0, 1, 8)
    assert [cfg.upstream(i) for i in range(3)] == [None, 0, 0]
    assert cfg.downstream(0) == [1, 2] and cfg.downstream(1) == [] and cfg.downstream(2) == []


def test_overrides_replace_pipeline_fields(tmp_path: Path) -> None:
    """Keyword overrides (the command's options) win over the file; None leaves the file's value."""
    cfg = load_pipeline(_write(tmp_path, GOOD), items=3, seed_start=None)
    assert (cfg.items, cfg.seed_start) == (3, 100)


def test_slot_budget_defaults_to_starting_replicas(tmp_path: Path) -> None:
    """Without ``slots`` the budget is the sum of the stages' starting replicas."""
    text = ONE_STAGE.format(name="a") + "replicas = 2\nmax_replicas = 4\n" + ONE_STAGE.format(name="b")
    assert load_pipeline(_write(tmp_path, text)).slot_budget == 3


def test_slots_below_the_starting_replicas_are_refused(tmp_path: Path) -> None:
    """Every stage starts its replicas whatever ``slots`` says: a budget below their sum was
    accepted and silently exceeded (cf 4). It is refused in one line, with the least it may be."""
    stages = ONE_STAGE.format(name="a") + "replicas = 2\n" + ONE_STAGE.format(name="b")
    text = "[pipeline]\nslots = 2\n" + stages
    message = _error(_write(tmp_path, text))
    expected = "pipeline.slots: 2 is fewer than the stages' starting replicas (3); set slots to 3 or more"
    assert expected in message and "\n" not in message, message
    exact = load_pipeline(_write(tmp_path, text.replace("slots = 2", "slots = 3")))
    assert exact.slot_budget == 3


def test_config_is_frozen(tmp_path: Path) -> None:
    """A loaded config cannot be changed in place."""
    cfg = load_pipeline(_write(tmp_path, GOOD))
    with pytest.raises(ValueError):
        cfg.items = 5  # type: ignore[misc]
    with pytest.raises(ValueError):
        cfg.stages[0].replicas = 3  # type: ignore[misc]


def test_missing_stages(tmp_path: Path) -> None:
    """A file with no [[stages]] is refused, saying a stage table is needed."""
    message = _error(_write(tmp_path, '[pipeline]\nname = "empty"\n'))
    assert "[[stages]]" in message


def test_duplicate_stage_names(tmp_path: Path) -> None:
    """Two stages with one name are refused, naming the repeated name."""
    message = _error(_write(tmp_path, ONE_STAGE.format(name="twice") * 2))
    assert "unique" in message and "twice" in message


def test_after_must_name_an_earlier_stage(tmp_path: Path) -> None:
    """``after`` naming a later (or unknown) stage is refused, naming the stage and the field by
    its path, as every other field's error (it said ``(top level): stage 'a': after = ...``)."""
    text = ONE_STAGE.format(name="a") + 'after = "b"\n' + ONE_STAGE.format(name="b")
    message = _error(_write(tmp_path, text))
    assert "stages.a.after = 'b' must name an earlier stage" in message, message
    assert "(top level)" not in message


def test_replica_bounds_out_of_order(tmp_path: Path) -> None:
    """min_replicas > replicas > max_replicas is refused at that stage's field path, with the fix."""
    text = ONE_STAGE.format(name="a") + "min_replicas = 3\nreplicas = 2\nmax_replicas = 1\n"
    message = _error(_write(tmp_path, text))
    assert "stages.a: " in message, "the stage is named by its name"
    assert "min_replicas <= replicas <= max_replicas" in message and "3 <= 2 <= 1" in message


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("queue = 0", "stages.a.queue"),
        ("batch = -1", "stages.a.batch"),
        ("colour = 'red'", "stages.a.colour"),
    ],
)
def test_bad_stage_field_is_named(tmp_path: Path, extra: str, field: str) -> None:
    """An out-of-range or unknown stage field is refused with its path."""
    message = _error(_write(tmp_path, ONE_STAGE.format(name="a") + extra + "\n"))
    assert field in message


def test_unknown_section(tmp_path: Path) -> None:
    """A top-level table other than [pipeline] and [[stages]] is refused, naming it and the expected ones."""
    message = _error(_write(tmp_path, "[pipelines]\nitems = 3\n" + ONE_STAGE.format(name="a")))
    assert "pipelines" in message and "[pipeline]" in message


def test_unknown_pipeline_field(tmp_path: Path) -> None:
    """A misspelt [pipeline] field is refused with its name."""
    message = _error(_write(tmp_path, "[pipeline]\nitem = 3\n" + ONE_STAGE.format(name="a")))
    assert "item" in message


def test_bad_toml(tmp_path: Path) -> None:
    """A file that is not TOML is refused as such, with the parser's position."""
    message = _error(_write(tmp_path, "[pipeline\nname = \n"))
    assert "not valid TOML" in message and "line" in message


def test_missing_file(tmp_path: Path) -> None:
    """A path with no file is refused, naming the path."""
    message = _error(tmp_path / "nowhere.toml")
    assert "no such pipeline file" in message


def test_shipped_datagen_config_equals_embedded_default() -> None:
    """configs/datagen.toml and the embedded default pipeline never drift apart."""
    path = REPO / "configs" / "datagen.toml"
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    assert {**raw["pipeline"], "stages": raw["stages"]} == DEFAULT_PIPELINE
    assert load_pipeline(path) == default_pipeline()
    assert isinstance(default_pipeline(), PipelineConfig)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            ONE_STAGE.format(name="render") + 'replicas = "2"\n',
            "stages.render.replicas: must be an integer (got '2')",
        ),
        (
            ONE_STAGE.format(name="render") + "queue = 4.0\n",
            "stages.render.queue: must be an integer (got 4.0)",
        ),
        (
            ONE_STAGE.format(name="a")
            + ONE_STAGE.format(name="b")
            + ONE_STAGE.format(name="render")
            + "replicas = -1\n",
            "stages.render.replicas: must be >= 1 (got -1)",
        ),
        (
            "[pipeline]\nscale_interval_s = nan\n" + ONE_STAGE.format(name="a"),
            "pipeline.scale_interval_s: must be a finite number (got nan)",
        ),
        (  # past threading.TIMEOUT_MAX a wait overflows: no duration is over a year
            "[pipeline]\nscale_interval_s = 1e300\n" + ONE_STAGE.format(name="a"),
            "pipeline.scale_interval_s: must be <= 31536000.0 (got 1e+300)",
        ),
        (
            ONE_STAGE.format(name="render") + "progress_timeout_s = 1e12\n",
            "stages.render.progress_timeout_s: must be <= 31536000.0 (got 1000000000000.0)",
        ),
        (
            "[pipeline]\nitem = 3\n" + ONE_STAGE.format(name="a"),
            "pipeline.item: unknown key; did you mean 'items'?",
        ),
        ("[pipeline]\nitems = 0\n" + ONE_STAGE.format(name="a"), "pipeline.items: must be >= 1 (got 0)"),
        ('[pipeline]\nname = "[/x]"\n' + ONE_STAGE.format(name="a"), "pipeline.name: may hold only"),
        (  # the stage name's pattern has no '.': the message said '.' was allowed
            ONE_STAGE.format(name="a.b"),
            "stages.a.b.name: may hold only ASCII letters (a-z, A-Z), digits, '_' and '-' (got 'a.b')",
        ),
        (ONE_STAGE.format(name="s" * 300), "stages.0.name: must have at most 100 characters"),
        (
            ONE_STAGE.format(name="a") + "resources = { cpu = 1, gpus = 1 }\n",
            "stages.a.resources.gpus: unknown key; did you mean 'gpu'?",
        ),
        ("", "the pipeline file is empty"),
        ("stages = 3\n", "stages must be [[stages]] tables, got 3"),
    ],
)
def test_bad_field_is_one_line_with_path_and_value(tmp_path: Path, text: str, expected: str) -> None:
    """Each mistake is one line naming the file, the field (a stage by its name) and the value."""
    message = _error(_write(tmp_path, text))
    assert expected in message and "\n" not in message, message


def test_stage_actor_classes_are_checked(tmp_path: Path) -> None:
    """A stage class that does not import, or is no StageActor, is named at its stage's field."""
    from troupe.runtime.core.loading import check_stage_actors

    for actor, reason in [
        (
            "troupe_no_such_pkg.stages:Render",
            "cannot import 'troupe_no_such_pkg.stages:Render': No module named",
        ),
        ("troupe.actors.demo.actors:Echo", "is not a subclass of troupe.runtime.pipeline.stage.StageActor"),
    ]:
        text = ONE_STAGE.format(name="ok") + ONE_STAGE.format(name="render").replace(
            "troupe.actors.bench.synthetic:CostStage", actor
        )
        with pytest.raises(ConfigError) as info:
            check_stage_actors(load_pipeline(_write(tmp_path, text)), "pipe.toml")
        assert str(info.value).startswith("pipe.toml: stages.render.actor: ")
        assert actor in str(info.value) and reason in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ("{ cost = 0.01 }", "takes no argument 'cost' (did you mean 'cost_s'?); its arguments: cost_s, busy"),
        ("{ speed = 2 }", "takes no argument 'speed'; its arguments: cost_s, busy"),
    ],
)
def test_stage_kwargs_the_constructor_does_not_take_are_named(
    tmp_path: Path, kwargs: str, reason: str
) -> None:
    """A kwarg the stage's class does not take is refused before a replica starts."""
    from troupe.runtime.core.loading import check_stage_actors

    text = ONE_STAGE.format(name="render") + f"kwargs = {kwargs}\n"
    with pytest.raises(ConfigError) as info:
        check_stage_actors(load_pipeline(_write(tmp_path, text)), "pipe.toml")
    message = str(info.value)
    assert message.startswith("pipe.toml: stages.render.kwargs: troupe.actors.bench.synthetic:CostStage: ")
    assert reason in message and "\n" not in message, message


def test_a_constructor_argument_without_a_default_must_be_given() -> None:
    """A required argument missing from kwargs is named; a constructor taking **kwargs takes any."""
    from troupe.runtime.core.loading import kwargs_problem

    class Needs:
        def __init__(self, root: str, fps: int = 10) -> None: ...

    class Open:
        def __init__(self, **options: object) -> None: ...

    assert kwargs_problem(Needs, ["fps"]) == "needs 'root' in kwargs; its arguments: root, fps"
    assert kwargs_problem(Needs, ["root"]) is None
    assert kwargs_problem(Open, ["anything"]) is None


def test_default_pipeline_actors_import() -> None:
    """The embedded pipeline that `troupe run` uses passes the actor check."""
    from troupe.runtime.core.loading import check_stage_actors

    check_stage_actors(default_pipeline(), "the default pipeline")


@pytest.mark.parametrize("typo", ["outt", "output", "ou", "Out"])
def test_a_typo_of_the_out_placeholder_is_refused(typo: str) -> None:
    """``{outt}/eps`` was taken literally: a folder named ``{outt}`` in the current directory."""
    stage = {"name": "store", "actor": "m:S", "kwargs": {"store": f"{{{typo}}}/eps"}}
    with pytest.raises(ValueError, match=f"{{{typo}}} is no placeholder; did you mean {{out}}"):
        PipelineConfig.model_validate({"name": "p", "items": 2, "stages": [stage]})


def test_a_stages_own_braces_pass() -> None:
    stage = {
        "name": "store",
        "actor": "m:S",
        "kwargs": {"name": "frame_{index:04d}_{seed}.png", "o": "{out}/x"},
    }
    cfg = PipelineConfig.model_validate({"name": "p", "items": 2, "stages": [stage]})
    assert cfg.with_out("/d").stages[0].kwargs == {"name": "frame_{index:04d}_{seed}.png", "o": "/d/x"}


def test_out_is_replaced_in_lists_and_tables_of_kwargs() -> None:
    """``dirs = ["{out}/a"]`` was taken literally: a folder named ``{out}`` in the current
    directory, outside --out, shared by every run (report cf 2)."""
    kwargs = {"dirs": ["{out}/a", ["{out}/b", 3]], "paths": {"c": "{out}/c", "n": {"d": "{out}"}}, "k": 1}
    stage = {"name": "store", "actor": "m:S", "kwargs": kwargs}
    cfg = PipelineConfig.model_validate({"name": "p", "items": 2, "stages": [stage]})
    assert cfg.with_out("/d").stages[0].kwargs == {
        "dirs": ["/d/a", ["/d/b", 3]],
        "paths": {"c": "/d/c", "n": {"d": "/d"}},
        "k": 1,
    }


def test_a_typo_of_the_out_placeholder_in_a_table_is_refused_with_its_path() -> None:
    stage = {"name": "store", "actor": "m:S", "kwargs": {"paths": {"c": "{out}/c", "d": ["x", "{outt}/d"]}}}
    with pytest.raises(ValueError, match=r"kwargs\.paths\.d\[1\] = '\{outt\}/d': \{outt\} is no placeholder"):
        PipelineConfig.model_validate({"name": "p", "items": 2, "stages": [stage]})


def test_the_longest_name_and_most_items_make_item_ids_that_can_name_outputs(tmp_path: Path) -> None:
    """A pipeline's items are named like a job's tasks, from its name (``NAME-000000``), and a job
    id of 194-200 characters made task ids too long to commit (report px 6). The bounds of
    ``name`` and ``items`` keep every item id within the task-id bound, so nothing checks it at
    run time; this says so should either bound grow."""
    stage = ONE_STAGE.format(name="a")
    longer = _write(tmp_path, f'[pipeline]\nname = "{"p" * (MAX_NAME + 1)}"\n' + stage)
    assert f"pipeline.name: must have at most {MAX_NAME} characters" in _error(longer)
    cfg = load_pipeline(
        _write(tmp_path, f'[pipeline]\nname = "{"p" * MAX_NAME}"\nitems = {MAX_COUNT}\n' + stage)
    )
    last = generated_task_id(cfg.name, cfg.items - 1)
    assert len(last.encode()) <= TASK_ID_MOST_BYTES
    assert not OutputStore(tmp_path / "out").is_committed(last)  # not refused
