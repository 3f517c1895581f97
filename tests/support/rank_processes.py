"""Trainer ranks as processes of their own (torchrun's variables set), waited for and reaped."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["run_ranks"]


def run_ranks(
    cmd: Sequence[str],
    env: Mapping[str, str],
    logs: Sequence[Path],
    timeout_s: float,
    hosts: Sequence[Callable[[Sequence[str]], list[str]]] | None = None,
) -> list[int | None]:
    """Run ``cmd`` once per log in ``logs`` (``RANK`` 0, 1, ...), each writing to its log; their
    exit codes. Bounded: a rank that fails ends the wait at once (its peers would wait for it),
    and whatever still runs after ``timeout_s`` is killed (None) and reaped, however the test goes.

    ``hosts``: per rank, what runs ``cmd`` on its host (``netns.Host.command``, which execs it:
    the pid killed is the rank's); by default every rank runs here."""
    children: list[subprocess.Popen[bytes]] = []
    codes: list[int | None] = [None] * len(logs)
    try:
        for rank, log in enumerate(logs):
            with log.open("w") as out:
                argv = list(cmd) if hosts is None else hosts[rank](cmd)
                children.append(
                    subprocess.Popen(
                        argv, env={**env, "RANK": str(rank)}, stdout=out, stderr=subprocess.STDOUT
                    )
                )
        for _ in range(int(timeout_s * 10)):  # bounded poll
            codes = [child.poll() for child in children]
            if all(code == 0 for code in codes) or any(code not in (None, 0) for code in codes):
                break
            threading.Event().wait(0.1)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=60)
    return codes
