"""A terminal whose encoding is not UTF-8 (``LC_ALL=C`` with Python's UTF-8 coercion off): what
a command prints that it cannot carry is escaped, and spinners are drawn in ASCII.

There stdout's errors handler is ``surrogateescape``, as strict as ``strict`` for a character
that is no raw byte: ``troupe run``'s Braille spinner ended the run as it started, in a
UnicodeEncodeError traceback, with the terminal's cursor left hidden; ``ctl top`` died on the "…"
rich cuts a narrow cell with.
"""

from __future__ import annotations

import io
import os
import pty
import re
import select
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from troupe.cli.commands.starting_status import StartingStatus
from troupe.cli.stream_encoding import escape_unencodable

BOUND_S = 120.0  # against a hang only
ENTRY = "from troupe.cli.entry import main; main()"
NOT_UTF8 = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
HIDE_CURSOR, SHOW_CURSOR = b"\x1b[?25l", b"\x1b[?25h"

PIPELINE = """
[pipeline]
name = "ascii"
items = 2

[[stages]]
name = "a"
actor = "troupe.actors.bench.synthetic:CostStage"
kwargs = { cost_s = 0.0 }
"""


def _ascii_stream(errors: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors=errors, write_through=True)


def test_a_surrogateescape_stdout_escapes_what_it_cannot_carry_and_keeps_raw_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stdout = _ascii_stream("surrogateescape")  # a C-locale terminal's stdout
    monkeypatch.setattr(sys, "stdout", stdout)
    escape_unencodable()
    stdout.write("resta\u2026 schl\xfcssel caf\udce9")  # \udce9: a file name's raw byte 0xe9
    assert stdout.buffer.getvalue() == b"resta\\u2026 schl\\xfcssel caf\xe9"  # type: ignore[attr-defined]


def test_the_starting_spinner_of_an_ascii_terminal_is_ascii() -> None:
    screen = _ascii_stream("strict")
    status = StartingStatus(
        Console(file=screen, force_terminal=True, width=100),
        cluster=False,
        quiet=False,
        notes=Console(file=io.StringIO()),
    )
    status.start()
    status.importing("stages:Generate", 1.0)
    status.stop()  # its last frame: where the Braille spinner raised
    shown = screen.buffer.getvalue()  # type: ignore[attr-defined]
    assert b"starting the node" in shown and SHOW_CURSOR in shown


def _read_to_end(fd: int, out: bytearray, deadline: float) -> None:
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 0.1)[0]:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the terminal: all read
            return
        if not data:
            return
        out += data


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux pseudo-terminal")
def test_troupe_run_on_an_ascii_terminal_runs_and_gives_the_cursor_back(tmp_path: Path) -> None:
    (tmp_path / "ascii.toml").write_text(PIPELINE, encoding="utf-8")
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on a C-locale terminal
        os.chdir(tmp_path)
        os.environ.update({**NOT_UTF8, "COLUMNS": "100", "LINES": "30", "TERM": "xterm-256color"})
        os.execv(sys.executable, [sys.executable, "-c", ENTRY, "run", "ascii.toml", "--out", "out"])
    out = bytearray()
    deadline = time.monotonic() + BOUND_S
    status: int | None = None
    try:
        _read_to_end(fd, out, deadline)
        while status is None and time.monotonic() < deadline:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            status = wait_status if done else None
            time.sleep(0.02)
    finally:
        if status is None:
            os.killpg(pid, 9)  # pty.fork made it a session leader: its group
            os.waitpid(pid, 0)
        os.close(fd)
    shown = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", bytes(out)).decode("ascii", errors="replace")
    assert status is not None and os.waitstatus_to_exitcode(status) == 0, shown[-3000:]
    assert "Traceback" not in shown and "2 ok" in shown, shown[-3000:]
    assert bytes(out).isascii(), shown[-3000:]
    assert bytes(out).rfind(SHOW_CURSOR) > bytes(out).rfind(HIDE_CURSOR), shown[-3000:]
