"""What every child process of a node does first: tie its life to the node, read its spec."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from .config import validation_message

__all__ = ["die_with_parent", "load_launch_spec"]

M = TypeVar("M", bound=BaseModel)


def die_with_parent(who: str) -> None:
    """Ask Linux to SIGTERM this process when its node dies, so it never outlives the node."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # the node died before prctl took effect
        sys.exit(f"{who}: the node that started it is gone")


def load_launch_spec(model: type[M], env: str, who: str, hint: str) -> M:
    """Read and validate the JSON launch spec in ``$env``; exit with a clear message if bad."""
    raw = os.environ.get(env)
    if not raw:
        sys.exit(f"{env} is not set: {hint}")
    try:
        return model.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        msg = validation_message(env, exc) if isinstance(exc, ValidationError) else str(exc)
        sys.exit(f"bad {who} spec: {msg}")
