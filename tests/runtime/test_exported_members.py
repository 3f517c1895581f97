"""The public surface is what ``__all__`` says: every exported name exists, nothing is made up."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import troupe.runtime

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
    "Actor", "handles", "connect", "ActorRef", "TaskActor", "LeasedTask", "OutputStore", "StageActor",
    "ItemFailed", "AskTimeout", "RemoteError", "MailboxFull", "ActorStopped", "TroupeError", "ConfigError",
}


def test_user_facing_names_come_from_troupe_itself() -> None:
    """`from troupe import Actor, handles, connect, TaskActor, StageActor, RemoteError, ...` works."""
    import troupe

    assert USER_FACING <= set(troupe.__all__)
    assert list(troupe.__all__) == sorted(set(troupe.__all__))
    for name in troupe.__all__:
        member = getattr(troupe, name)
        home = importlib.import_module(member.__module__)
        assert getattr(home, name) is member, f"troupe.{name} is not {home.__name__}.{name}"
        assert name in dir(troupe)


def test_importing_troupe_alone_loads_no_runtime() -> None:
    """`import troupe` stays light: workers start through troupe.lean_start, which must import
    structlog (with rich hidden) before anything of the runtime does."""
    probe = "import sys, troupe; print(sorted(m for m in ('structlog', 'troupe.runtime', 'zmq') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_an_unknown_top_level_name_is_an_attribute_error() -> None:
    """A misspelt name fails as any missing attribute does."""
    import troupe

    with pytest.raises(AttributeError, match="Actr"):
        troupe.Actr  # noqa: B018
