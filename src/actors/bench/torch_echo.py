"""An echo actor whose module imports torch: ``troupe bench recovery`` restarts it to time how
fast a worker that imports torch serves again (``torch_restart_serving_s``)."""

from __future__ import annotations

from typing import Any

import torch

from troupe.runtime import Actor, handles

__all__ = ["TorchEcho"]


class TorchEcho(Actor):
    """Answers every ``echo`` with its payload; ``torch`` says which torch it imported."""

    @handles("echo")
    def echo(self, payload: Any) -> Any:
        return payload

    @handles("torch")
    def version(self, _: Any) -> str:
        return str(torch.__version__)
