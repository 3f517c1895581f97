"""A log stream (a node's, a master's): the lines its file receives are published, numbered, kept for
log_recent, and the file rotates at its size where the publisher rotates it (a node's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
import zmq

from troupe.runtime.errors import BadRequest
from troupe.runtime.log_files import history_files, lock_path, rotate, rotated_path
from troupe.runtime.log_publisher import LogPublisher, decode_log_recent, log_socket
from troupe.runtime.security.keys import CurveKeys, generate_keys, load_keys
from troupe.runtime.security.process import install

WAIT_S = 30.0  # a bound on waiting, not on speed


def _publisher(tmp_path: Path, max_bytes: int | None = 1 << 20) -> LogPublisher:
    path = tmp_path / "n1.jsonl"
    path.write_text('{"event": "before the start"}\n')
    return LogPublisher("n1", path, "tcp://127.0.0.1:*", None, max_bytes, keep=2)


@pytest.mark.anyio
async def test_appended_lines_are_published_in_order_and_numbered(tmp_path: Path) -> None:
    """What was in the file before the start is not streamed; each later complete line is, once."""
    pub = _publisher(tmp_path)
    context: zmq.Context[Any] = zmq.Context()
    sub = log_socket(context, zmq.SUB)
    try:
        assert pub.endpoint.startswith("tcp://127.0.0.1:")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.endpoint)
        got: list[list[bytes]] = []
        k = 0
        with anyio.fail_after(WAIT_S):
            while not got:  # until the subscription has taken: PUB drops lines nobody takes yet
                with pub.path.open("a") as f:
                    f.write(f'{{"event": "ping{k}"}}\n')
                k += 1
                await pub.poll()
                await anyio.sleep(0.05)
                while sub.poll(0):
                    got.append(sub.recv_multipart())
            with pub.path.open("a") as f:
                f.write('{"event": "last"}\n{"event": "half')
            await pub.poll()
            while got[-1][3] != b'{"event": "last"}':
                assert sub.poll(int(WAIT_S * 1000))
                got.append(sub.recv_multipart())
        assert {m[0] for m in got} == {b"n1"} and {m[1] for m in got} == {pub.incarnation.encode()}
        numbers = [int(m[2]) for m in got]
        assert numbers == list(range(numbers[0], numbers[0] + len(got)))
        assert pub.published == k + 1
        assert all(b"before" not in m[3] for m in got)
    finally:
        sub.close(0)
        context.term()
        pub.close()


@pytest.mark.anyio
async def test_a_closing_stream_publishes_what_came_since_its_last_poll(tmp_path: Path) -> None:
    """A node's stop lines (its workers' exits, node_stopped) are written after the stream's last
    poll: close() dropped its socket at once, and a tail never saw them (report lk 4)."""
    pub = _publisher(tmp_path)
    context: zmq.Context[Any] = zmq.Context()
    sub = log_socket(context, zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub.endpoint)
        k = 0
        with anyio.fail_after(WAIT_S):
            while not sub.poll(50):  # until the subscription has taken
                with pub.path.open("a") as f:
                    f.write(f'{{"event": "ping{k}"}}\n')
                k += 1
                await pub.poll()
        with pub.path.open("a") as f:
            f.write('{"event": "worker_exited"}\n{"event": "node_stopped"}\n')
        pub.close()  # no poll in between: the close reads the file once more
        got: list[bytes] = []
        while b"node_stopped" not in b"".join(got):
            assert sub.poll(int(WAIT_S * 1000)), got
            got.append(sub.recv_multipart()[3])
        assert got[-2:] == [b'{"event": "worker_exited"}', b'{"event": "node_stopped"}']
        pub.close()  # once is enough
    finally:
        sub.close(0)
        context.term()
        pub.close()


@pytest.mark.anyio
async def test_log_recent_answers_the_kept_lines_after_a_number(tmp_path: Path) -> None:
    pub = _publisher(tmp_path)
    try:
        with pub.path.open("a") as f:
            f.writelines(f'{{"event": "e{i}"}}\n' for i in range(1, 6))
        await pub.poll()
        reply = pub.answer({"after": 2, "limit": 2})  # the control's reply, its payload decoded
        assert reply == {
            "incarnation": pub.incarnation,
            "seq": 5,
            "lines": [[4, '{"event": "e4"}'], [5, '{"event": "e5"}']],
        }
        assert len(pub.recent(*decode_log_recent(None))["lines"]) == 5
        assert pub.recent(*decode_log_recent({"limit": 0}))["lines"] == []
        with pytest.raises(BadRequest, match="after"):
            decode_log_recent({"after": -1})
        with pytest.raises(BadRequest, match="limit"):
            decode_log_recent({"limit": "all"})
        with pytest.raises(BadRequest):
            decode_log_recent([1, 2])
    finally:
        pub.close()


@pytest.mark.anyio
async def test_the_file_rotates_at_its_size_and_every_line_is_still_published(tmp_path: Path) -> None:
    pub = _publisher(tmp_path, max_bytes=200)
    try:
        for i in range(30):
            with pub.path.open("a") as f:
                f.write(f'{{"event": "line-{i:03d}", "pad": "{"x" * 20}"}}\n')
            await pub.poll()
        assert pub.rotations >= 5
        assert [p.name for p in history_files(pub.path)][:2] == ["n1.jsonl.2", "n1.jsonl.1"]
        events = [line for _, line in pub.recent()["lines"]]
        assert [e.split('"')[3] for e in events] == [f"line-{i:03d}" for i in range(30)]
    finally:
        pub.close()


@pytest.mark.anyio
async def test_without_a_size_the_publisher_leaves_the_rotating_to_the_writer(tmp_path: Path) -> None:
    """The master's file: its own handler rotates it; the publisher only publishes."""
    pub = _publisher(tmp_path, max_bytes=None)
    try:
        for i in range(30):
            with pub.path.open("a") as f:
                f.write(f'{{"event": "line-{i:03d}", "pad": "{"x" * 20}"}}\n')
            await pub.poll()
        assert pub.rotations == 0 and history_files(pub.path) == [pub.path]
        assert pub.published == 30
    finally:
        pub.close()


def _rotate_and_write(path: Path, events: list[str], keep: int) -> None:
    """A writer at a small size: the file rotates before each line (as every writer rotates it)."""
    for event in events:
        rotate(path, keep=keep)
        with path.open("a") as f:
            f.write(f'{{"event": "{event}"}}\n')


@pytest.mark.anyio
async def test_every_file_rotated_between_two_polls_is_published_in_order(tmp_path: Path) -> None:
    """The writers rotated the file four times between two polls: every line is published, once."""
    pub = _publisher(tmp_path, max_bytes=None)
    try:
        with structlog.testing.capture_logs() as logged:
            for burst in range(3):
                _rotate_and_write(pub.path, [f"line-{burst}-{k}" for k in range(4)], keep=1000)
                await pub.poll()
        events = [line.split('"')[3] for _, line in pub.recent()["lines"]]
        assert events == [f"line-{burst}-{k}" for burst in range(3) for k in range(4)]
        assert not [e for e in logged if e["event"] == "log_lines_skipped"]
    finally:
        pub.close()


@pytest.mark.anyio
async def test_lines_rotated_past_keep_before_a_poll_are_warned_of_once(tmp_path: Path) -> None:
    """Files deleted (past log_keep) before the poll read them: what is left is published, and a
    warning says lines may be missing, once."""
    pub = _publisher(tmp_path, max_bytes=None)
    try:
        with structlog.testing.capture_logs() as logged:
            _rotate_and_write(pub.path, [f"line-{k}" for k in range(5)], keep=2)
            await pub.poll()
            await pub.poll()
        events = [line.split('"')[3] for _, line in pub.recent()["lines"]]
        assert events == ["line-2", "line-3", "line-4"]
        skipped = [e for e in logged if e["event"] == "log_lines_skipped"]
        assert len(skipped) == 1 and skipped[0]["log_level"] == "warning"
        assert "may be missing" in skipped[0]["error"] and "log_keep" in skipped[0]["error"]
    finally:
        pub.close()


@pytest.mark.anyio
async def test_a_file_that_cannot_be_rotated_is_warned_of_once_not_at_every_poll(tmp_path: Path) -> None:
    """The poll rotates under the writers' lock; where that cannot be taken (a directory in the lock
    file's place) it says so once, and again only after a rotation has succeeded in between."""
    path = tmp_path / "n1.jsonl"
    path.write_text('{"event": "before the start"}\n' * 20)
    lock_path(path).mkdir()
    pub = LogPublisher("n1", path, "inproc://n1-log", None, max_bytes=200, keep=2)  # no port: none read it
    try:
        with structlog.testing.capture_logs() as logged:
            for _ in range(3):
                await pub.poll()
        failed = [e for e in logged if e["event"] == "log_rotation_failed"]
        assert len(failed) == 1 and "Is a directory" in str(failed[0]["error"])
        lock_path(path).rmdir()
        await pub.poll()
        assert pub.rotations == 1 and rotated_path(path, 1).exists()
    finally:
        pub.close()


@pytest.fixture
def cluster_keys(tmp_path: Path) -> Iterator[CurveKeys]:
    """The process's keys installed for the test (as a node with --keys), removed after it."""
    generate_keys(tmp_path / "keys")
    keys = load_keys(tmp_path / "keys")
    install(keys)
    try:
        yield keys
    finally:
        install(None)


@pytest.mark.anyio
async def test_with_keys_only_an_authorised_subscriber_gets_lines(
    tmp_path: Path, cluster_keys: CurveKeys
) -> None:
    """With CURVE keys the stream is a CURVE server behind the authenticator: a subscriber with the
    cluster's keys gets the lines; one without keys gets none of them."""
    pub = _publisher(tmp_path)
    context: zmq.Context[Any] = zmq.Context()
    good = log_socket(context, zmq.SUB)  # the installed keys: a client of the cluster's key
    install(None)
    bad = log_socket(context, zmq.SUB)  # no keys: plain ZeroMQ
    install(cluster_keys)
    try:
        for sub in (good, bad):
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub.endpoint)
        got: list[list[bytes]] = []
        with anyio.fail_after(WAIT_S):
            while not got:
                with pub.path.open("a") as f:
                    f.write('{"event": "secret"}\n')
                await pub.poll()
                await anyio.sleep(0.05)
                while good.poll(0):
                    got.append(good.recv_multipart())
        assert got[0][3] == b'{"event": "secret"}'
        assert bad.poll(200) == 0  # nothing, though the good subscriber has had lines
    finally:
        good.close(0)
        bad.close(0)
        context.term()
        pub.close()


@pytest.mark.anyio
async def test_the_recent_lines_stay_within_their_bytes(tmp_path: Path) -> None:
    """Long lines: the node keeps fewer of them, never more than RECENT_BYTES."""
    pub = _publisher(tmp_path)
    try:
        line = '{"event": "%s"}\n' % ("x" * (1 << 20))
        for _ in range(6):
            with pub.path.open("a") as f:
                f.write(line)
            await pub.poll()
        kept = pub.recent()["lines"]
        assert [seq for seq, _ in kept] == [4, 5, 6]  # a fourth would pass 4 MiB
        assert pub.published == 6
    finally:
        pub.close()
