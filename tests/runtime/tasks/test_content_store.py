"""The content store: content-addressed, idempotent, atomic, and checked on every read."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from troupe.runtime.errors import ContentError
from troupe.runtime.tasks.content_store import REF_PREFIX, ContentStore


def test_put_get_has_round_trip_by_sha256(tmp_path: Path) -> None:
    """An object is stored under the sha256 of its bytes and read back unchanged."""
    store = ContentStore(tmp_path / "cas", durable=False)
    ref = store.put(b"scene 17")
    assert ref == REF_PREFIX + hashlib.sha256(b"scene 17").hexdigest()
    assert store.has(ref) and store.get(ref) == b"scene 17"
    assert not store.has(ContentStore.ref_of(b"other"))


def test_putting_the_same_bytes_twice_writes_once(tmp_path: Path) -> None:
    """A second put of the same content is a no-op that returns the same reference."""
    store = ContentStore(tmp_path, durable=False)
    assert store.put(b"x" * 1000) == store.put(b"x" * 1000)
    stats = store.statistics()
    assert (stats.puts, stats.put_existing) == (1, 1)
    assert not list((tmp_path / "sha256").rglob(".*.tmp"))  # no temporary file left behind


def test_another_process_sees_what_one_wrote(tmp_path: Path) -> None:
    """Two store objects on one root share the objects (as workers on shared storage do)."""
    ref = ContentStore(tmp_path, durable=False).put(b"shared")
    assert ContentStore(tmp_path).get(ref) == b"shared"


def test_a_damaged_object_is_refused(tmp_path: Path) -> None:
    """Bytes that no longer match their digest raise ContentError instead of feeding a task."""
    store = ContentStore(tmp_path, durable=False)
    ref = store.put(b"good bytes")
    store.path_of(ref).write_bytes(b"good byte")
    with pytest.raises(ContentError, match="damaged"):
        store.get(ref)


def test_missing_and_malformed_references_say_what_to_do(tmp_path: Path) -> None:
    """A missing object and a malformed reference each raise ContentError with the fix."""
    store = ContentStore(tmp_path, durable=False)
    with pytest.raises(ContentError, match="put it there before submitting"):
        store.get(ContentStore.ref_of(b"never stored"))
    for bad in ("sha256:abc", REF_PREFIX + "xyz", REF_PREFIX + "A" * 64):
        with pytest.raises(ContentError, match="must look like"):
            store.get(bad)
