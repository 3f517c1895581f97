"""The wire codec: envelopes to frames and back, with every received frame validated.

A message on the wire is one header frame (a msgpack array, the envelope) followed by zero or
more buffer frames. Large binary values (numpy arrays, and any type with a registered buffer
extension such as torch tensors) are not copied into the header: the header holds a msgpack
extension that points at a buffer frame by index, and the receiver views that frame in place.
docs/PROTOCOL.md is the normative description; this module is its only implementation and the
only module that imports msgpack (besides the heartbeat datagram format).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NoReturn

import msgpack

from troupe.runtime.errors import (
    BadFrame,
    EncodeError,
    MessageTooLarge,
    ProtocolError,
    VersionMismatch,
)

from .batch_frames import BATCH_MARK, MAX_BATCH_BYTES
from .map_keys import key_refusal

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    import numpy as np
    from numpy import ndarray


def _np() -> Any:
    """numpy, imported on first use: processes that never see an array (the node, the
    supervisor) are spared its import time and memory."""
    import numpy

    return numpy


__all__ = [
    "DEFAULT_MAX_FRAMES",
    "K_ASK",
    "K_CONTROL",
    "K_ERROR",
    "K_REPLY",
    "K_TELL",
    "PROTOCOL_VERSION",
    "BufferExtension",
    "Codec",
    "Envelope",
    "Kind",
    "declared_extensions",
    "load_imported_extensions",
    "register_extension",
]

PROTOCOL_VERSION = 1

EXT_NDARRAY = 1
EXT_CUSTOM = 2

_FIELDS = 11
# The most frames of a message, by default: the header and 1023 arrays or tensors. A frame
# costs the receiver a Python object however small it is, so their count is bounded apart from
# their bytes; legitimate messages (a batch of a few items of a few arrays each) stay far below.
DEFAULT_MAX_FRAMES = 1024
_SYS_LITTLE = sys.byteorder == "little"


class Kind(IntEnum):
    """What an envelope is for; the integer values are the wire values."""

    TELL = 1
    ASK = 2
    REPLY = 3
    ERROR = 4
    CONTROL = 5


_KINDS = {int(k): k for k in Kind}
# Kind's members as plain module names, for code that tests the kind of every message: on
# Python 3.11 reading a member off its Enum class costs about 0.2 us, a global a few ns.
K_TELL, K_ASK, K_REPLY, K_ERROR, K_CONTROL = Kind.TELL, Kind.ASK, Kind.REPLY, Kind.ERROR, Kind.CONTROL
_REPLY = int(Kind.REPLY)
_ANSWERED = frozenset((Kind.ASK, Kind.CONTROL))  # kinds whose msg_id a reply names: never 0


@dataclass(slots=True)
class Envelope:
    """One message: addressing, ids and headers around a payload.

    ``deadline`` is seconds since the epoch on the sender's clock (the receiver drops work whose
    deadline passed; an ask's ``ttl`` header, when there, says it without the clock:
    core/message_deadline.py); ``headers`` holds optional extras (an ask's ttl, credits,
    fault hints) and is empty for most tells.
    """

    kind: Kind
    msg_id: int
    corr_id: int
    sender: str
    target: str
    type: str
    deadline: float | None = None
    trace: str | None = None
    headers: dict[str, Any] | None = None
    payload: Any = None


@dataclass(frozen=True, slots=True)
class BufferExtension:
    """How a foreign array type (a torch tensor) travels as a buffer frame.

    Args:
        name: wire name of the extension, e.g. ``"torch"``.
        cls: the Python type this extension encodes (checked with ``isinstance``).
        to_buffer: returns ``(meta, buffer)``: msgpack-able metadata and a contiguous buffer;
            raises ValueError (or TypeError) saying what to send instead for a value it cannot
            encode. Any exception it raises reaches the sender as EncodeError.
        from_buffer: rebuilds the value from ``(meta, memoryview)`` without copying.
    """

    name: str
    cls: type
    to_buffer: Callable[[Any], tuple[Any, Any]]
    from_buffer: Callable[[Any, memoryview], Any]


_EXTENSIONS: dict[str, BufferExtension] = {}
_EXT_BY_TYPE: dict[type, BufferExtension] = {}


def register_extension(ext: BufferExtension) -> None:
    """Register a buffer extension; the runtime itself never imports the foreign library."""
    _EXTENSIONS[ext.name] = ext
    _EXT_BY_TYPE[ext.cls] = ext


ENTRY_POINT_GROUP = "troupe.codecs"
_loaded_entry_points: set[str] = set()


def declared_extensions() -> list[str]:
    """The extension names the ``troupe.codecs`` entry points declare, read once per process
    (some 15 ms: every installed distribution's metadata). A node's template reads them before
    it forks, so that its workers start without reading them again."""
    return list(_declared_entry_points())


def _declared_entry_points() -> dict[str, list[EntryPoint]]:
    global _declared
    if _declared is None:
        from importlib.metadata import entry_points

        declared: dict[str, list[EntryPoint]] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            declared.setdefault(ep.name, []).append(ep)
        _declared = declared
    return _declared


def _load_extension(name: str) -> BufferExtension | None:
    """Load the extension named ``name`` from the ``troupe.codecs`` entry points, once.

    Packages declare extensions as entry points (troupe's own torch extension is one), so a
    process imports torch only when a tensor actually arrives or leaves.
    """
    if name in _EXTENSIONS or name in _loaded_entry_points:
        return _EXTENSIONS.get(name)
    _loaded_entry_points.add(name)
    for ep in _declared_entry_points().get(name, ()):
        ext = ep.load()
        if isinstance(ext, BufferExtension):
            register_extension(ext)
    return _EXTENSIONS.get(name)


def _extension_refused(name: str, process: str) -> BadFrame:
    """The BadFrame of a value of extension ``name`` that arrived in a process that imports no
    extension's library for a peer (``Codec(no_extension_imports=...)``)."""
    return BadFrame(
        f"this process ({process}) does not take {_shown(name)} values: only a worker imports "
        "an extension's library when one arrives (docs/PROTOCOL.md, section 6.2)"
    )


def _shown(value: Any, most: int = 60) -> str:
    """``repr(value)`` cut to ``most`` characters: what a message shows of a peer's value (a
    bad frame's reason goes back to the peer and into the log; a 60 MB dtype string must not)."""
    return _cut(repr(value), most)


def _cut(text: str, most: int = 200) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def load_imported_extensions() -> list[str]:
    """Load now every ``troupe.codecs`` extension whose library this process already imported.

    An extension is named after its library's top-level module (``torch``). A worker calls this
    once its actors have started: if they imported torch, the torch extension costs a few
    milliseconds here instead of stalling the first tensor that arrives; a worker whose actors
    never import torch is not made to import it (seconds and some 200 MiB).

    The entry points are read once per process (``declared_extensions``; a worker forked from
    a template inherits them); later calls (a ``spawn`` control) reuse what was read.

    Returns:
        The names of the extensions now registered.
    """
    for name in _declared_entry_points():
        if name in sys.modules:
            _load_extension(name)
    return sorted(_EXTENSIONS)


_declared: dict[str, list[EntryPoint]] | None = None  # the entry points, by extension name


# Where the bounds are set: a node's config for its actors, a pipeline's for its replicas. A
# process whose bounds are no option (the master, the supervisor, a client) names none.
_RAISE_MESSAGE_MB = "raise max_message_mb ([node] of the node's config, or [pipeline] of a pipeline's) or "
_RAISE_MAX_FRAMES = "raise the node option max_frames or "


class Codec:
    """Encodes envelopes to frames and decodes frames to envelopes, validating on the way.

    One instance per thread: the packer is reused between calls.

    Both limits hold both ways: a message over them is refused on receipt before it is decoded,
    and refused when encoded (MessageTooLarge at the sender, rather than a refusal that the
    receiver may not be able to answer: libzmq drops the connection of a frame over the limit).

    Args:
        max_message_bytes: the largest message (all frames together) this process accepts.
        max_frames: the most frames a message may have: the header and one per array or
            tensor it carries (node option ``max_frames``).
        node_limits: the limits are the node config's options (a node, its workers, a user's
            process): a refusal names the option to raise. False (the master, the supervisor,
            a CLI client, which offer no such option): it states the limit only.
        no_extension_imports: what this process is (``"master"``) where it hosts no actor that
            takes tensors: a value of an extension not loaded yet is then refused (BadFrame)
            unless its library is already imported, rather than imported on receipt, which
            any peer could make cost seconds and some 200 MiB (torch) on the event loop. None
            (a worker, a user's process): the extension loads when its first value arrives.
    """

    def __init__(
        self,
        max_message_bytes: int = 64 * 1024 * 1024,
        max_frames: int = DEFAULT_MAX_FRAMES,
        *,
        node_limits: bool = True,
        no_extension_imports: str | None = None,
    ) -> None:
        if max_message_bytes < 1 or max_frames < 1:
            raise ValueError(
                f"max_message_bytes and max_frames must be >= 1, got {max_message_bytes!r}, {max_frames!r}"
            )
        self.max_message_bytes = max_message_bytes
        self.max_frames = max_frames
        self._raise_bytes = _RAISE_MESSAGE_MB if node_limits else ""
        self._raise_frames = _RAISE_MAX_FRAMES if node_limits else ""
        self.no_extension_imports = no_extension_imports
        # The hook of a message with no buffer frames: any buffer reference in it points at no
        # frame (one per codec: it carries the codec's ``no_extension_imports``).
        self._no_buffers = _ExtHook((b"",), set(), no_extension_imports)
        self._buffers: list[Any] = []  # out-of-band buffers of the message being packed
        self._packer = msgpack.Packer(default=self._default, use_bin_type=True)

    # -- encoding -----------------------------------------------------------------------------

    def encode(self, env: Envelope) -> list[Any]:
        """Return the frames of ``env``: the header, then one frame per out-of-band buffer.

        Raises:
            EncodeError: the payload or headers hold a value with no wire encoding.
            MessageTooLarge: the message is over this codec's size or frame limit.
        """
        return self._frames(
            [
                PROTOCOL_VERSION,
                int(env.kind),
                env.msg_id,
                env.corr_id,
                env.sender,
                env.target,
                env.type,
                env.deadline,
                env.trace,
                env.headers,
                env.payload,
            ],
            env.type,
        )

    def encode_message(
        self,
        kind: Kind,
        msg_id: int,
        sender: str,
        target: str,
        msg_type: str,
        deadline: float | None,
        trace: str | None,
        headers: dict[str, Any] | None,
        payload: Any,
    ) -> list[Any]:
        """The frames of a message that answers none (corr_id 0: a tell, an ask): ``encode`` of
        that envelope, without building it (the runtime sends one per tell and ask). Raises
        like ``encode``."""
        # ``_frames``, inlined (one call less per tell and ask).
        try:
            header = self._packer.pack(
                [
                    PROTOCOL_VERSION,
                    kind,
                    msg_id,
                    0,
                    sender,
                    target,
                    msg_type,
                    deadline,
                    trace,
                    headers,
                    payload,
                ]
            )
        except Exception as exc:
            self._pack_failed(exc, msg_type)
        if self._buffers:
            return self._with_buffers(header, msg_type)
        if len(header) > self.max_message_bytes:
            self._too_large(len(header), msg_type)
        return [header]

    def encode_reply(self, corr_id: int, sender: str, payload: Any) -> list[Any]:
        """The frames of a REPLY to message ``corr_id``: ``encode`` of that envelope, without
        building it (a reply is sent for every ask). Raises like ``encode``."""
        # ``_frames``, inlined (one call less per reply).
        try:
            header = self._packer.pack(
                [PROTOCOL_VERSION, _REPLY, 0, corr_id, sender, "", "", None, None, None, payload]
            )
        except Exception as exc:
            self._pack_failed(exc, "")
        if self._buffers:
            return self._with_buffers(header, "")
        if len(header) > self.max_message_bytes:
            self._too_large(len(header), "")
        return [header]

    def _frames(self, fields: list[Any], msg_type: str) -> list[Any]:
        # ``_buffers`` is empty between calls (``_with_buffers`` and ``_pack_failed`` leave it
        # so): ``_default`` fills it during a pack.
        try:
            header = self._packer.pack(fields)
        except Exception as exc:
            self._pack_failed(exc, msg_type)
        if self._buffers:
            return self._with_buffers(header, msg_type)
        if len(header) > self.max_message_bytes:
            self._too_large(len(header), msg_type)
        return [header]

    def _pack_failed(self, exc: Exception, msg_type: str) -> NoReturn:
        self._packer.reset()
        self._buffers = []
        if isinstance(exc, EncodeError):
            raise exc
        if isinstance(exc, (TypeError, ValueError, OverflowError)):
            what = f"message {msg_type!r}" if msg_type else "a reply"  # a reply has no type
            raise EncodeError(
                f"cannot encode {what}: {exc}; payloads may hold None, bool, int, float, str, "
                "bytes, lists, dicts with str, int or bytes keys, numpy arrays and registered "
                "buffer types"
            ) from exc
        # Anything else (a BufferError of a memoryview that is not contiguous, a MemoryError)
        # is this value's failure all the same: its caller refuses that message alone.
        what = f"message {msg_type!r}" if msg_type else "a reply"
        raise EncodeError(f"cannot encode {what}: {type(exc).__name__}: {_cut(str(exc))}") from exc

    def _with_buffers(self, header: bytes, msg_type: str) -> list[Any]:
        """The frames of a message whose payload put buffers out of band (``_default``)."""
        buffers = self._buffers
        self._buffers = []
        if len(buffers) >= self.max_frames:
            raise MessageTooLarge(
                f"message {msg_type!r} would have {len(buffers) + 1} frames (one per array or "
                f"tensor, and the header); the limit is {self.max_frames}: {self._raise_frames}send "
                "fewer, larger arrays"
            )
        total = len(header)
        for buf in buffers:
            total += memoryview(buf).nbytes
        if total > self.max_message_bytes:
            self._too_large(total, msg_type)
        return [header, *buffers]

    def _too_large(self, size: int, msg_type: str) -> NoReturn:
        what = f"message {msg_type!r}" if msg_type else "a reply"  # a reply has no type
        raise MessageTooLarge(
            f"{what} of {size} bytes exceeds the limit of {self.max_message_bytes}; "
            f"{self._raise_bytes}send the data by reference"
        )

    def _default(self, obj: Any) -> Any:
        np = sys.modules.get("numpy")  # no numpy imported: the value cannot be a numpy one
        if np is not None:
            if isinstance(obj, np.ndarray):
                if type(obj) is not np.ndarray and type(obj) not in _plain_subclasses(np):
                    raise EncodeError(_subclass_refused(obj, np))
                return self._pack_ndarray(obj)
            if isinstance(obj, np.generic):
                if obj.dtype.kind in "mM":  # as a number its unit would be lost: a 0-d array
                    return self._pack_ndarray(np.asarray(obj))
                return obj.item()
        if isinstance(obj, tuple):
            return list(obj)
        ext = _EXT_BY_TYPE.get(type(obj))
        if ext is None:
            _load_extension(type(obj).__module__.partition(".")[0])
            for cls, candidate in _EXT_BY_TYPE.items():
                if isinstance(obj, cls):
                    ext = candidate
                    break
        if ext is not None:
            meta, buf = self._ext_buffer(ext, obj)
            index = len(self._buffers)
            self._buffers.append(buf)
            return msgpack.ExtType(EXT_CUSTOM, msgpack.packb([ext.name, meta, index]))
        if isinstance(obj, int):  # msgpack hands over the ints it cannot hold
            raise EncodeError(
                f"int {obj} is outside the 64 bits msgpack holds (-2**63 to 2**64-1): send it as a str"
            )
        raise EncodeError(f"no wire encoding for {type(obj).__qualname__}")

    @staticmethod
    def _ext_buffer(ext: BufferExtension, obj: Any) -> tuple[Any, Any]:
        """``ext.to_buffer(obj)``, any exception of it an EncodeError naming the value's type: a
        foreign library raises what it likes (torch a RuntimeError for a conjugate view), and an
        exception other than EncodeError escaped the caller that fails that value alone, killing
        the worker and its batch's other items with it."""
        try:
            return ext.to_buffer(obj)
        except EncodeError:
            raise
        except Exception as exc:
            why = _cut(str(exc))
            if not isinstance(exc, (TypeError, ValueError)):  # not the extension's own refusal
                why = f"the {ext.name!r} extension failed on it: {type(exc).__name__}: {why}"
            raise EncodeError(f"no wire encoding for this {type(obj).__qualname__}: {why}") from exc

    def _pack_ndarray(self, arr: np.ndarray) -> msgpack.ExtType:
        np = _np()
        if arr.dtype.hasobject:
            raise EncodeError("numpy arrays of dtype object cannot travel; use a numeric dtype")
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        index = len(self._buffers)
        # A zero-size array has no buffer worth sending but keeps its frame for simplicity.
        self._buffers.append(_raw_buffer(arr) if arr.size else b"")
        # A structured dtype travels as numpy's descr (field names, formats, offsets as padding),
        # as in .npy files; dtype.str would be a bare "|V<n>" record without its field names.
        dtype = arr.dtype.str if arr.dtype.names is None else arr.dtype.descr
        return msgpack.ExtType(EXT_NDARRAY, msgpack.packb([dtype, list(arr.shape), index]))

    # -- decoding -----------------------------------------------------------------------------

    def check_size(self, frames: Sequence[Any]) -> None:
        """Raise MessageTooLarge when the frames together exceed the limit."""
        total = 0
        for frame in frames:
            total += len(frame)
        if total > self.max_message_bytes:
            raise MessageTooLarge(
                f"message of {total} bytes exceeds the limit of {self.max_message_bytes}; "
                f"{self._raise_bytes}send the data by reference"
            )

    def _check_size_of(self, header: bytes, frames: Sequence[Any]) -> None:
        """``check_size`` on receipt: a refusal names the envelope it came in (read from the
        header's first fields), so that the ask it was, or the ask it answers, hears why at once
        rather than at its deadline."""
        try:
            self.check_size(frames)
        except MessageTooLarge as exc:
            exc.envelope = _envelope_ids(header)
            raise

    def decode(self, frames: Sequence[Any]) -> Envelope:
        """Decode and validate one message.

        Args:
            frames: the header (bytes) then buffer frames (bytes, memoryview or zmq.Frame).

        Raises:
            BadFrame, VersionMismatch, MessageTooLarge: the frames break docs/PROTOCOL.md.
        """
        f = self.decode_fields(frames)
        return Envelope(f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10])

    def decode_fields(self, frames: Sequence[Any]) -> list[Any]:
        """``decode``, validated alike, as the envelope's fields in wire order: ``[version,
        kind (a Kind), msg_id, corr_id, sender, target, type, deadline, trace, headers,
        payload]``. The runtime's receiving path reads these without building an Envelope
        (one per message). Raises like ``decode``."""
        if len(frames) == 1:  # the common case, a header alone: no buffer bookkeeping
            header = frames[0]
            if type(header) is not bytes:
                header = bytes(header)
            if len(header) > self.max_message_bytes:
                self._check_size_of(header, frames)
            # ``_unpack_header``'s first pass, inlined (one call less per message); a header it
            # refuses goes through ``_unpack_header``, which says why (or decodes it after all).
            try:
                fields = msgpack.unpackb(header, ext_hook=self._no_buffers, raw=False, use_list=True)
            except Exception:
                fields = _unpack_header(header, self._no_buffers)
            return _checked(fields)
        if not frames:
            raise BadFrame("empty message: expected a header frame")
        header = frames[0]
        if not isinstance(header, bytes):
            header = bytes(header)
        if len(frames) > self.max_frames:
            exc = MessageTooLarge(
                f"message of {len(frames)} frames exceeds the limit of {self.max_frames}; "
                f"{self._raise_frames}send fewer, larger arrays"
            )
            exc.envelope = _envelope_ids(header)
            raise exc
        self._check_size_of(header, frames)
        used: set[int] = set()
        fields = _checked(_unpack_header(header, _ExtHook(frames, used, self.no_extension_imports)))
        if len(used) != len(frames) - 1:
            raise BadFrame(
                f"message has {len(frames) - 1} buffer frames but the header references {len(used)}"
            )
        return fields


def _plain_subclasses(np: Any) -> tuple[type, ...]:
    """The ndarray subclasses that travel as plain arrays: all they hold is their elements (a
    memmap's file, a matrix's and a recarray's ways of indexing are the reader's business)."""
    return (np.memmap, np.matrix, np.recarray)


def _subclass_refused(arr: Any, np: Any) -> str:
    """Why an ndarray subclass that holds more than its elements cannot travel: packed as its
    elements alone, a MaskedArray arrived a plain array, its masked values unmasked."""
    if isinstance(arr, np.ma.MaskedArray):
        return "a numpy MaskedArray cannot travel (its mask would be lost): send its .data and .mask"
    name = type(arr).__qualname__
    return (
        f"a numpy ndarray subclass ({name}) cannot travel as one (what it holds besides its "
        "elements would be lost): send np.asarray(value) and the rest apart"
    )


def _raw_buffer(arr: np.ndarray) -> Any:
    """The elements of a C-contiguous array as a buffer, without copying.

    The buffer protocol refuses datetime64 and timedelta64 (also inside a structured dtype):
    their bytes travel as those of a uint8 view of the same memory.
    """
    try:
        return arr.data
    except ValueError:
        return arr.reshape(-1).view(_np().uint8).data


def _said(exc: Exception) -> str:
    """What went wrong, also where the exception says nothing (msgpack's StackError)."""
    if isinstance(exc, msgpack.StackError):
        return "nested deeper than msgpack unpacks (StackError)"
    return str(exc) or type(exc).__name__


def _not_an_envelope(header: bytes, exc: Exception) -> BadFrame:
    if header[:1] == BATCH_MARK:  # a batch the transport could not take apart
        return BadFrame(
            f"a batch frame (first byte 0xC1) that is malformed, over {MAX_BATCH_BYTES} bytes, "
            "or inside another batch (docs/PROTOCOL.md, section 2.1)"
        )
    return BadFrame(f"header is not a valid msgpack envelope: {_said(exc)}")


def _unpack_header(header: bytes, hook: _ExtHook) -> Any:
    # Map keys are str, int or bin (docs/PROTOCOL.md 6). msgpack's strict_map_key admits str
    # and bin only, at no cost: the usual header decodes in one pass. A header it refuses (an
    # int key, or a nil, bool or float one) is decoded again, checking every key.
    try:
        return msgpack.unpackb(header, ext_hook=hook, raw=False, use_list=True)
    except (BadFrame, VersionMismatch):
        raise
    except ValueError as exc:
        if "map key" not in str(exc):
            raise _not_an_envelope(header, exc) from exc
    except Exception as exc:  # msgpack raises many types for garbage; all mean "bad frame"
        raise _not_an_envelope(header, exc) from exc
    hook.used.clear()  # the first pass may have claimed buffer frames before it failed
    refused: list[Any] = []

    def checked_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        for key, _ in pairs:
            kt = type(key)
            if kt is not str and kt is not int and kt is not bytes:  # type(): a bool is no int key
                refused.append(key)
                return {}
        return dict(pairs)

    try:
        fields = msgpack.unpackb(
            header,
            ext_hook=hook,
            raw=False,
            use_list=True,
            strict_map_key=False,
            object_pairs_hook=checked_map,
        )
    except (BadFrame, VersionMismatch):
        raise
    except Exception as exc:
        raise BadFrame(f"header is not a valid msgpack envelope: {_said(exc)}") from exc
    if refused:
        raise _refused_key(fields, refused[0])
    return fields


_IDS_PREFIX = 4096  # bytes of a refused header read for its ids: the fields before the type are short


def _envelope_ids(header: bytes) -> tuple[Any, int, int, str] | None:
    """The kind, msg_id, corr_id and target of a message refused unread, from its header's
    first bytes alone (a header over the bound is never decoded whole); None where they are not
    all there or not sound."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=_IDS_PREFIX)
    unpacker.feed(header[:_IDS_PREFIX])
    try:
        if unpacker.read_array_header() != _FIELDS:
            return None
        version, kind, msg_id, corr_id, _sender, target = (unpacker.unpack() for _ in range(6))
    except Exception:  # cut short by the prefix, or not msgpack: nobody to answer
        return None
    k = _KINDS.get(kind) if type(kind) is int else None
    if (
        type(version) is not int
        or version != PROTOCOL_VERSION
        or k is None
        or type(msg_id) is not int
        or type(corr_id) is not int
        or msg_id < 0
        or corr_id < 0
        or type(target) is not str
    ):
        return None
    return (k, msg_id, corr_id, target)


def _refused_key(fields: Any, key: Any) -> BadFrame:
    """The BadFrame of a header whose only fault may be a map key that is not str, int or bin
    (the sender's msgpack packs any): it names the envelope it came in where that envelope is
    sound, so that the ask it was, or the ask it answers, gets the error at once rather than
    waiting out its deadline."""
    exc = BadFrame(key_refusal(key))
    with contextlib.suppress(ProtocolError):
        checked = _checked(fields)
        exc.envelope = (checked[1], checked[2], checked[3], checked[5])
    return exc


class _ExtHook:
    __slots__ = ("frames", "no_imports", "used")

    def __init__(self, frames: Sequence[Any], used: set[int], no_imports: str | None) -> None:
        self.frames = frames
        self.used = used
        self.no_imports = no_imports  # Codec's no_extension_imports

    def __call__(self, code: int, data: bytes) -> Any:
        try:
            spec = msgpack.unpackb(data, raw=False)
        except Exception as exc:
            raise BadFrame(f"extension {code} has a malformed body: {exc}") from exc
        if code == EXT_NDARRAY:
            return self._ndarray(spec)
        if code == EXT_CUSTOM:
            return self._custom(spec)
        raise BadFrame(f"unknown extension code {code}")

    def _buffer(self, index: Any) -> memoryview:
        if not isinstance(index, int) or not 0 <= index < len(self.frames) - 1:
            raise BadFrame(f"buffer reference {_shown(index)} points at no frame")
        if index in self.used:
            raise BadFrame(f"buffer frame {index} is referenced twice")
        self.used.add(index)
        frame = self.frames[index + 1]
        buf = getattr(frame, "buffer", frame)  # zmq.Frame exposes .buffer without copying
        return memoryview(buf)

    def _ndarray(self, spec: Any) -> np.ndarray:
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], (str, list))):
            raise BadFrame("ndarray extension must be [dtype, shape, buffer index]")
        dtype_str, shape, index = spec
        np = _np()
        descr = dtype_str if isinstance(dtype_str, str) else _fields(dtype_str)
        try:
            if isinstance(descr, str):
                dtype = np.dtype(descr)
            else:  # numpy's own reader of a descr: padding entries become offsets again
                from numpy.lib.format import descr_to_dtype

                dtype = descr_to_dtype(descr)
        except (TypeError, ValueError, KeyError, RecursionError) as exc:
            raise BadFrame(f"ndarray has an unknown dtype {_shown(dtype_str)}") from exc
        if dtype.hasobject:
            raise BadFrame("ndarray of dtype object refused")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise BadFrame(f"ndarray shape {_shown(shape)} is not a list of non-negative ints")
        buf = self._buffer(index)
        count = 1
        for d in shape:
            count *= d
        if buf.nbytes != count * dtype.itemsize:
            raise BadFrame(
                f"ndarray of shape {_shown(shape)} and dtype {_shown(dtype_str)} needs "
                f"{count * dtype.itemsize} bytes, its frame has {buf.nbytes}"
            )
        # A view of the received frame, not a copy: read-only, so that no handler writes into
        # message memory by mistake (docs/PROTOCOL.md 6.1); copy it to write.
        arr: ndarray = (
            np.empty(shape, dtype=dtype) if count == 0 else np.frombuffer(buf, dtype=dtype).reshape(shape)
        )
        arr.flags.writeable = False
        return arr

    def _custom(self, spec: Any) -> Any:
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str)):
            raise BadFrame("custom extension must be [name, meta, buffer index]")
        name, meta, index = spec
        ext = _EXTENSIONS.get(name)
        if ext is None:
            # An extension is named after its library (docs/PROTOCOL.md 6.2): one already
            # imported here costs milliseconds to load; any other is refused where no import
            # is allowed, before the entry points are even read.
            if self.no_imports is not None and name not in sys.modules:
                raise _extension_refused(name, self.no_imports)
            ext = _load_extension(name)
        if ext is None:
            raise BadFrame(f"no codec extension named {_shown(name)} is registered in this process")
        buf = self._buffer(index)
        try:
            return ext.from_buffer(meta, buf)
        except Exception as exc:
            raise BadFrame(f"extension {name!r} rejected its buffer: {_cut(str(exc))}") from exc


def _fields(descr: list[Any]) -> list[tuple[Any, ...]]:
    """A structured dtype's descr as numpy takes it back: msgpack turned its tuples into lists.

    Raises:
        BadFrame: it is not a list of ``[name, format]`` or ``[name, format, shape]`` fields.
    """
    out: list[tuple[Any, ...]] = []
    for field in descr:
        if not isinstance(field, list) or len(field) not in (2, 3):
            raise BadFrame("a structured ndarray dtype must be a list of [name, format(, shape)] fields")
        name, fmt = field[0], field[1]
        if isinstance(name, list):  # (title, name)
            name = tuple(name)
        if isinstance(fmt, list):  # a nested structure
            fmt = _fields(fmt)
        if len(field) == 2:
            out.append((name, fmt))
        elif isinstance(field[2], list):
            out.append((name, fmt, tuple(field[2])))
        else:
            out.append((name, fmt, field[2]))
    return out


def _checked(fields: Any) -> list[Any]:
    """The decoded header's fields, validated, with the kind as a ``Kind``."""
    # The fast path checks everything in one expression; only a bad envelope pays for
    # _explain, which finds the first broken field and says what is wrong with it.
    if type(fields) is list and len(fields) == _FIELDS:
        version, kind, msg_id, corr_id, sender, target, mtype, deadline, trace, headers, _ = fields
        k = _KINDS.get(kind) if type(kind) is int else None
        if (
            type(version) is int
            and version == PROTOCOL_VERSION
            and k is not None
            and type(msg_id) is int
            and type(corr_id) is int
            and msg_id >= 0
            and corr_id >= 0
            and type(sender) is str
            and type(target) is str
            and type(mtype) is str
            and (deadline is None or type(deadline) is float or type(deadline) is int)
            and (trace is None or type(trace) is str)
            and (headers is None or type(headers) is dict)
            and (mtype or k > K_ASK)
            and (msg_id or k not in _ANSWERED)
        ):
            fields[1] = k
            return fields
    _explain(fields)
    raise BadFrame("invalid envelope")  # _explain always raises; this keeps type checkers honest


def _explain(fields: Any) -> None:
    if not isinstance(fields, list):
        raise BadFrame(f"envelope must be a msgpack array, got {type(fields).__name__}")
    if len(fields) != _FIELDS:
        if fields and type(fields[0]) is int and fields[0] != PROTOCOL_VERSION:
            raise VersionMismatch(
                f"protocol version {fields[0]} is not supported (this process speaks {PROTOCOL_VERSION})"
            )
        raise BadFrame(f"envelope must have {_FIELDS} fields, got {len(fields)}")
    version, kind, msg_id, corr_id, sender, target, mtype, deadline, trace, headers, _ = fields
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise VersionMismatch(
            f"protocol version {_shown(version)} is not supported (this process speaks {PROTOCOL_VERSION})"
        )
    k = _KINDS.get(kind) if type(kind) is int else None
    if k is None:
        raise BadFrame(f"unknown message kind {_shown(kind)}")
    # type() rather than isinstance(): msgpack booleans are Python bools, and True == 1.
    if type(msg_id) is not int or type(corr_id) is not int or msg_id < 0 or corr_id < 0:
        raise BadFrame("msg_id and corr_id must be non-negative integers")
    if type(sender) is not str or type(target) is not str or type(mtype) is not str:
        raise BadFrame("sender, target and type must be strings")
    if deadline is not None and type(deadline) not in (int, float):
        raise BadFrame("deadline must be a number of seconds since the epoch or nil")
    if trace is not None and type(trace) is not str:
        raise BadFrame("trace must be a string or nil")
    if headers is not None and type(headers) is not dict:
        raise BadFrame("headers must be a map or nil")
    if k in (Kind.TELL, Kind.ASK) and not mtype:
        raise BadFrame("tell and ask messages need a non-empty type")
    if k in _ANSWERED and not msg_id:
        raise BadFrame(
            f"{k.name} with msg_id 0: an ask or control message needs a msg_id >= 1 "
            "for its reply to name (0 answers nothing)"
        )
