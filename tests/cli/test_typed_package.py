"""The package says it is typed (PEP 561: ``py.typed``, shipped as package data), so a user's
mypy or pyright reads troupe's annotations: without it they took every name of troupe as
``Any`` (``import-untyped``), ``run_pipeline_sync(...)`` included (report ap 1)."""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path


def test_the_package_is_marked_typed_and_ships_the_mark() -> None:
    assert files("troupe").joinpath("py.typed").is_file()
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["troupe"]
