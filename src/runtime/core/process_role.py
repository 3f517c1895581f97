"""What this process is where troupe started it to import a user's modules: a node's template,
a worker, the class check's child; None in a user's own process.

A module that holds stage classes is imported in each of those processes, and its top-level code
runs there too. A ``run_pipeline`` at the top of such a module (a script with no ``if __name__
== "__main__":``) started a run in each, whose template imported the module again: processes
without end, going on after Ctrl-C. The runner refuses to start in such a process while a module
is being imported (:func:`importing_module`), as multiprocessing refuses a process started while
its child still bootstraps.
"""

from __future__ import annotations

import inspect
from types import FrameType

__all__ = ["importing_module", "role", "set_role"]

_role: str | None = None


def set_role(name: str) -> None:
    """Say what this process is (``template``, ``worker``, ``class check``), before it imports
    a user's modules."""
    global _role
    _role = name


def role() -> str | None:
    """What this process is (:func:`set_role`), None in a user's own process."""
    return _role


def importing_module() -> str | None:
    """The module whose top-level code calls this (through any frames), while it is being
    imported; None when no import is under way on this thread's stack (``__main__`` is run,
    not imported)."""
    here = inspect.currentframe()
    frame: FrameType | None = here.f_back if here is not None else None
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            name = frame.f_globals.get("__name__")
            spec = frame.f_globals.get("__spec__")
            if name != "__main__" and getattr(spec, "_initializing", False):
                return str(name)
        frame = frame.f_back
    return None
