"""``troupe bench``: measurements that print each figure beside its ceiling."""

from __future__ import annotations

import typer

__all__ = ["bench_app"]

bench_app = typer.Typer(no_args_is_help=True)
