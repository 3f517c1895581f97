"""Python source that tests run as ``python -c`` around the console script's entry."""

from __future__ import annotations

__all__ = [
    "HELD_AFTER_A_CALL",
    "INTERRUPT_AT_COMMAND_IMPORT",
    "STOPPED_AS_THE_NODE_STARTS",
    "WORK_DONE_THEN_WINDING_DOWN",
]

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

# A command whose work returned (``run_async``), then the interpreter's wind-down, held as it
# frees the modules (where it has put its signal handlers back) until the test signalled it:
# argv[1] "1" runs it with done_if_returned; argv[2] the file written as the wind-down holds,
# argv[3] the file the test writes once it sent its signal (60 s at most).
WORK_DONE_THEN_WINDING_DOWN = """
import os, sys, time
from troupe.cli.client import run_async

class HeldWindDown:
    def __del__(self, exists=os.path.exists, monotonic=time.monotonic, sleep=time.sleep,
                made=open, held=sys.argv[2], signalled=sys.argv[3]):  # builtins are gone by then
        made(held, "w").close()
        deadline = monotonic() + 60
        while not exists(signalled) and monotonic() < deadline:
            sleep(0.02)

async def work():
    return "work done"

print(run_async(work, done_if_returned=sys.argv[1] == "1"), flush=True)
held_wind_down = HeldWindDown()  # freed with __main__'s globals, as the interpreter ends
"""

# ``troupe run --items 2 --out argv[1]`` Ctrl-C'd while its node starts: the run, stood in for,
# signals the command as it is called (the command's own stop handling is listening by then)
# and never reports its start.
STOPPED_AS_THE_NODE_STARTS = """
import os, signal, sys
import anyio
from troupe.cli.commands import run_pipeline as command
from troupe.cli.main import app

async def starting(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    await anyio.sleep_forever()

command.run_pipeline = starting
app(["run", "--items", "2", "--out", sys.argv[1]])
"""

# ``troupe ARGV[4:]`` held once a call of argv[1] (``module:name`` or ``module:Class.name``, a
# function or a classmethod, looked up as the command calls it) has returned, the first time:
# argv[2] the file written as it holds, argv[3] the file the test writes to let it go on (120 s
# at most). Two commands started at once, made: the second starts while the first is held there.
HELD_AFTER_A_CALL = """
import importlib, os, sys, time
from troupe.cli.main import app

where, held, release = sys.argv[1:4]
module, _, attribute = where.partition(":")
*path, name = attribute.split(".")
owner = importlib.import_module(module)
for part in path:
    owner = getattr(owner, part)
called = getattr(owner, name)

def held_after(*args, **kwargs):
    result = called(*args, **kwargs)
    if not os.path.exists(held):
        open(held, "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.02)
    return result

setattr(owner, name, staticmethod(held_after) if isinstance(owner, type) else held_after)
app(sys.argv[4:])
"""
