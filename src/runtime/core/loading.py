"""Import actor classes by path (``package.module:Class``), with errors that say the fix.

:func:`check_node_actors` and :func:`check_stage_actors` import every class a config names
before anything starts, and check that its constructor takes the config's kwargs, so that a
typo is one line at the command instead of a worker that restarts until it is given up on.
They import in a child process started the way a worker is (``python -P -m troupe.lean_start``,
same environment and directory, so the same ``sys.path``: the current folder after the installed
packages, ``current_folder.py``): what imports there imports in the
workers, and the command's own process stays lean (an actor module may pull in torch or
initialise a GPU, which has no business in a node).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from troupe.lean_start import argv as lean_argv
from troupe.runtime.errors import ConfigError

from .actor import Actor
from .config_messages import short_repr
from .current_folder import find_spec_as_children_do, hidden_module_hint
from .kwargs_values import json_safe, kwargs_values_problem
from .process_role import set_role

if TYPE_CHECKING:
    from troupe.runtime.node.config import NodeConfig
    from troupe.runtime.pipeline.config import PipelineConfig

__all__ = [
    "check_node_actors",
    "check_node_preload",
    "check_stage_actors",
    "check_stage_actors_async",
    "first_failure",
    "installed_here",
    "kwargs_problem",
    "load_actor_class",
    "main",
    "stage_checks",
]

CHECK_ENV = "TROUPE_CHECK_CLASSES"
INSTALLED_ONLY_ENV = "TROUPE_CHECK_INSTALLED_ONLY"  # "1": installed_here's checks only
_IMPORT_GUARD_S = 600  # a module whose import hangs would hang every worker; say so, do not wait forever
_FIRST_NOTE_S = 30.0  # an import this long is said while it goes on (on_slow), then every minute
_EVERY_NOTE_S = 60.0
_PASSED: set[tuple[object, ...]] = set()  # the checks that passed in this process (see _check_in_child)
_BASES = {"actor": "troupe.runtime.core.actor:Actor", "stage": "troupe.runtime.pipeline.stage:StageActor"}


def _is_module(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError):  # its parent is a module, not a package
        return False


def load_actor_class(path: str, base: type[Actor] = Actor) -> type[Actor]:
    """Import ``module:Class`` (or ``module.Class``) and check it is a subclass of ``base``.

    Raises:
        ConfigError: the module or class does not exist or fails to import, or is not a ``base``.
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"actor class {path!r} must be written as 'package.module:ClassName'")
    if module_name == "__main__":  # each process has its own: the script is none of theirs
        raise ConfigError(
            f"actor class {path!r} is in the script being run (__main__), which the worker "
            f"processes cannot import: move {attr} into a module on their PYTHONPATH and name "
            f"it as 'module:{attr}'"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a module that raises while importing is as broken as a missing one
        hint = _where_hint(exc, module_name) or (
            hidden_module_hint(module_name) if isinstance(exc, ModuleNotFoundError) else ""
        )
        raise ConfigError(f"cannot import {path!r}: {_reason(exc)}{hint}") from exc
    cls = getattr(module, attr, None)
    # "pkg.module": no class named. Once the module is imported (by anything in this process)
    # its package holds it as an attribute, so a found module says the same as a missing one.
    if not sep and (inspect.ismodule(cls) or (cls is None and _is_module(path))):
        raise ConfigError(f"actor class {path!r} names a module, not a class: write it as '{path}:ClassName'")
    if cls is None:
        raise ConfigError(
            f"cannot import {path!r}: module {module_name!r} has no {attr!r}{hidden_module_hint(module_name)}"
        )
    if not isinstance(cls, type):
        raise ConfigError(f"{path!r} is not a class (found {short_repr(cls)})")
    if not issubclass(cls, base):
        raise ConfigError(f"{path!r} is not a subclass of {base.__module__}.{base.__qualname__}")
    return cls


def check_node_actors(cfg: NodeConfig, source: str, on_slow: Callable[[str], None] | None = None) -> None:
    """Import every actor class of a node config, as its workers will.

    ``on_slow`` is told a line after 30 s of imports, and every minute after, naming the class
    being imported (a slow disk, or a module that hangs as it imports: ten minutes at most).

    Raises:
        ConfigError: one line naming ``source``, the field (``workers.W.actors.A.class``) and why.
    """
    _check_in_child(
        source,
        [
            (f"workers.{w.name}.actors.{a.name}.class", a.cls, "actor", sorted(a.kwargs), json_safe(a.kwargs))
            for w in cfg.workers
            for a in w.actors
        ],
        on_slow,
    )


def check_node_preload(cfg: NodeConfig, source: str) -> None:
    """Find (not import) the top-level package of each module in ``[node] preload``.

    No worker imports a preload of its own accord, so one misspelt or not installed would be
    skipped by the template with nobody to say so; finding the package costs no import (one a
    found module raises as it imports is logged by the template at warning).

    Raises:
        ConfigError: one line naming ``source``, the entry and where it was looked for.
    """
    for entry in cfg.preload:
        module = entry.partition(":")[0]
        top = module.partition(".")[0]
        try:
            found = bool(top) and find_spec_as_children_do(top) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(
                f"{source}: node.preload: {entry!r} is not installed here: No module named {top!r}"
                + _looked_for(top, module)
            )


def check_stage_actors(cfg: PipelineConfig, source: str) -> None:
    """Import every stage's actor class, as its replicas will, and check it is a StageActor.

    Raises:
        ConfigError: one line naming ``source``, the field (``stages.S.actor``) and why.
    """
    _check_in_child(source, stage_checks(cfg))


# field, class path, kind, the names of its kwargs, their values (those that travel as JSON)
Check = tuple[str, str, str, list[str], dict[str, Any]]


def stage_checks(cfg: PipelineConfig) -> list[Check]:
    """The checks of :func:`check_stage_actors`: (field, class path, kind, kwarg names, kwargs)
    for each stage."""
    return [
        (f"stages.{s.name}.actor", s.actor, "stage", sorted(s.kwargs), json_safe(s.kwargs))
        for s in cfg.stages
    ]


def installed_here(checks: Sequence[Check]) -> list[Check]:
    """The checks whose class's module this process finds (importing its packages, not the
    module): a run on a cluster's nodes checks those on its own host before it submits
    anything, and leaves a module found only on the nodes' hosts to them."""
    kept = []
    for check in checks:
        path = check[1]
        module = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
        try:
            found = bool(module) and find_spec_as_children_do(module) is not None
        except Exception:  # a package that fails to import: the nodes' own import says why
            found = False
        if found:
            kept.append(check)
    return kept


def first_failure(
    checks: Sequence[Sequence[Any]], before: Callable[[str], None] | None = None
) -> tuple[str, str] | None:
    """Run ``checks`` (field, class path, kind, kwarg names, kwargs) in this process: the first
    failure's field and error, None if every class passed. Each class must import, be of its
    kind, take the names as its constructor's keyword arguments, and take their values
    (``kwargs_values``): a typo or a wrong value there would otherwise stop every replica as it
    starts. ``before`` is told each field before its import (the child reports it, so that an
    import that ends the process is placed). A node's template calls this too, having imported
    the classes for its workers anyway."""
    bases = {kind: load_actor_class(path) for kind, path in _BASES.items()}
    stages: dict[str, tuple[str, type, dict[str, Any]]] = {}  # by field: path, class, kwargs
    for where, path, kind, names, *values in checks:
        if before is not None:
            before(where)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # stdout carries the child's reports
                cls = load_actor_class(path, bases[kind])
        except ConfigError as exc:
            return where, str(exc)
        problem = kwargs_problem(cls, names)
        if problem is None and values:
            problem = kwargs_values_problem(cls, values[0])
        if problem is not None:
            return f"{where.rpartition('.')[0]}.kwargs", f"{path}: {problem}"
        if kind == "stage" and values:
            stages[where] = (path, cls, dict(values[0]))
    return _stages_problem(stages)


def _stages_problem(stages: dict[str, tuple[str, type, dict[str, Any]]]) -> tuple[str, str] | None:
    """The first stage whose kwargs do not fit the pipeline's other stages, by its class's
    ``check_stages`` (``StageActor.check_stages``): a writer's frame rate that is not its
    planner's failed the run's finalize after every item was made (report ds 2)."""
    by_name = {where.split(".")[1]: (cls, kwargs) for where, (_, cls, kwargs) in stages.items()}
    for where, (path, cls, kwargs) in stages.items():
        check = getattr(cls, "check_stages", None)
        if not callable(check):
            continue
        name = where.split(".")[1]
        try:
            check(dict(kwargs), {k: v for k, v in by_name.items() if k != name})
        except (ValueError, TypeError) as exc:  # ConfigError is a ValueError
            return f"{where.rpartition('.')[0]}.kwargs", f"{path}: {exc}"
    return None


def kwargs_problem(cls: type, names: Sequence[str]) -> str | None:
    """Why ``cls(**kwargs)`` with these keyword names would fail to bind; None if it binds (or
    the constructor's signature cannot be read: the replica will say)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    takes = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    listed = ", ".join(takes) or "none"
    for name in names:
        if name not in takes:
            close = difflib.get_close_matches(name, takes, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"takes no argument {name!r}{hint}; its arguments: {listed}"
    required = [p.name for p in params if p.default is p.empty and p.kind is not p.VAR_POSITIONAL]
    missing = [name for name in required if name not in names]
    if missing:
        return f"needs {', '.join(map(repr, missing))} in kwargs; its arguments: {listed}"
    return None


def _check_in_child(
    source: str, checks: Sequence[Check], on_slow: Callable[[str], None] | None = None
) -> None:
    """Run ``checks`` (field, class path, kind, kwarg names) in a worker-like child; raise the
    first failure. ``on_slow``: told which class imports, after 30 s and every minute after.

    A set of classes that passed is not checked again by this process for the same import path
    and working directory (``troupe run`` checks before it starts anything, and the run it
    starts would check again: a child importing torch, half a second of its start-up).
    """
    key = _passed_key(checks)
    if key is None:
        return
    child = subprocess.Popen(
        _CHILD,
        env=_child_env(checks),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C at the terminal stops the command, not its check
    )
    started = time.monotonic()
    note_at = _FIRST_NOTE_S
    try:
        while True:
            waited = time.monotonic() - started
            try:
                stdout, stderr = child.communicate(timeout=max(0.0, min(note_at, _IMPORT_GUARD_S) - waited))
                break
            except subprocess.TimeoutExpired as slow:  # nothing is lost: communicate goes on
                waited = time.monotonic() - started
                if waited >= _IMPORT_GUARD_S:
                    raise _hangs(source) from None
                if waited >= note_at:
                    note_at = waited + _EVERY_NOTE_S
                    if on_slow is not None:
                        on_slow(_slow_note(source, slow.stdout, waited))
    finally:
        if child.returncode is None:  # the guard ran out, or a Ctrl-C: the child goes too
            child.kill()
            child.communicate()
    _judge(source, stdout, stderr, child.returncode)
    _PASSED.add(key)


def _slow_note(source: str, said: bytes | str | None, waited: float) -> str:
    """Which class the check's child imports, from the fields it reported so far."""
    where, _ = _reported(said.encode() if isinstance(said, str) else said or b"")
    what = f"{where} is importing" if where else "the actor classes are importing"
    return (
        f"{source}: {what} for {waited:.0f} s (a module that hangs as it imports is given up on "
        f"after {_IMPORT_GUARD_S} s; Ctrl-C stops)"
    )


async def check_stage_actors_async(cfg: PipelineConfig, source: str, installed_only: bool = False) -> None:
    """:func:`check_stage_actors` for an event loop: the child is killed (and reaped) when the
    caller is cancelled, so a Ctrl-C stops a run whose class check hangs in an import.
    ``installed_only``: a class whose module the child does not find is left out
    (:func:`installed_here`), for a run on a cluster's nodes."""
    import anyio  # here: the check's child imports this module, and stays lean

    checks = stage_checks(cfg)
    key = _passed_key(checks)  # a full check that passed covers one of the installed only
    if key is None:
        return
    env = _child_env(checks)
    if installed_only:
        env[INSTALLED_ONLY_ENV] = "1"
        key = (*key, INSTALLED_ONLY_ENV)
        if key in _PASSED:
            return
    with anyio.move_on_after(_IMPORT_GUARD_S) as guard:
        done = await anyio.run_process(
            _CHILD, env=env, stdin=subprocess.DEVNULL, check=False, start_new_session=True
        )
    if guard.cancelled_caught:
        raise _hangs(source)
    _judge(source, done.stdout, done.stderr, done.returncode)
    _PASSED.add(key)


_CHILD = tuple(lean_argv("troupe.runtime.core.loading"))


def _passed_key(checks: Sequence[Check]) -> tuple[object, ...] | None:
    """What identifies ``checks`` run from here (see ``_PASSED``); None: nothing to check."""
    if not checks:
        return None
    key = (json.dumps(checks), os.getcwd(), os.environ.get("PYTHONPATH", ""), sys.executable)
    return None if key in _PASSED else key


def _child_env(checks: Sequence[Check]) -> dict[str, str]:
    return dict(os.environ, **{CHECK_ENV: json.dumps(list(checks))})


def _hangs(source: str) -> ConfigError:
    return ConfigError(
        f"{source}: importing the actor classes took over {_IMPORT_GUARD_S} s; "
        "a module that hangs while importing would hang every worker"
    )


def _reported(stdout: bytes) -> tuple[str, str]:
    """The last field the check's child named (``checking``) and its error, from its reports."""
    where, error = "", ""
    for line in stdout.decode(errors="replace").splitlines():
        try:
            report = json.loads(line)
        except json.JSONDecodeError:  # a module that wrote to fd 1 itself
            continue
        if not isinstance(report, dict):
            continue
        where = str(report.get("checking", where))
        error = str(report.get("error", error))
    return where, error


def _judge(source: str, stdout: bytes, stderr: bytes, returncode: int) -> None:
    """Raise what the check's child reported: the first failing class, or how it ended."""
    where, error = _reported(stdout)
    if error:
        raise ConfigError(f"{source}: {where}: {error}")
    if returncode != 0:  # the import killed the interpreter (sys.exit, a crash)
        lines = stderr.decode(errors="replace").splitlines()
        last = next((ln for ln in reversed(lines) if ln.strip()), None)
        said = f": {short_repr(last.strip())}" if last is not None else ", without a word on stderr"
        raise ConfigError(
            f"{source}: {where or 'actor classes'}: importing it ended the process "
            f"(exit status {returncode}){said}"
        )


def main() -> None:
    """Entry point of the child: import each class of ``$TROUPE_CHECK_CLASSES``, report as JSON lines.

    Whatever the imported modules print is kept off stdout, which carries only the reports.
    """
    out = sys.stdout
    checks = json.loads(os.environ[CHECK_ENV])
    if os.environ.get(INSTALLED_ONLY_ENV) == "1":
        checks = installed_here(checks)
    set_role("class check")
    failure = first_failure(
        checks, lambda where: print(json.dumps({"checking": where}), file=out, flush=True)
    )
    if failure is not None:
        print(json.dumps({"checking": failure[0], "error": failure[1]}), file=out, flush=True)


def _where_hint(exc: BaseException, module_name: str) -> str:
    """Where modules are looked for, when the class's own module (or its package) is missing
    rather than something it imports: most often, a run started from another folder."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if not missing or missing != module_name.split(".")[0]:
        return ""
    return _looked_for(missing, module_name)


def _looked_for(missing: str, module_name: str) -> str:
    """Where ``missing``, the top-level package of ``module_name``, was looked for."""
    holds = f"{missing}.py" if missing == module_name else f"{missing}/"
    return (
        f" (looked for in the current folder {os.getcwd()} and the Python path: run from the folder "
        f"that holds {holds}, or add that folder to PYTHONPATH)"
    )


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # one line, whatever the module raised
    if isinstance(exc, ImportError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


if __name__ == "__main__":
    main()
