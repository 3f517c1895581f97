"""Job files: good ones load into task specs, every bad one names the file, field and fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.jobspec import JobSpec, generated_task_id, load_job, parse_job
from troupe.runtime.tasks.output_store import OutputStore
from troupe.runtime.tasks.state import Reject, Resources, Speculation, TaskSpec

SCENES, ROBOT, S8 = (f"cas://sha256/{c * 64}" for c in "abc")


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


COUNTED = f"""
    [job]
    name = "render-0001"
    kind = "render"
    max_attempts = 5
    lease_s = 30
    priority = 2
    backoff_base_s = 0.5
    backoff_max_s = 8
    count = 3
    seed_start = 100

    [job.needs]
    cpu = 2
    gpu = 1

    [job.refs]
    scenes = "{SCENES}"

    [job.speculation]
    enabled = false
    factor = 2.0
    min_runtime_s = 12
    max_copies = 2
"""

LISTED = f"""
    [job]
    name = "plan"
    kind = "plan"

    [job.needs]
    cpu = 0.5

    [job.refs]
    robot = "{ROBOT}"

    [[tasks]]
    seed = 7

    [[tasks]]
    id = "special"
    seed = 8
    refs = {{ scene = "{S8}" }}
    needs = {{ gpu = 1 }}
    locality = "node-3"
"""


def test_counted_job_generates_ids_seeds_and_policy(tmp_path: Path) -> None:
    """A job with count gets ids <name>-000000.. and seeds seed_start.., and all its settings."""
    job = load_job(write(tmp_path, COUNTED))
    assert (job.name, job.kind, job.count) == ("render-0001", "render", 3)
    policy = job.policy
    assert (policy.max_attempts, policy.lease_s, policy.priority) == (5, 30.0, 2)
    assert (policy.backoff_base_s, policy.backoff_max_s) == (0.5, 8.0)
    assert policy.speculation == Speculation(False, 2.0, 12.0, 2)
    assert job.tasks() == [
        TaskSpec(f"render-0001-00000{i}", "render", 100 + i, {"scenes": SCENES}, Resources(2.0, 1))
        for i in range(3)
    ]


def test_listed_tasks_get_default_ids_and_merge_job_defaults(tmp_path: Path) -> None:
    """Explicit tasks keep their ids (or get <name>-<index>) and override needs and refs per key."""
    job = load_job(write(tmp_path, LISTED))
    first, second = job.tasks()
    assert first == TaskSpec("plan-000000", "plan", 7, {"robot": ROBOT}, Resources(0.5, 0), None)
    assert second == TaskSpec(
        "special", "plan", 8, {"robot": ROBOT, "scene": S8}, Resources(0.5, 1), "node-3"
    )


def test_defaults_apply_when_fields_are_left_out() -> None:
    """A minimal job gets max_attempts 3, lease_s 60, speculation on, one CPU per task."""
    job = parse_job({"job": {"name": "j", "kind": "k", "count": 1}})
    assert (job.policy.max_attempts, job.policy.lease_s) == (3, 60.0)
    assert job.policy.speculation.enabled and job.needs == Resources(1.0, 0)
    assert job.tasks()[0].seed == 0


def test_a_loaded_job_is_accepted_by_the_task_book(tmp_path: Path) -> None:
    """The SubmitJob built from a job file is accepted under the job's name."""
    job: JobSpec = load_job(write(tmp_path, LISTED))
    event = job.submit()
    assert event.job_id == "plan" and event.policy == job.policy
    book = TaskBook()
    assert not any(isinstance(c, Reject) for c in book.handle(event, 0.0))
    assert book.handle(job.submit("plan-again"), 0.0)  # ids clash: rejected, not raised
    assert [j.job_id for j in book.jobs()] == ["plan"]


BASE = '[job]\nname = "j"\nkind = "k"\n'

BAD = [
    (BASE + "count = -3\n", "[job].count must be a positive integer", "got -3"),
    (BASE + 'count = "3"\n', "[job].count must be a positive integer", "got '3'"),
    ('[jobs]\nname = "j"\n', "unknown key 'jobs' in the top level", "did you mean 'job'"),
    ("tasks = []\n", "[job] is missing", "add a [job] table"),
    ('[job]\nkind = "k"\ncount = 1\n', "[job].name is missing", 'add name = "..."'),
    (
        '[job]\nname = "a/b"\nkind = "k"\ncount = 1\n',
        "[job].name 'a/b' cannot name outputs",
        "ASCII letters (a-z, A-Z), digits",
    ),
    ('[job]\nname = "j"\nkind = ""\ncount = 1\n', "[job].kind must be a non-empty string", ""),
    (BASE + "count = 1\nlease_sec = 5\n", "unknown key 'lease_sec' in [job]", "did you mean 'lease_s'"),
    (BASE + "count = 1\n[[tasks]]\nseed = 1\n", "either [job].count", "not both"),
    (BASE, "either [job].count", "there is neither"),
    (BASE + "count = 1\nlease_s = 0\n", "[job].lease_s must be a number > 0", "got 0"),
    (BASE + "count = 1\nmax_attempts = 0\n", "[job].max_attempts must be an integer >= 1", "got 0"),
    (BASE + "count = 1\nmax_attempts = true\n", "[job].max_attempts must be an integer", "got True"),
    (
        BASE + "count = 1\nbackoff_base_s = 10\nbackoff_max_s = 5\n",
        "[job].backoff_max_s must be a number >= 10",
        "got 5",
    ),
    (
        BASE + "count = 1\n[job.needs]\ngpu = 1.5\n",
        "[job.needs].gpu must be a whole number of GPUs >= 0",
        "got 1.5",
    ),
    (BASE + "count = 1\n[job.needs]\ncpu = -1\n", "[job.needs].cpu must be a number >= 0", ""),
    (
        BASE + "count = 1\n[job.needs]\nmemory = 4\n",
        "unknown key 'memory' in [job.needs]",
        "known keys: cpu, gpu",
    ),
    (
        BASE + "count = 1\n[job.speculation]\nfactor = 0.5\n",
        "[job.speculation].factor must be a number >= 1",
        "got 0.5",
    ),
    (
        BASE + "count = 1\n[job.speculation]\nenabled = 1\n",
        "[job.speculation].enabled must be true or false",
        "",
    ),
    (BASE + "count = 1\nrefs = { a = 1 }\n", "[job].refs must be a table of strings", ""),
    (BASE + '[[tasks]]\nid = "x"\n', "[[tasks]] #1.seed is missing", "add seed = <integer>"),
    (
        BASE + '[[tasks]]\nid = "x"\nseed = 1\n[[tasks]]\nid = "x"\nseed = 2\n',
        "[[tasks]] #2.id 'x' repeats [[tasks]] #1",
        "its own id",
    ),
    (BASE + '[[tasks]]\nseed = 1\nlocality = ""\n', "[[tasks]] #1.locality must be a non-empty", ""),
    (
        BASE + "[[tasks]]\nseed = 1\nnedds = { gpu = 1 }\n",
        "unknown key 'nedds' in [[tasks]] #1",
        "did you mean 'needs'",
    ),
    (
        BASE + "seed_start = 4\n[[tasks]]\nseed = 1\n",
        "[job].seed_start only goes with",
        "give each [[tasks]] entry a seed",
    ),
    (BASE + "tasks = 3\n", "unknown key 'tasks' in [job]", ""),
    (
        BASE + "count = 1\n[job.speculation]\nmax_copies = -1\n",
        "[job.speculation].max_copies must be an integer >= 0",
        "",
    ),
    (
        BASE + "count = 2\nseed_start = 9223372036854775807\n",
        "[job].seed_start must be an integer between",
        "got 9223372036854775807",
    ),
    ('[job]\nname = "j"\nkind = "k\n', "not valid TOML", "fix the syntax"),
    ("", "the job file is empty", "add a [job] table"),
    (BASE + "count = 1\nlease_s = nan\n", "[job].lease_s must be a finite number > 0", "got nan"),
    (BASE + "count = 1\nlease_s = inf\n", "[job].lease_s must be a finite number > 0", "got inf"),
    (BASE + "count = 1\nmax_attempts = 2.5\n", "[job].max_attempts must be an integer", "got 2.5"),
    ('[job]\nname = "j"\ncount = 1\n', "[job].kind is missing", 'add kind = "..."'),
    (
        '[job]\nname = "' + "n" * 300 + '"\nkind = "k"\ncount = 1\n',
        "[job].name 'nnnn",
        "cannot name outputs; use 1-200",
    ),
    (BASE + 'count = 1\n"[/x]" = 2\n', "unknown key '[/x]' in [job]", "known keys"),
    (
        '[job]\nname = "j"\nkind = "sl\\u001b[2Jeep"\ncount = 1\n',
        "[job].kind 'sl\\x1b[2Jeep' is not a kind",
        "letters",
    ),
    (BASE + '[[tasks]]\nseed = 1\nkind = "a b"\n', "[[tasks]] #1.kind 'a b' is not a kind", "letters"),
    (
        BASE + "count = 1\npriority = 99999999999999999999\n",
        "[job].priority must be an integer between -9223372036854775808 and 9223372036854775807",
        "got 99999999999999999999",
    ),
    (
        BASE + "count = 1\npriority = 9223372036854775808\n",
        "[job].priority must be",
        "got 9223372036854775808",
    ),
    (
        BASE + "count = 1\nmax_attempts = 99999999999999999999\n",
        "[job].max_attempts must be an integer between 1 and 9223372036854775807",
        "got 99999999999999999999",
    ),
    (
        BASE + "count = 1\n[job.speculation]\nmax_copies = 99999999999999999999\n",
        "[job.speculation].max_copies must be an integer between 0 and",
        "got 99999999999999999999",
    ),
    (
        BASE + 'count = 1\n[job.refs]\nparams = "not-a-ref"\n',
        "[job].refs.params must be a content reference cas://sha256/<64 hex digits>",
        "put the object in the content store",
    ),
    (
        BASE + '[[tasks]]\nseed = 1\nrefs = { scene = "cas://sha256/ABC" }\n',
        "[[tasks]] #1.refs.scene must be a content reference",
        "got 'cas://sha256/ABC'",
    ),
]


@pytest.mark.parametrize(("text", "field", "fix"), BAD, ids=[b[1][:40] for b in BAD])
def test_bad_job_files_raise_config_error_naming_file_field_and_fix(
    tmp_path: Path, text: str, field: str, fix: str
) -> None:
    """Each kind of mistake raises ConfigError that names the file, the field and the fix."""
    path = write(tmp_path, text, "bad.toml")
    with pytest.raises(ConfigError) as caught:
        load_job(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    assert field in message and fix in message, message
    assert "\n" not in message and len(message) < len(str(path)) + 400, "one readable line"


def test_tasks_must_be_a_list_of_tables(tmp_path: Path) -> None:
    """A top-level tasks key that is not an array of tables is refused."""
    with pytest.raises(ConfigError, match=r"\[\[tasks\]\] must be a non-empty list"):
        parse_job({"job": {"name": "j", "kind": "k"}, "tasks": 3}, "x.toml")
    with pytest.raises(ConfigError, match=r"\[\[tasks\]\] #1 must be a table"):
        parse_job({"job": {"name": "j", "kind": "k"}, "tasks": [3]}, "x.toml")


def test_unreadable_files_raise_config_error(tmp_path: Path) -> None:
    """A missing file, a directory, or bytes that are not UTF-8 raise ConfigError with the path."""
    with pytest.raises(ConfigError, match="no such job file"):
        load_job(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="cannot read the job file"):
        load_job(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_job(binary)


def test_a_ref_may_be_an_absolute_path_as_a_pipeline_s_job_names_its_out() -> None:
    """A pipeline's job names its --out folder among its refs: an absolute path is a ref too."""
    job = parse_job({"job": {"name": "j", "kind": "k", "count": 1, "refs": {"out": "/data/run 1"}}})
    assert job.tasks()[0].refs == {"out": "/data/run 1"}


@pytest.mark.parametrize(
    ("length", "count"), [(193, 2), (194, 2), (200, 1), (192, 1_000_001), (193, 1_000_001)]
)
def test_a_job_id_is_accepted_only_where_each_of_its_task_ids_can_name_an_output(
    tmp_path: Path, length: int, count: int
) -> None:
    """px 6: a job id of 194-200 characters was accepted, and every task it made (``ID-000000``)
    died at its first commit with InvalidTaskId; the bound is the output store's own."""
    job = parse_job({"job": {"name": "j", "kind": "k", "count": count}}, "x.toml")
    job_id = "h" * length
    longest = len(job_id) + 1 + max(6, len(str(count - 1)))
    if longest > 200:
        with pytest.raises(ConfigError, match=f"is {length} characters: .* would be {longest}, over the 200"):
            job.checked_id(job_id)
        return
    assert job.checked_id(job_id) == job_id
    last = generated_task_id(job_id, count - 1)
    assert len(last) == longest and not OutputStore(tmp_path).is_committed(last)  # not refused


def test_a_name_whose_task_ids_are_too_long_is_refused_with_the_file_and_the_most_it_may_be() -> None:
    job = parse_job({"job": {"name": "h" * 195, "kind": "k", "count": 2}}, "x.toml")
    with pytest.raises(ConfigError) as caught:
        job.submit()  # as the master takes it in, from a client that did not check it
    said = str(caught.value)
    assert said.startswith("x.toml: [job].name 'hhh") and "is 195 characters" in said, said
    assert said.endswith("shorten it to at most 193 characters, or submit the job under a shorter --id")
    assert job.checked_id("short") == "short"  # its ids are made from the id given then


def test_a_listed_task_without_an_id_whose_made_id_is_too_long_is_refused() -> None:
    tasks = [{"id": "given", "seed": 1}, {"seed": 2}]
    with pytest.raises(ConfigError) as caught:
        parse_job({"job": {"name": "h" * 194, "kind": "k"}, "tasks": tasks}, "x.toml")
    said = str(caught.value)
    assert said.startswith("x.toml: [[tasks]] #2 has no id, and [job].name 'hhh"), said
    assert said.endswith("give the entry an id, or shorten the name to at most 193 characters")
    job = parse_job({"job": {"name": "h" * 194, "kind": "k"}, "tasks": [{"id": "given", "seed": 1}]})
    assert [t.task_id for t in job.submit().tasks] == ["given"]
