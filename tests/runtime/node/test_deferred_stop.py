"""The template's stop, put off while a fork is under way: a SIGTERM between the fork and the
answer with the worker's pid ended the template with the worker made and unsaid, and the worker
ran on after its node (CI). In a child process each: the stop ends the process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

WITHIN_S = 60.0  # a bound on a hang, not on speed

PRELUDE = """
import os, signal, sys, threading, time
from troupe.runtime.node.deferred_stop import DeferredStop
stop = DeferredStop()
stop.install()
"""


def _run(body: str) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WITHIN_S)


def test_a_stop_inside_the_stretch_waits_for_its_end_then_ends_the_process() -> None:
    done = _run(
        """
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler has run by now: the stop is noted, not done
            print("answered", flush=True)
        print("served on", flush=True)
        """
    )
    assert (done.returncode, done.stdout) == (0, "answered\n"), done


def test_a_stop_reaching_another_thread_is_put_off_as_well() -> None:
    """torch starts native threads as it imports; a signal may be delivered to any of them."""
    done = _run(
        """
        ready = threading.Event()
        t = threading.Thread(target=lambda: (ready.set(), time.sleep(2)), daemon=True)
        t.start(); ready.wait()
        with stop.deferred():
            signal.pthread_kill(t.ident, signal.SIGTERM)
            time.sleep(0.2)
            print("answered", flush=True)
        print("served on", flush=True)
        """
    )
    assert (done.returncode, done.stdout) == (0, "answered\n"), done


def test_a_stop_outside_the_stretch_ends_the_process_at_once() -> None:
    done = _run(
        """
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("served on", flush=True)
        """
    )
    assert (done.returncode, done.stdout) == (0, ""), done


def test_a_fork_made_inside_ends_of_the_stop_as_it_would_by_default() -> None:
    done = _run(
        """
        with stop.deferred():
            child = os.fork()
            if child == 0:  # the worker, before it is anything else
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
                os._exit(3)
        _, status = os.waitpid(child, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
        """
    )
    assert done.returncode == 0 and done.stdout == f"{-signal.SIGTERM}\n", done
