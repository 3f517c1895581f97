"""The torch codec extension: tensors travel as buffer frames, without copies where possible.

Registered through the ``troupe.codecs`` entry point named ``torch``, so the runtime loads it
only when a tensor is sent or received, or at a worker's start when its actors imported torch
(``codec.load_imported_extensions``). A CPU tensor's memory is sent as it is; a GPU tensor
is first copied to the host (the wire carries bytes, not device memory). On receipt the tensor
is a view of the message buffer, detached: ``requires_grad``, ``.grad`` and ``nn.Parameter``
are not carried. torch has no read-only tensors, so unlike a received ndarray it is not
protected against writes: clone it before writing in place (docs/PROTOCOL.md 6.2).

A conjugate or negative view (``t.conj()`` of a complex tensor, its ``.imag``) travels as the
values it shows: its lazy bit is resolved into a copy first. A tensor with no dense buffer (on
the meta device, sparse or another non-strided layout, quantized) is refused with a ValueError
that says what to send instead; the codec makes it the item's EncodeError.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from troupe.runtime.lowlevel import BufferExtension

__all__ = ["TORCH_EXTENSION"]

_AS_INT = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def _to_buffer(t: torch.Tensor) -> tuple[Any, Any]:
    t = t.detach()
    _refuse_without_dense_buffer(t)
    if t.device.type != "cpu":
        t = t.cpu()
    # numpy() refuses a tensor whose conjugate or negative bit is set (a lazy view): the copy
    # these make holds the values the view shows.
    t = t.resolve_conj().resolve_neg().contiguous()
    dtype = t.dtype
    raw = t.view(_AS_INT[dtype]) if dtype in _AS_INT else t
    arr = raw.numpy()
    return [str(dtype).removeprefix("torch."), list(t.shape)], arr.data if arr.size else b""


def _refuse_without_dense_buffer(t: torch.Tensor) -> None:
    """Raise ValueError, saying what to send instead, for a tensor with no elements in memory
    to send: numpy() would fail on it with an error that names no remedy."""
    if t.layout is not torch.strided:
        layout = str(t.layout).removeprefix("torch.")
        raise ValueError(f"a {layout} tensor has no dense buffer to send: send t.to_dense()")
    if t.is_meta:
        raise ValueError("a tensor on the meta device holds no data: make it on a real device (cpu, cuda)")
    if t.is_quantized:
        raise ValueError("a quantized tensor cannot travel: send t.dequantize() or t.int_repr()")


def _from_buffer(meta: Any, buf: memoryview) -> torch.Tensor:
    dtype_name, shape = meta
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype_name!r}")
    carrier = _AS_INT.get(dtype, dtype)
    if buf.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():
        # The buffer may be a read-only frame: torch warns that it is not writable. Documented above.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(buf, dtype=carrier)
    t = t.view(dtype) if carrier is not dtype else t
    return t.reshape(shape)


TORCH_EXTENSION = BufferExtension("torch", torch.Tensor, _to_buffer, _from_buffer)
