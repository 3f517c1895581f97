"""The content store: task contexts on shared storage, addressed by their sha256.

A task is small metadata; its full context (a scene, a config, a list of episodes) is loaded
lazily by the worker that runs it, from the reference the task carries. References look like
``cas://sha256/<64 hex digits>``; the bytes live at ``root/sha256/<2 hex>/<62 hex>``::

    store = ContentStore(Path("/shared/troupe-content"))
    ref = store.put(json.dumps(scene).encode())    # on the submitting side
    scene = json.loads(store.get(ref))             # in the task actor

Writes are atomic (a temporary sibling, then ``os.replace``) so a reader never sees half an
object, and idempotent: putting the same bytes twice stores them once. Objects are never
modified in place, so any number of processes and hosts may share one root, provided the
file system renames atomically (any local or POSIX network file system does).

``get`` checks the digest of what it read: a truncated or damaged object raises
:class:`~troupe.runtime.errors.ContentError` rather than feeding a task wrong context.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from troupe.runtime.errors import ContentError
from troupe.runtime.library_logging import get_logger

from .output_store import atomic_file

__all__ = ["REF_PREFIX", "ContentStore", "ContentStoreStats"]

log = get_logger(__name__)

REF_PREFIX = "cas://sha256/"
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class ContentStoreStats:
    """Counters of one :class:`ContentStore` object since it was created.

    Attributes:
        puts: objects this object wrote.
        put_existing: puts that found the object already stored (no write).
        gets: objects read.
        bytes_read: bytes read by ``get``.
    """

    puts: int
    put_existing: int
    gets: int
    bytes_read: int


class ContentStore:
    """Immutable blobs in a directory, named by the sha256 of their bytes.

    Args:
        root: directory of the store (on shared storage for a cluster); created if missing.
        durable: fsync each object and its directory when writing it.

    Raises:
        ContentError: the root cannot be created.
    """

    def __init__(self, root: str | os.PathLike[str], *, durable: bool = True) -> None:
        self.root = Path(root)
        self.durable = durable
        try:
            (self.root / "sha256").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ContentError(
                f"content store {self.root}: cannot create it ({exc.strerror}); "
                "check the path and its permissions"
            ) from exc
        self._puts = self._existing = self._gets = self._bytes = 0

    @staticmethod
    def ref_of(data: bytes) -> str:
        """Return the reference ``data`` is (or would be) stored under."""
        return REF_PREFIX + hashlib.sha256(data).hexdigest()

    def path_of(self, ref: str) -> Path:
        """Return where the object of ``ref`` lives (whether or not it exists).

        Raises:
            ContentError: ``ref`` is not a ``cas://sha256/<64 hex>`` reference.
        """
        digest = _digest(ref)
        return self.root / "sha256" / digest[:2] / digest[2:]

    def put(self, data: bytes) -> str:
        """Store ``data`` (once) and return its reference.

        Raises:
            ContentError: the object could not be written (disk full, permissions).
        """
        ref = self.ref_of(data)
        path = self.path_of(ref)
        if path.is_file():
            self._existing += 1
            return ref
        try:
            with atomic_file(path, durable=self.durable) as tmp:
                tmp.write_bytes(data)
        except OSError as exc:
            raise ContentError(
                f"content store {self.root}: writing {ref} failed "
                f"({exc.strerror or exc}); check the volume's space and "
                "permissions"
            ) from exc
        self._puts += 1
        log.debug("content_put", ref=ref, size=len(data))
        return ref

    def has(self, ref: str) -> bool:
        """Return whether the object of ``ref`` is stored.

        Raises:
            ContentError: ``ref`` is malformed.
        """
        return self.path_of(ref).is_file()

    def get(self, ref: str) -> bytes:
        """Return the bytes of ``ref``, checked against its digest.

        Raises:
            ContentError: malformed reference, missing object, read error, or bytes that do
                not match the digest.
        """
        path = self.path_of(ref)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ContentError(
                f"content {ref} is not in the store at {self.root}; put it "
                "there before submitting tasks that refer to it"
            ) from None
        except OSError as exc:
            raise ContentError(
                f"content store {self.root}: reading {ref} failed ({exc.strerror or exc}); check the volume"
            ) from exc
        if self.ref_of(data) != ref:
            raise ContentError(
                f"content {ref} at {path} is damaged (its sha256 differs); "
                "delete the file and put the object again"
            )
        self._gets += 1
        self._bytes += len(data)
        return data

    def statistics(self) -> ContentStoreStats:
        """Return this object's counters."""
        return ContentStoreStats(self._puts, self._existing, self._gets, self._bytes)


def _digest(ref: str) -> str:
    if not isinstance(ref, str) or not ref.startswith(REF_PREFIX):
        raise ContentError(f"content reference {ref!r} must look like {REF_PREFIX}<64 hex digits>")
    digest = ref[len(REF_PREFIX) :]
    if not _DIGEST.fullmatch(digest):
        raise ContentError(f"content reference {ref!r} must look like {REF_PREFIX}<64 hex digits>")
    return digest
