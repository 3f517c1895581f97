"""The errors of the LeRobot writer: data of the wrong shape, dtype or values."""

from __future__ import annotations

from troupe.runtime.errors import TroupeError

__all__ = ["InvalidData"]


class InvalidData(TroupeError, ValueError):
    """Data handed to (or read back by) a writer has the wrong shape, dtype or values."""

    code = "invalid_data"
