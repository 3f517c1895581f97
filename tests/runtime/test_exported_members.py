"""The public surface is what ``__all__`` says: every exported name exists, nothing is made up.

The rule for classes:

- Every public class (no leading underscore) that a public module defines is in that module's
  ``__all__``.
- ``troupe.runtime`` is the public API and ``troupe.runtime.lowlevel`` the wire-level one. A module
  that either of them takes any name from is an *API module*; each public class it defines is
  exported by ``troupe.runtime.__all__`` or ``troupe.runtime.lowlevel.__all__`` (not both).
- Every other module of troupe.runtime is the runtime's machinery (the node, supervision, chaos,
  the task bookkeeping and master, the pipeline engine, testing): its classes are public to the
  runtime and to troupe.cli, never needed by user code, and are not exported.
- Wire-level names (codec, envelopes, frame constants, error-reply helpers) are never in
  ``troupe.runtime.__all__``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import troupe.runtime
import troupe.runtime.lowlevel

PACKAGES = ["troupe.runtime", "troupe.actors", "troupe.models"]


def _public_modules() -> list[str]:
    names = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                names.append(info.name)
    return sorted(names)


def test_runtime_exports_exist() -> None:
    """Every name in troupe.runtime.__all__ can be imported from troupe.runtime."""
    missing = [name for name in troupe.runtime.__all__ if not hasattr(troupe.runtime, name)]
    assert missing == []


def test_runtime_exports_are_unique() -> None:
    """troupe.runtime.__all__ names each member once."""
    exported = list(troupe.runtime.__all__)
    assert len(exported) == len(set(exported))


def test_runtime_exports_come_from_their_modules() -> None:
    """Each name troupe.runtime exports is also exported by the module that defines it."""
    for name in troupe.runtime.__all__:
        member = getattr(troupe.runtime, name)
        home = getattr(member, "__module__", None)
        if home is None or not home.startswith("troupe.runtime."):
            continue
        module = importlib.import_module(home)
        assert name in getattr(module, "__all__", ()), f"{name} is not in {home}.__all__"


@pytest.mark.parametrize("module_name", _public_modules())
def test_module_all_lists_only_defined_names(module_name: str) -> None:
    """A public module declares __all__, and every name in it is defined there, once."""
    module: ModuleType = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} has no __all__"
    assert all(isinstance(name, str) for name in exported)
    undefined = [name for name in exported if not hasattr(module, name)]
    assert undefined == [], f"{module_name}.__all__ names undefined members"
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ repeats a name"


USER_FACING = {
    "Actor",
    "handles",
    "connect",
    "ActorRef",
    "TaskActor",
    "LeasedTask",
    "OutputStore",
    "StageActor",
    "ItemFailed",
    "AskTimeout",
    "RemoteError",
    "MailboxFull",
    "ActorStopped",
    "TroupeError",
    "ConfigError",
}


def test_user_facing_names_come_from_troupe_itself() -> None:
    """`from troupe import Actor, handles, connect, TaskActor, StageActor, RemoteError, ...` works."""
    import troupe

    assert set(troupe.__all__) >= USER_FACING
    assert list(troupe.__all__) == sorted(set(troupe.__all__))
    for name in troupe.__all__:
        member = getattr(troupe, name)
        home = importlib.import_module(member.__module__)
        assert getattr(home, name) is member, f"troupe.{name} is not {home.__name__}.{name}"
        assert name in dir(troupe)
    # Once each, loaded or not, and none of the module's own imports.
    listed = dir(troupe)
    assert len(listed) == len(set(listed)) and not {"Any", "importlib", "annotations"} & set(listed)


def test_importing_troupe_alone_loads_no_runtime() -> None:
    """`import troupe` stays light: workers start through troupe.lean_start, which must import
    structlog (with rich hidden) before anything of the runtime does."""
    probe = (
        "import sys, troupe; "
        "print(sorted(m for m in ('structlog', 'troupe.runtime', 'zmq') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_an_unknown_top_level_name_is_an_attribute_error() -> None:
    """A misspelt name fails as any missing attribute does."""
    import troupe

    with pytest.raises(AttributeError, match="Actr"):
        troupe.Actr  # noqa: B018


def _public_classes(module: ModuleType) -> list[str]:
    return sorted(
        name
        for name, value in vars(module).items()
        if inspect.isclass(value) and value.__module__ == module.__name__ and not name.startswith("_")
    )


@pytest.mark.parametrize("module_name", _public_modules())
def test_every_public_class_is_in_its_module_all(module_name: str) -> None:
    """A public class that a public module defines is listed in that module's __all__."""
    module = importlib.import_module(module_name)
    unlisted = [n for n in _public_classes(module) if n not in getattr(module, "__all__", ())]
    assert unlisted == [], f"{module_name} defines public classes missing from its __all__"


def _api_modules() -> list[str]:
    homes = set()
    for api in (troupe.runtime, troupe.runtime.lowlevel):
        for name in api.__all__:
            home = getattr(getattr(api, name), "__module__", None)
            homes.add(home if home and home.startswith("troupe.runtime.") else None)
    homes.discard(None)
    homes.add("troupe.runtime.wire.codec")  # constants have no __module__: name their home
    return sorted(h for h in homes if h is not None)


@pytest.mark.parametrize("module_name", _api_modules())
def test_every_public_class_of_an_api_module_is_exported(module_name: str) -> None:
    """A class defined in a module the API takes from is in troupe.runtime's or lowlevel's __all__."""
    exported = set(troupe.runtime.__all__) | set(troupe.runtime.lowlevel.__all__)
    module = importlib.import_module(module_name)
    missing = [n for n in _public_classes(module) if n not in exported]
    assert missing == [], f"{module_name}: public classes exported by neither API"


def test_lowlevel_exports_exist_come_from_their_modules_and_are_not_public_api() -> None:
    """lowlevel's names exist, are their home module's exports, and stay out of troupe.runtime."""
    lowlevel = troupe.runtime.lowlevel
    assert len(lowlevel.__all__) == len(set(lowlevel.__all__))
    for name in lowlevel.__all__:
        member = getattr(lowlevel, name)
        home = getattr(member, "__module__", None)
        if home is not None and home.startswith("troupe.runtime."):
            assert name in importlib.import_module(home).__all__, f"{name} is not in {home}.__all__"
    assert set(lowlevel.__all__).isdisjoint(troupe.runtime.__all__)
    wire_level = {"Codec", "Envelope", "Kind", "PROTOCOL_VERSION", "error_payload", "raise_error_payload"}
    assert wire_level <= set(lowlevel.__all__)


def test_the_top_level_names_are_public_api_names() -> None:
    """Everything `troupe` offers comes from troupe.runtime's public API, none from lowlevel."""
    import troupe

    assert set(troupe.__all__) <= set(troupe.runtime.__all__)
