"""Type-check troupe as it is installed: src/ is the package ``troupe``, tools/ is ``troupe.cli``.

mypy cannot follow the editable install's import hook (``Can't find package 'troupe'``), and
module names made from paths would be ``src.runtime...``, so this script names each file's module
itself and runs mypy on them all, with the settings in pyproject.toml ([tool.mypy]). Arguments
are passed to mypy. Exit status: 0 clean, 1 errors, 2 mypy could not run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"troupe": ROOT / "src", "troupe.cli": ROOT / "tools"}


def sources() -> list[BuildSource]:
    """Every module of troupe (a package under its own name), with its file."""
    found = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.append(BuildSource(str(path.relative_to(ROOT)), ".".join((package, *parts))))
    return found


def main(argv: list[str]) -> int:
    os.chdir(ROOT)  # where pyproject.toml is, and the paths in the report start
    # The options as the mypy command would read them; the one file given only satisfies its
    # parser (it wants something to check): the sources are ours.
    _, options = process_options([*argv, str(PACKAGES["troupe"] / "__init__.py")])
    modules = sources()
    try:
        result = build.build(modules, options, stdout=sys.stdout, stderr=sys.stderr)
    except CompileError as exc:
        print("\n".join(exc.messages), file=sys.stderr)
        return 2
    errors = [line for line in result.errors if ": error:" in line]
    print("\n".join(result.errors))
    if errors:
        files = {line.split(":", 1)[0] for line in errors}
        print(f"Found {len(errors)} errors in {len(files)} files (checked {len(modules)} source files)")
        return 1
    print(f"Success: no issues found in {len(modules)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
