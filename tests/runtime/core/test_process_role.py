"""What a troupe process importing a user's module can tell: which module's top-level code is
running (the runner refuses a run started there: see tests/e2e/test_run_started_by_an_import.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from troupe.runtime.core.process_role import importing_module


def test_the_module_being_imported_is_named_and_none_outside_an_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "troupe_role_probe.py").write_text(
        "from troupe.runtime.core.process_role import importing_module\n"
        "def seen():\n    return importing_module()\n"
        "AT_IMPORT = seen()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import troupe_role_probe  # type: ignore[import-not-found]

    try:
        assert troupe_role_probe.AT_IMPORT == "troupe_role_probe"
        assert troupe_role_probe.seen() is None  # called later, by a function: no import
        assert importing_module() is None
    finally:
        del sys.modules["troupe_role_probe"]
