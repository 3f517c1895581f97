"""Capture what one module logs, whatever ran in this process before.

``structlog.testing.capture_logs`` swaps structlog's processors only: a level set earlier by
``configure_logging`` (a bench configures ``warning``) still filters the events out before any
processor sees them, and a test that passed alone failed in the whole suite. Here the whole
configuration is swapped for the capture (every level, nothing cached), the module's logger is
a fresh one meanwhile, and both are restored after.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest
import structlog
from structlog.testing import LogCapture

__all__ = ["module_logs"]


@contextmanager
def module_logs(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, *more: ModuleType
) -> Iterator[list[MutableMapping[str, Any]]]:
    """The events ``module`` (and ``more`` modules) logs (through its ``log``) inside the block,
    at every level, in the order they were logged."""
    before, was_configured = structlog.get_config(), structlog.is_configured()
    capture = LogCapture()
    structlog.configure(
        processors=[capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
    try:
        with monkeypatch.context() as patch:
            for logging_module in (module, *more):
                patch.setattr(logging_module, "log", structlog.get_logger(logging_module.__name__))
            yield capture.entries
    finally:
        if was_configured:
            structlog.configure(**before)
        else:  # as it was: configure(**before) made structlog's defaults look like a program's own
            structlog.reset_defaults()
