"""Job files: a TOML file that declares a job and its tasks, parsed and checked once.

A job file looks like this::

    [job]
    name = "render-0001"          # letters, digits, '.', '_', '-'; also the job id by default
                                  # (with count, short enough that its task ids fit 200)
    kind = "render"               # which handler runs the tasks (the rule of names too)
    max_attempts = 3              # failed attempts before a task is dead-lettered
    lease_s = 60                  # a lease lasts this long unless the worker renews it
    priority = 0                  # higher runs first (optional; integers fit in 64 bits)
    backoff_base_s = 1.0          # retry n waits base * 2**(n-1) seconds... (optional)
    backoff_max_s = 60.0          # ...at most this long (optional)
    count = 1000                  # either: tasks render-0001-000000 .. -000999,
    seed_start = 0                #         with seeds 0 .. 999

    [job.needs]                   # what each task holds while it runs (optional)
    cpu = 1
    gpu = 0

    [job.refs]                    # content-store references every task gets (optional)
    scenes = "cas://sha256/..."   # cas://sha256/<64 hex digits>, or an absolute path

    [job.speculation]             # backup copies for the tail (optional)
    enabled = true
    factor = 1.5
    min_runtime_s = 30
    max_copies = 1

    [[tasks]]                     # or: an explicit list instead of count
    id = "scene-17"               # optional; default "<name>-<index:06d>"
    seed = 17
    refs = { scene = "cas://sha256/..." }
    needs = { gpu = 1 }           # optional, overrides [job.needs] key by key
    locality = "node-3"           # optional: the node that already holds the context
    kind = "encode"               # optional: this task's kind, instead of [job].kind

Every mistake raises :class:`~troupe.runtime.errors.ConfigError` naming the file, the field and
the fix, e.g. ``jobs/x.toml: [job].count must be a positive integer, got -3``.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from troupe.runtime.core.config_messages import shipped_hint, short_repr
from troupe.runtime.errors import ConfigError

from .content_store import REF_PREFIX
from .output_store import TASK_ID_MOST_BYTES
from .state import JobPolicy, Resources, Speculation, SubmitJob, TaskSpec

__all__ = ["JobSpec", "TaskEntry", "check_job_id", "generated_task_id", "load_job", "parse_job"]


def generated_task_id(prefix: str, index: int) -> str:
    """The id of the ``index``-th task of a job of ``count`` tasks (or of a pipeline's items)."""
    return f"{prefix}-{index:06d}"


def _ids_too_long(prefix: str, count: int) -> tuple[str, int] | None:
    """Why the ids made from ``prefix`` for ``count`` tasks are too long, and the longest prefix
    whose ids fit; None when they fit.

    A prefix follows the rule of names (200 characters), but each task id adds a '-' and six
    or more digits, and a task id names its output's directory (the output store's bound). A job
    id that long was accepted, and every one of its tasks died at its first commit, on each of
    its attempts (report px 6)."""
    longest = generated_task_id(prefix, count - 1)  # the last index has the most digits
    over = len(longest) - TASK_ID_MOST_BYTES
    if over <= 0:
        return None
    digits = len(longest) - len(prefix) - 1
    why = (
        f"is {len(prefix)} characters: its task ids (it, '-' and {digits} digits) would be "
        f"{len(longest)}, over the {TASK_ID_MOST_BYTES} a task id may have (it names a directory)"
    )
    return why, len(prefix) - over


MAX_COUNT = 10_000_000  # one job's tasks live in the master's memory; split bigger runs
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_ID_RULE = "use 1-200 ASCII letters (a-z, A-Z), digits, '.', '_' or '-', starting with a letter or digit"
_INT64 = (-(2**63), 2**63 - 1)  # seeds are stored as SQLite integers, and every integer crosses the wire
# A task's handler reads a content reference from the store; a pipeline's job names its --out
# folder (an absolute path) among its refs, for the runs that resume it.
_CONTENT_REF = re.compile(re.escape(REF_PREFIX) + "[0-9a-f]{64}")

_JOB_KEYS = frozenset(
    {
        "name",
        "kind",
        "max_attempts",
        "lease_s",
        "priority",
        "backoff_base_s",
        "backoff_max_s",
        "count",
        "seed_start",
        "needs",
        "refs",
        "speculation",
    }
)
_TASK_KEYS = frozenset({"id", "seed", "refs", "needs", "locality", "kind"})
_NEEDS_KEYS = frozenset({"cpu", "gpu"})
_SPECULATION_KEYS = frozenset({"enabled", "factor", "min_runtime_s", "max_copies"})


@dataclass(frozen=True, slots=True)
class TaskEntry:
    """One explicit ``[[tasks]]`` entry, checked, with the job's defaults applied."""

    task_id: str
    seed: int
    refs: Mapping[str, str]
    needs: Resources
    locality: str | None
    kind: str | None = None  # None: the job's kind


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A checked job file.

    Attributes:
        source: the file it came from (for messages).
        name: the job's name, and its id unless :meth:`submit` is given another.
        kind: which handler runs its tasks.
        policy: retries, lease, backoff, priority and speculation.
        needs: what each generated task holds while it runs.
        refs: references every task gets.
        count: number of generated tasks, or None when ``entries`` lists them.
        seed_start: seed of the first generated task.
        entries: the explicit tasks, empty when ``count`` is set.
    """

    source: str
    name: str
    kind: str
    policy: JobPolicy
    needs: Resources = Resources()
    refs: Mapping[str, str] = field(default_factory=dict)
    count: int | None = None
    seed_start: int = 0
    entries: tuple[TaskEntry, ...] = ()

    def tasks(self, job_id: str | None = None) -> list[TaskSpec]:
        """Return the job's tasks in order: generated ones (``JOB_ID-000000``...; the job id is
        ``name`` unless given), or the explicit entries."""
        kind = self.kind
        if self.count is not None:
            refs, needs, start = dict(self.refs), self.needs, self.seed_start
            prefix = job_id or self.name
            return [
                TaskSpec(generated_task_id(prefix, i), kind, start + i, refs, needs)
                for i in range(self.count)
            ]
        return [
            TaskSpec(e.task_id, e.kind or kind, e.seed, e.refs, e.needs, e.locality) for e in self.entries
        ]

    def submit(self, job_id: str | None = None) -> SubmitJob:
        """Return the event that submits this job to a task book (under ``name`` by default).

        A job id given (``troupe ctl submit --id``) follows the rule of names, and names the
        generated tasks: the same file submitted again under another id is another job, where
        its tasks had kept the name's ids and were refused as used twice.

        Raises:
            ConfigError: ``job_id`` is no name, or the task ids it makes are too long (see
                :meth:`checked_id`).
        """
        self.checked_id(job_id)
        return SubmitJob(job_id or self.name, self.tasks(job_id), self.policy, self.name)

    def checked_id(self, job_id: str | None = None) -> str:
        """The id this job is submitted under (``job_id``, or its name), checked.

        A job id given follows the rule of names. The ids of the tasks a job of ``count`` makes
        from it (``ID-000000``...) must fit the bound of a task id: they are checked here, as the
        job is submitted, not when each task commits its output.

        Raises:
            ConfigError: ``job_id`` is no name, or the task ids made from the job's id would be
                too long; the message says how long the id may be.
        """
        if job_id is not None:
            check_job_id(job_id)
        prefix = job_id or self.name
        too_long = _ids_too_long(prefix, self.count) if self.count is not None else None
        if too_long is None:
            return prefix
        why, most = too_long
        if job_id is not None:
            raise ConfigError(
                f"job id {short_repr(job_id)} {why}; give a job id of at most {most} characters"
            )
        raise ConfigError(
            f"{self.source}: [job].name {short_repr(self.name)} {why}; shorten it to at most {most} "
            "characters, or submit the job under a shorter --id"
        )


def check_job_id(job_id: str) -> str:
    """``job_id`` as given, if it follows the rule of names (it names outputs and tasks).

    Raises:
        ConfigError: it does not; the message says the rule.
    """
    if not (isinstance(job_id, str) and _ID.fullmatch(job_id)):
        raise ConfigError(f"job id {short_repr(job_id)} cannot name outputs; {_ID_RULE}")
    return job_id


def load_job(path: str | os.PathLike[str]) -> JobSpec:
    """Read and check a job file.

    Args:
        path: the TOML file.

    Returns:
        The checked job.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or breaks a rule; the message names
            the file, the field and the fix.
    """
    source = str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        advice = shipped_hint(Path(path)) or "; check the path"
        raise ConfigError(f"{source}: no such job file{advice}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc}); save the file as UTF-8") from None
    except OSError as exc:
        raise ConfigError(
            f"{source}: cannot read the job file ({exc.strerror}); check that it is a readable file"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}; fix the syntax there") from None
    if not data:
        raise ConfigError(
            f"{source}: the job file is empty; add a [job] table with at least "
            "name, kind and count (see configs/job-example.toml)"
        )
    return parse_job(data, source)


def parse_job(data: Mapping[str, Any], source: str = "<job>") -> JobSpec:
    """Check a job given as parsed TOML (a dict), e.g. one embedded in another config.

    Args:
        data: the TOML document as a dict, with a ``job`` table and maybe ``tasks``.
        source: what to call it in messages.

    Returns:
        The checked job.

    Raises:
        ConfigError: a rule is broken; the message names ``source``, the field and the fix.
    """
    p = _Parser(source)
    p.keys(data, {"job", "tasks"}, "the top level")
    if "job" not in data:
        p.fail("[job] is missing; add a [job] table with at least name and kind")
    job = p.table(data, "job", "the top level")
    p.keys(job, _JOB_KEYS, "[job]")
    name = p.ident(job, "name", "[job]")
    kind = p.ident(job, "kind", "[job]", "is not a kind")
    needs = p.needs(p.table(job, "needs", "[job]"), "[job.needs]", Resources())
    refs = p.refs(job.get("refs", {}), "[job].refs")
    base = p.number(job, "backoff_base_s", "[job]", 1.0, minimum=0.0)
    policy = JobPolicy(
        max_attempts=p.integer(job, "max_attempts", "[job]", 3, minimum=1),
        lease_s=p.number(job, "lease_s", "[job]", 60.0, minimum=0.0, positive=True),
        backoff_base_s=base,
        backoff_max_s=p.number(job, "backoff_max_s", "[job]", max(base, 60.0), minimum=base),
        priority=p.integer(job, "priority", "[job]", 0),
        speculation=p.speculation(p.table(job, "speculation", "[job]")),
    )
    has_count, has_tasks = "count" in job, "tasks" in data
    if has_count == has_tasks:
        p.fail(
            "give either [job].count (with [job].seed_start) or a [[tasks]] list; "
            + ("not both" if has_count else "there is neither")
        )
    if has_count:
        count = p.integer(
            job,
            "count",
            "[job]",
            0,
            minimum=1,
            maximum=MAX_COUNT,
            what=f"a positive integer (at most {MAX_COUNT}; split bigger runs)",
        )
        start = p.integer(job, "seed_start", "[job]", 0, minimum=_INT64[0], maximum=_INT64[1] - count + 1)
        return JobSpec(source, name, kind, policy, needs, refs, count, start)
    if "seed_start" in job:
        p.fail("[job].seed_start only goes with [job].count; give each [[tasks]] entry a seed")
    entries = p.entries(data["tasks"], name, needs, refs)
    return JobSpec(source, name, kind, policy, needs, refs, None, 0, entries)


class _Parser:
    """Field checks that raise ConfigError with the source, the field and the fix."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.source}: {message}")

    def keys(self, table: Mapping[str, Any], known: set[str] | frozenset[str], where: str) -> None:
        for key in table:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.fail(
                    f"unknown key {short_repr(key)} in {where}; {hint}known keys: {', '.join(sorted(known))}"
                )

    def table(self, parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
        value = parent.get(key, {})
        if not isinstance(value, dict):
            self.fail(f"{where}.{key} must be a table, got {short_repr(value)}")
        return value

    def string(self, table: Mapping[str, Any], key: str, where: str) -> str:
        value = table.get(key)
        if value is None:
            self.fail(f'{where}.{key} is missing; add {key} = "..."')
        if not isinstance(value, str) or not value.strip():
            self.fail(f"{where}.{key} must be a non-empty string, got {short_repr(value)}")
        return value

    def ident(self, table: Mapping[str, Any], key: str, where: str, why: str = "cannot name outputs") -> str:
        value = self.string(table, key, where)
        if not _ID.fullmatch(value):
            self.fail(f"{where}.{key} {short_repr(value)} {why}; {_ID_RULE}")
        return value

    def integer(
        self,
        table: Mapping[str, Any],
        key: str,
        where: str,
        default: int,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        what: str | None = None,
    ) -> int:
        value = table.get(key, default)
        bad = not isinstance(value, int) or isinstance(value, bool)
        if bad or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            what = what or "an integer" + _bounds(minimum, maximum)
            self.fail(f"{where}.{key} must be {what}, got {short_repr(value)}")
        if not _INT64[0] <= value <= _INT64[1]:
            low = _INT64[0] if minimum is None else minimum
            self.fail(f"{where}.{key} must be an integer{_bounds(low, _INT64[1])}, got {short_repr(value)}")
        return int(value)

    def number(
        self,
        table: Mapping[str, Any],
        key: str,
        where: str,
        default: float,
        *,
        minimum: float,
        positive: bool = False,
    ) -> float:
        value = table.get(key, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < minimum or (positive and value <= minimum):
            rule = f"> {minimum:g}" if positive else f">= {minimum:g}"
            what = "a finite number" if ok and not math.isfinite(value) else "a number"
            self.fail(f"{where}.{key} must be {what} {rule}, got {short_repr(value)}")
        return float(value)

    def boolean(self, table: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            self.fail(f"{where}.{key} must be true or false, got {short_repr(value)}")
        return value

    def refs(self, value: Any, where: str) -> dict[str, str]:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            self.fail(
                f'{where} must be a table of strings, like {{ scene = "cas://..." }}, got {short_repr(value)}'
            )
        for key, ref in value.items():
            if not (_CONTENT_REF.fullmatch(ref) or (os.path.isabs(ref) and ref.isprintable())):
                shown = key if _ID.fullmatch(key) else short_repr(key)
                self.fail(
                    f"{where}.{shown} must be a content reference {REF_PREFIX}<64 hex digits> (or an "
                    f"absolute path), got {short_repr(ref)}; put the object in the content store and "
                    "give its reference"
                )
        return dict(value)

    def needs(self, table: Mapping[str, Any], where: str, default: Resources) -> Resources:
        self.keys(table, _NEEDS_KEYS, where)
        cpu = self.number(table, "cpu", where, default.cpu, minimum=0.0)
        gpu = self.integer(table, "gpu", where, default.gpu, minimum=0, what="a whole number of GPUs >= 0")
        return Resources(cpu, gpu)

    def speculation(self, table: Mapping[str, Any]) -> Speculation:
        where, d = "[job.speculation]", Speculation()
        self.keys(table, _SPECULATION_KEYS, where)
        return Speculation(
            enabled=self.boolean(table, "enabled", where, d.enabled),
            factor=self.number(table, "factor", where, d.factor, minimum=1.0),
            min_runtime_s=self.number(table, "min_runtime_s", where, d.min_runtime_s, minimum=0.0),
            max_copies=self.integer(table, "max_copies", where, d.max_copies, minimum=0),
        )

    def entries(
        self, value: Any, name: str, needs: Resources, refs: Mapping[str, str]
    ) -> tuple[TaskEntry, ...]:
        if not isinstance(value, list) or not value:
            self.fail(
                "[[tasks]] must be a non-empty list of tables; add [[tasks]] entries or use [job].count"
            )
        if len(value) > MAX_COUNT:
            self.fail(f"[[tasks]] has {len(value)} entries, at most {MAX_COUNT}; split the job")
        entries: list[TaskEntry] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(value):
            where = f"[[tasks]] #{i + 1}"
            if not isinstance(item, dict):
                self.fail(f"{where} must be a table, got {short_repr(item)}")
            self.keys(item, _TASK_KEYS, where)
            task_id = self.ident(item, "id", where) if "id" in item else self.generated_id(name, i, where)
            if task_id in seen:
                self.fail(
                    f"{where}.id {short_repr(task_id)} repeats [[tasks]] #{seen[task_id] + 1}; "
                    "give every task its own id"
                )
            seen[task_id] = i
            if "seed" not in item:
                self.fail(f"{where}.seed is missing; add seed = <integer>")
            seed = self.integer(item, "seed", where, 0, minimum=_INT64[0], maximum=_INT64[1])
            locality = self.string(item, "locality", where) if "locality" in item else None
            task_kind = self.ident(item, "kind", where, "is not a kind") if "kind" in item else None
            task_refs = {**refs, **self.refs(item.get("refs", {}), f"{where}.refs")}
            task_needs = self.needs(self.table(item, "needs", where), f"{where}.needs", needs)
            entries.append(TaskEntry(task_id, seed, task_refs, task_needs, locality, task_kind))
        return tuple(entries)

    def generated_id(self, name: str, index: int, where: str) -> str:
        """The id of a ``[[tasks]]`` entry that gives none, made from the job's name."""
        too_long = _ids_too_long(name, index + 1)
        if too_long is not None:
            why, most = too_long
            self.fail(
                f"{where} has no id, and [job].name {short_repr(name)} {why}; give the entry an id, "
                f"or shorten the name to at most {most} characters"
            )
        return generated_task_id(name, index)


def _bounds(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" between {minimum} and {maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    return f" <= {maximum}" if maximum is not None else ""
