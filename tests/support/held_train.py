"""A training run held between its end and the end of its processes, for the tests that stop
it there: its dataset class (``train.dataset_class``), in the trainer rank's worker, holds that
worker's exit. The worker exits only as the run's node stops it, once the ranks were done and
their final checkpoint committed (a run without restarts): the first one to exit writes
``held`` beside the dataset's folder and waits for ``release`` there (``HOLD_S`` at most)."""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path
from typing import Any

from troupe.actors.training.dataset import LeRobotClips

__all__ = ["HELD", "HOLD_S", "RELEASE", "HeldClips"]

HELD, RELEASE = "held", "release"
HOLD_S = 9.0  # under the stop grace of the node a training run starts (10 s), which kills past it


class HeldClips(LeRobotClips):
    """``LeRobotClips`` whose process, as it exits, holds (see the module)."""

    def __init__(self, root: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        beside = Path(root).resolve().parent
        atexit.register(_hold, beside / HELD, beside / RELEASE)


def _hold(held: Path, release: Path) -> None:
    try:  # the first process to exit holds; any other (a restarted rank's) exits as usual
        fd = os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    deadline = time.monotonic() + HOLD_S
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # a process exiting, without its event loop: a bounded poll
