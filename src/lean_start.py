"""Start a troupe process without the console extras it never shows.

``python -m troupe.lean_start troupe.runtime.node.worker_process [args]`` runs that module as ``__main__``,
as ``python -m`` would, after importing structlog with rich hidden. structlog's ``dev`` module
(imported by ``import structlog``) loads rich's console and traceback renderers, and pygments
with them, whenever rich is installed: about 12 MiB resident in every process. A worker or a
supervisor logs JSON lines and has no console, so the node starts them through here. rich is
importable again afterwards: an actor that uses it gets it.

The process is troupe's own (``library_logging.own_this_process``): structlog goes through the
standard library, as ``import troupe`` configured it in every process before, until the module
configures its logging; a user's module that logs as the template imports it is no exception.

The current folder is on its ``sys.path``, after the installed packages, whatever the
environment says: a user's stage modules are looked for there (README, "Your own pipeline"),
but a scratch ``torch.py`` there is not troupe's torch. Its processes are started with ``-P``
(:func:`argv`), so that ``python -m`` does not put the folder first, and this puts it last.
The class check finds modules the same way (``runtime/core/current_folder.py``).
"""

from __future__ import annotations

import os
import runpy
import sys
import warnings

__all__ = ["argv", "main"]

_HIDDEN = "rich"


def argv(module: str) -> list[str]:
    """How troupe starts a process that runs ``module``: ``-P``, the current folder is not
    put ahead of the installed packages (this module puts it after them)."""
    return [sys.executable, "-P", "-m", "troupe.lean_start", module]


def main() -> None:
    """Run the module named by the first argument as ``__main__``."""
    if len(sys.argv) < 2:
        sys.exit("usage: python -m troupe.lean_start MODULE [ARGS...]")
    target = sys.argv[1]
    _current_folder_on_path()
    if _HIDDEN not in sys.modules:
        sys.modules[_HIDDEN] = None  # type: ignore[assignment]  # None: `import rich` fails
        try:
            import structlog  # noqa: F401  # its dev module now settles for plain tracebacks
        finally:
            del sys.modules[_HIDDEN]
    sys.argv = [target, *sys.argv[2:]]
    # A module its package imports (the class check's child, troupe.runtime.core.loading) is in
    # sys.modules before it runs as __main__; runpy warns on stderr, where the child's last words
    # belong (a module that ended the check's process without a word was reported by it).
    warnings.filterwarnings(
        "ignore", message=r".*found in sys\.modules after import of package", category=RuntimeWarning
    )
    from troupe.runtime.library_logging import own_this_process

    own_this_process()  # a node's child: troupe configures its logging (a user's module its lines too)
    runpy.run_module(target, run_name="__main__", alter_sys=True)


def _current_folder_on_path() -> None:
    """Put the current folder last on ``sys.path``, with or without ``PYTHONSAFEPATH`` (which
    kept the run's own modules out of the folder the error said it looked in). First, as
    ``python -m`` put it, a stray ``torch.py`` there ran in every worker as torch."""
    try:
        here = os.getcwd()
    except OSError:  # a deleted folder: nothing there to import
        return
    if here not in sys.path:  # there already: the user put it on PYTHONPATH
        sys.path.append(here)


if __name__ == "__main__":
    main()
