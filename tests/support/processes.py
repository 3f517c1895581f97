"""Waiting for a process to be gone, in a bounded poll of the process table."""

from __future__ import annotations

import time

import psutil

__all__ = ["gone_within"]


def gone_within(pid: int, seconds: float, reaped: bool = False) -> bool:
    """Whether ``pid`` exits (or is a zombie, only its status left, unless ``reaped`` is
    asked: then its parent must have reaped it too) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            process = psutil.Process(pid)  # raises once it is gone and reaped
            if not reaped and process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
