"""Python source that tests run as ``python -c`` around the console script's entry."""

from __future__ import annotations

__all__ = ["INTERRUPT_AT_COMMAND_IMPORT"]

# A KeyboardInterrupt where a Ctrl-C would land: while the command's modules import (after the
# entry started what it starts first).
INTERRUPT_AT_COMMAND_IMPORT = """
import importlib.abc, sys

class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "troupe.cli.main":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupt())
"""
