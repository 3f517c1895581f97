"""What a failed process or thread start is said as (``start_limits``), and a blocking call run
on the loop where no thread can be started (a process limit reached for a moment)."""

from __future__ import annotations

import errno
import os
import resource
import threading
from typing import Any

import pytest
from structlog.testing import capture_logs

from troupe.runtime.start_limits import in_thread, limit_reached, remote_limit_reached, start_failure


def _refuse_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(self: threading.Thread, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)


def test_a_refused_fork_names_the_process_limit() -> None:
    said = start_failure(BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)))
    assert said == (
        "could not start a process: Resource temporarily unavailable (a process limit: ulimit -u, "
        "cgroup pids.max)"
    )


def test_any_os_error_of_a_start_is_said_and_only_limits_are_taken_for_one() -> None:
    missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    assert start_failure(missing) == "could not start a process: No such file or directory"
    assert limit_reached(missing) is None
    assert start_failure(ValueError("x")) is None and limit_reached(RuntimeError("x")) is None


def test_a_refused_thread_under_an_address_space_limit_names_that_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (800 * 2**20, resource.RLIM_INFINITY))
    said = limit_reached(RuntimeError("can't start new thread"))
    assert said is not None
    assert said.startswith("could not start a thread (can't start new thread): the address-space limit")
    assert "ulimit -v, 800 MiB here" in said and "pids.max" in said


async def test_in_thread_runs_the_call_on_the_loop_where_no_thread_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _refuse_threads(monkeypatch)
    with capture_logs() as logs:
        assert await in_thread(sum, [1, 2, 3], what="sum") == 6
    assert [e["event"] for e in logs] == ["thread_refused"]
    assert logs[0]["call"] == "sum"


async def test_in_thread_raises_what_the_call_raises() -> None:
    with pytest.raises(ZeroDivisionError):
        await in_thread(divmod, 1, 0, what="divmod")


def test_a_hook_that_could_not_start_a_thread_names_the_limit() -> None:
    """A stage's finalize that died of it (report rs 1: pids.max 60) said only
    ``builtins.RuntimeError: can't start new thread``."""
    from troupe.runtime.errors import RemoteError
    from troupe.runtime.pipeline.hook_calls import _hook_failed

    said = str(
        _hook_failed("store", "finalize", RemoteError("builtins.RuntimeError", "can't start new thread"))
    )
    assert said.startswith("stage store: finalize failed: builtins.RuntimeError: can't start new thread")
    assert "could not start a thread" in said and "pids.max" in said
    other = str(_hook_failed("store", "finalize", RemoteError("builtins.RuntimeError", "boom")))
    assert "pids.max" not in other
    assert remote_limit_reached("builtins.BlockingIOError", "[Errno 11] Resource temporarily unavailable")
