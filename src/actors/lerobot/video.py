"""MP4 video helpers over PyAV: encode frames, decode a time span, remux files end to end.

Encoding writes yuv420p H.264 (libx264) when the installed PyAV's ffmpeg has it, else MPEG-4
part 2; both decode everywhere LeRobot runs. Frames are stamped ``pts = i`` in a ``1/fps`` time
base with no B-frames, so frame ``i`` is at exactly ``i / fps`` seconds and packets come out in
presentation order, which is what makes :func:`concat_videos` a plain timestamp shift.

yuv420p needs even width and height: odd frames are padded by one row/column, repeating the
edge, and :class:`VideoInfo` reports both the encoded and the source size.

ffmpeg's errors that are OS errors (disk full, permissions) are PyAV ``OSError`` subclasses and
pass through unchanged, so a caller's storage boundary translates them; every other ffmpeg
error becomes :class:`~troupe.actors.lerobot.errors.InvalidData`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from troupe.actors.lerobot.errors import InvalidData

__all__ = [
    "SignatureMismatch",
    "VideoConcat",
    "VideoConfig",
    "VideoInfo",
    "best_codec",
    "codec_name",
    "concat_videos",
    "decode_video",
    "encode_video",
    "pad_even",
    "video_signature",
]


@dataclass(frozen=True)
class VideoConfig:
    """How videos are encoded.

    Attributes:
        codec: ffmpeg encoder name; None picks :func:`best_codec`.
        crf: libx264 constant rate factor (lower is better; 18 is visually lossless).
        qscale: MPEG-4 quantiser (1 best .. 31 worst), used when the codec is mpeg4.
        gop: keyframe interval in frames; small keeps random access by timestamp cheap.
        threads: encoder threads per video (the writer already encodes episodes in parallel).
        mbtree: libx264's macroblock-tree rate control. Off by default, so that the same frames
            give the same bytes in every process: with it on, libx264 (core 165, on a CPU with
            AVX-512) encoded the same frames into different bytes in 2 to 6 of 128 videos from one
            process to the next (the frames near the bottom and right edges differ by a few
            levels), and none in 2,000 with it off. Off costs no encoding time; at this GOP the
            files are about 25 % (RGB) and 40 % (depth) larger, and 0.5-1.5 dB closer to the
            source (PSNR).
    """

    codec: str | None = None
    crf: int = 18
    qscale: int = 2
    gop: int = 2
    threads: int = 1
    mbtree: bool = False


@dataclass(frozen=True)
class VideoInfo:
    """What one encoded video holds.

    Attributes:
        codec: the stream's codec name as a decoder reports it ("h264", "mpeg4").
        pix_fmt: pixel format of the stream ("yuv420p").
        height: encoded height (even).
        width: encoded width (even).
        source_height: height of the frames handed in.
        source_width: width of the frames handed in.
        fps: frames per second.
        frames: number of frames.
    """

    codec: str
    pix_fmt: str
    height: int
    width: int
    source_height: int
    source_width: int
    fps: int
    frames: int


@cache
def codec_name(encoder: str) -> str:
    """The codec an ffmpeg encoder writes, by its canonical name ("libx264" -> "h264"): what
    lerobot records as ``video.codec`` (the stream's ``codec.canonical_name``); info.json said
    "libx264", an encoder no lerobot dataset names. An encoder this ffmpeg lacks: the name itself."""
    import av

    try:
        return str(av.Codec(encoder, "w").canonical_name)
    except (av.codec.codec.UnknownCodecError, ValueError):
        return encoder


@cache
def best_codec() -> str:
    """Return "libx264" if this PyAV can encode H.264, else "mpeg4"."""
    import av  # here, not as the module loads: see troupe.actors.lerobot's docstring

    if "libx264" in av.codecs_available:
        try:
            av.Codec("libx264", "w")
            return "libx264"
        except av.FFmpegError:
            pass
    return "mpeg4"


class SignatureMismatch(InvalidData):
    """Videos given to :func:`concat_videos` differ in codec, size or headers."""

    code = "video_signature_mismatch"


@contextmanager
def _translated(what: str) -> Iterator[None]:
    import av

    try:
        yield
    except av.FFmpegError as exc:
        if isinstance(exc, OSError):
            raise
        raise InvalidData(f"{what}: ffmpeg refused it ({exc}); check the file and codec") from exc


def pad_even(frames: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Pad (T, H, W, C) frames to even H and W by repeating the last row/column."""
    pad_h = frames.shape[1] % 2
    pad_w = frames.shape[2] % 2
    if not (pad_h or pad_w):
        return frames
    return np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")


def encode_video(
    path: Path, frames: npt.NDArray[np.uint8], fps: int, config: VideoConfig = VideoConfig()
) -> VideoInfo:
    """Encode RGB frames into a new mp4 at ``path``; frame i is stamped i / fps seconds.

    Args:
        path: the mp4 to write (overwritten if present).
        frames: uint8 (T, H, W, 3), T >= 1.
        fps: frames per second (> 0).
        config: codec and quality.

    Returns:
        What was written.

    Raises:
        InvalidData: the frames have the wrong shape or dtype, or ffmpeg rejected them.
        OSError: the file could not be written.
    """
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise InvalidData(
            f"video frames are {frames.dtype} {frames.shape}; pass uint8 (T, H, W, 3) with T >= 1"
        )
    if fps <= 0:
        raise InvalidData(f"fps {fps} must be a positive integer")
    codec = config.codec or best_codec()
    padded = np.ascontiguousarray(pad_even(frames))
    height, width = padded.shape[1:3]
    options = {"g": str(config.gop), "bf": "0"}
    options.update({"crf": str(config.crf)} if "264" in codec else {"qscale": str(config.qscale)})
    if codec == "libx264":
        options["x264-params"] = f"mbtree={int(config.mbtree)}"
    time_base = Fraction(1, fps)
    import av

    with _translated(f"encoding {path}"), av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream(codec, rate=fps, options=options)
        if not isinstance(stream, av.VideoStream):
            raise InvalidData(f"codec {codec!r} is not a video encoder; pick e.g. libx264 or mpeg4")
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = time_base
        stream.codec_context.thread_count = config.threads
        for i, rgb in enumerate(padded):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts, frame.time_base = i, time_base
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
        name = stream.codec_context.name
    return VideoInfo(
        codec=codec_name(name),
        pix_fmt="yuv420p",
        height=height,
        width=width,
        source_height=frames.shape[1],
        source_width=frames.shape[2],
        fps=fps,
        frames=len(frames),
    )


def decode_video(
    path: Path, start_s: float = 0.0, end_s: float | None = None, fps: int | None = None
) -> npt.NDArray[np.uint8]:
    """Decode the frames of ``path`` whose timestamps fall in ``[start_s, end_s)`` as RGB.

    Args:
        path: an mp4.
        start_s: first timestamp wanted, seconds.
        end_s: end of the span (exclusive), or None for the end of the file.
        fps: the video's frame rate; when given, span edges get half a frame of tolerance so
            float rounding of the bounds never drops or adds a frame.

    Returns:
        uint8 (N, H, W, 3) at the encoded (even) size.

    Raises:
        InvalidData: the file is not a decodable video.
        OSError: the file cannot be read.
    """
    tol = 0.5 / fps if fps else 0.0
    lo = start_s - tol
    hi = None if end_s is None else end_s - tol
    out: list[npt.NDArray[np.uint8]] = []
    import av

    with _translated(f"decoding {path}"), av.open(str(path)) as container:
        stream = container.streams.video[0]
        if start_s > 0 and stream.time_base is not None:
            # Seek to the keyframe at or before the span so we do not decode from the start.
            container.seek(max(0, int(lo / stream.time_base)), stream=stream, backward=True)
        for frame in container.decode(stream):
            t = float(frame.time) if frame.time is not None else 0.0
            if t < lo:
                continue
            if hi is not None and t >= hi:
                break
            out.append(np.asarray(frame.to_ndarray(format="rgb24"), dtype=np.uint8))
    if not out:
        return np.zeros((0, 0, 0, 3), dtype=np.uint8)
    return np.stack(out)


def video_signature(path: Path) -> tuple[object, ...]:
    """Return what two mp4s must share to be remuxed into one stream (codec, size, headers).

    Raises:
        InvalidData: the file is not a video.
        OSError: the file cannot be read.
    """
    import av

    with _translated(f"reading {path}"), av.open(str(path)) as container:
        return _stream_signature(container.streams.video[0])


def _stream_signature(stream: Any) -> tuple[object, ...]:
    cc = stream.codec_context
    return (cc.name, cc.width, cc.height, cc.pix_fmt, bytes(cc.extradata or b""))


def concat_videos(sources: Sequence[Path], dest: Path, fps: int) -> list[tuple[float, float]]:
    """Remux whole videos end to end into ``dest`` without re-encoding.

    Each source's packets are shifted by the duration of the sources before it (its frame count
    / fps), so source k occupies ``[from_k, to_k)`` seconds in ``dest``. Every source starts on
    a keyframe (a fresh encoder), so a decoder can seek to any ``from_k``.

    Args:
        sources: mp4s with equal :func:`video_signature`, each stamped i / fps.
        dest: the mp4 to write (overwritten if present).
        fps: the common frame rate.

    Returns:
        ``(from_timestamp, to_timestamp)`` in seconds for each source, in order.

    Raises:
        InvalidData: the sources differ in signature or are not videos.
        OSError: a file could not be read or written.
    """
    if not sources:
        raise InvalidData("concat_videos needs at least one source video")
    try:
        return _remux(sources, dest, fps)
    except InvalidData:
        dest.unlink(missing_ok=True)  # half a remux is no video
        raise


def _remux(sources: Sequence[Path], dest: Path, fps: int) -> list[tuple[float, float]]:
    with VideoConcat(dest, fps) as concat:
        for src in sources:
            concat.add(src)
    return concat.spans


class VideoConcat:
    """An mp4 being remuxed from whole videos, one :meth:`add` at a time (:func:`concat_videos`
    at once; a dataset's video drafted while its episodes are written, ``dataset_drafts``). The
    file is complete once closed (leaving the ``with``); ``spans`` are the sources' spans.

    Raises (from :meth:`add`):
        SignatureMismatch: the source differs from the first in codec, size or headers (the
            file holds the sources before it, unchanged).
        InvalidData: the source is not a video, or its time base cannot express ``fps``.
        OSError: a file could not be read or written.
    """

    def __init__(self, dest: Path, fps: int) -> None:
        self.dest = dest
        self.fps = fps
        self.sources: list[Path] = []
        self.spans: list[tuple[float, float]] = []
        self._frames = 0
        self._first: tuple[object, ...] | None = None
        import av

        with _translated(f"remuxing into {dest}"):
            self._out: Any = av.open(str(dest), "w", format="mp4")
        self._stream: Any = None
        self.closed = False

    def __enter__(self) -> VideoConcat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Write the file's index: it is a whole mp4 now (once; closing again does nothing)."""
        if self.closed:
            return
        self.closed = True
        with _translated(f"remuxing into {self.dest}"):
            self._out.close()

    def discard(self) -> None:
        """Close it (a partial file) and delete it."""
        with contextlib.suppress(Exception):
            self.close()
        with contextlib.suppress(OSError):
            self.dest.unlink()

    def add(self, src: Path) -> tuple[float, float]:
        """Append ``src``'s packets, shifted past the sources before it; its span in seconds."""
        import av

        with _translated(f"remuxing into {self.dest}"), av.open(str(src)) as container:
            stream = container.streams.video[0]
            # Checked on the container opened for its packets: opening every source once
            # more for its signature was a third of a dataset's finalisation.
            signature = _stream_signature(stream)
            if self._first is None:
                self._first = signature
            elif signature != self._first:
                raise SignatureMismatch(
                    f"cannot remux {src} into {self.dest}: it differs from "
                    f"{self.sources[0]} in codec, size or headers; group sources by "
                    "video_signature() first"
                )
            shift = Fraction(self._frames, self.fps) / (stream.time_base or Fraction(1, self.fps))
            if shift.denominator != 1:
                raise InvalidData(
                    f"{src}: time base {stream.time_base} cannot express {self.fps} fps exactly; "
                    "re-encode it with encode_video"
                )
            if self._stream is None:
                self._stream = self._out.add_stream_from_template(stream)
            count = 0
            offset = int(shift)  # once, not a Fraction's __int__ per packet
            out, out_stream = self._out, self._stream
            for packet in container.demux(stream):
                if packet.dts is None or packet.pts is None:  # the end-of-stream flush packet
                    continue
                packet.pts += offset
                packet.dts += offset
                packet.stream = out_stream
                out.mux(packet)
                count += 1
        span = (self._frames / self.fps, (self._frames + count) / self.fps)
        self.sources.append(src)
        self.spans.append(span)
        self._frames += count
        return span
