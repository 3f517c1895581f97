"""A second Ctrl-C while a stopped benchmark unwinds ends it at once, and the same way as the
first: the "stopped" line said, the benchmark's temporary folder removed, exit 130. It skipped
both, leaving /tmp/troupe-bench-* folders behind."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap

WITHIN_S = 60.0  # a bound on a hang, not on speed

# A benchmark whose unwind after the first Ctrl-C waits for good (a child that does not end):
# only the second Ctrl-C ends it. Its lines on stdout say where it is.
_BENCH = textwrap.dedent(
    """
    import sys, threading
    from troupe.cli.bench.stopping import bench_folder, stops_cleanly

    @stops_cleanly
    def bench():
        with bench_folder("troupe-bench-test-") as folder:
            try:  # said inside: the first Ctrl-C, sent once it is read, lands in here
                print("folder", folder, flush=True)
                threading.Event().wait()
            except KeyboardInterrupt:
                print("unwinding", flush=True)
                threading.Event().wait()  # a wait the first stop cannot cut short

    bench()
    """
)


def _line(proc: subprocess.Popen[str], word: str) -> str:
    """The child's next line, which starts with ``word``; waited for up to WITHIN_S."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], WITHIN_S)
    line = proc.stdout.readline() if ready else "(nothing within the bound)"
    err = "" if ready and line else (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
    assert line.startswith(word), f"expected {word!r}, got {line!r}; stderr: {err}"
    return line.split(" ", 1)[-1].strip()


def test_a_second_ctrl_c_says_the_line_and_removes_the_folder() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _BENCH], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    folder = ""
    try:
        folder = _line(proc, "folder")
        assert os.path.isdir(folder)
        proc.send_signal(signal.SIGINT)
        _line(proc, "unwinding")  # the first was taken; the unwind now waits
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WITHIN_S)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    assert proc.returncode == 130, err
    assert "stopped (SIGINT): the benchmark prints no figures" in err, err
    assert "Traceback" not in err, err
    assert not os.path.exists(folder), f"{folder} was left behind"
