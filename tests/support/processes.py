"""Waiting for a process to be gone, in a bounded poll of the process table."""

from __future__ import annotations

import time

import psutil

__all__ = ["gone_within"]


def gone_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` exits (or is a zombie, only its status left) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
