"""Video decoding backends: decord first, PyAV as the fallback.  Every failure becomes a :class:`VideoError`.

Both backends report the same two numbers the frame-sampling rules need: the number of decoded frames and the
container's average fps (decord ``len(vr)`` / ``get_avg_fps()``; PyAV ``stream.frames`` or a packet count /
``stream.average_rate``).  Frames come back as uint8 arrays (n, H, W, 3), RGB.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

BACKENDS = ("auto", "decord", "pyav")
# Decode cap: frames larger than this are refused from the container header, before any frame is decoded (a
# crafted or mislabelled file can claim e.g. 60000 x 60000; decord decodes frame 0 at open). 8K UHD = 7680 x 4320.
MAX_FRAME_PIXELS = 7680 * 4320


class VideoError(RuntimeError):
    """A video could not be read; the message names the path and the problem."""

    def __init__(self, path: str | os.PathLike | None, problem: str):
        self.path = None if path is None else os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path if self.path is not None else '<frames>'}: {problem}")


class VideoTooLarge(VideoError):
    """The container header claims frames larger than the decode cap (``max_frame_pixels``)."""


@dataclass(frozen=True)
class VideoHeader:
    """What the container header says, read without decoding a frame (PyAV): frame size, average fps, frame count
    (0 if the header has none) and duration in seconds (the container's, else the stream's, else frames / fps;
    0 if none is known)."""

    width: int
    height: int
    fps: float
    frames: int
    duration: float


@dataclass(frozen=True)
class VideoInfo:
    """Container facts: ``total_frames`` decodable frames at ``fps`` (average); ``duration = total_frames / fps``."""

    total_frames: int
    fps: float
    height: int
    width: int

    @property
    def duration(self) -> float:
        return self.total_frames / self.fps


class _Reader:
    info: VideoInfo
    name: str
    open_errors: tuple[str, ...] = ()  # failures of backends tried before this one
    threads: int = 0  # decoder threads (0 = FFmpeg's automatic choice)

    def get_frames(self, indices: Sequence[int]):  # -> np.ndarray (n, H, W, 3) uint8
        raise NotImplementedError


class _DecordReader(_Reader):
    name = "decord"

    def __init__(self, path: str, threads: int = 0):
        import decord

        # Never touch decord.bridge here: set_bridge("torch") breaks qwen-vl-utils' reader process-wide.
        self.threads = int(threads)
        self._vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=self.threads)
        n = len(self._vr)
        fps = float(self._vr.get_avg_fps()) if n else 0.0
        h, w = (self._vr[0].shape[:2] if n else (0, 0))
        self.info = VideoInfo(n, fps, int(h), int(w))

    def get_frames(self, indices):
        return self._vr.get_batch(list(indices)).asnumpy()


class _PyAVReader(_Reader):
    name = "pyav"

    def __init__(self, path: str, threads: int = 0):
        import av

        self._path = path
        self.threads = int(threads)
        with av.open(path) as c:
            if not c.streams.video:
                raise ValueError("no video stream in the file")
            s = c.streams.video[0]
            rate = s.average_rate or s.guessed_rate or s.base_rate
            fps = float(rate) if rate else 0.0
            n = int(s.frames or 0)
            if n <= 0:  # not in the header: count packets that carry a frame (demux only, no decoding)
                n = sum(1 for p in c.demux(s) if p.size > 0)
            self.info = VideoInfo(n, fps, int(s.codec_context.height or 0), int(s.codec_context.width or 0))

    def get_frames(self, indices):
        import av
        import numpy as np

        wanted = sorted(set(int(i) for i in indices))
        last = wanted[-1]
        got: dict[int, np.ndarray] = {}
        pos = set(wanted)
        k = -1
        with av.open(self._path) as c:
            s = c.streams.video[0]
            if self.threads != 1:  # 1: FFmpeg's single-threaded decoder (no frame-thread overhead)
                s.thread_type = "AUTO"
            if self.threads > 0:
                s.codec_context.thread_count = self.threads
            for k, frame in enumerate(c.decode(s)):
                if k in pos:
                    got[k] = frame.to_ndarray(format="rgb24")
                if k >= last:
                    break
        if len(got) != len(pos):
            missing = [i for i in wanted if i not in got]
            raise ValueError(f"truncated stream: decoded {k + 1} frames, {len(missing)} requested frame(s) missing "
                             f"(first missing index {missing[0]}, header says {self.info.total_frames} frames)")
        return np.stack([got[int(i)] for i in indices])


_READERS = {"decord": _DecordReader, "pyav": _PyAVReader}


def _available(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec("decord" if name == "decord" else "av") is not None


def probe_header(path: str | os.PathLike) -> VideoHeader:
    """The container header of a video file (PyAV, ``skip_frame=all``: no frame is decoded; ~1-4 ms CPU per file).
    VideoError if PyAV cannot open it or it has no video stream."""
    import av

    path = os.fspath(path)
    try:
        with av.open(path, options={"skip_frame": "all"}) as c:
            if not c.streams.video:
                raise ValueError("no video stream in the file")
            s = c.streams.video[0]
            rate = s.average_rate or s.guessed_rate or s.base_rate
            fps = float(rate) if rate else 0.0
            frames = int(s.frames or 0)
            if c.duration:
                duration = float(c.duration) / 1_000_000  # AV_TIME_BASE
            elif s.duration and s.time_base:
                duration = float(s.duration * s.time_base)
            else:
                duration = frames / fps if fps > 0 else 0.0
            return VideoHeader(int(s.codec_context.width or s.width or 0), int(s.codec_context.height or s.height or 0),
                               fps, frames, duration)
    except VideoError:
        raise
    except Exception as e:  # av.error.*, ValueError: unreadable
        raise VideoError(path, f"cannot read the container header: {type(e).__name__}: {_short(e)}") from None


def check_frame_size(path: str, width: int, height: int, max_frame_pixels: int | None) -> None:
    """VideoTooLarge if ``width * height`` exceeds ``max_frame_pixels`` (None or 0: no cap)."""
    if max_frame_pixels and width * height > max_frame_pixels:
        raise VideoTooLarge(path, f"frames of {width}x{height} = {width * height:,} pixels exceed the decode cap of "
                                  f"{max_frame_pixels:,} pixels (data.max_video_frame_pixels; 8K UHD = "
                                  f"{MAX_FRAME_PIXELS:,})")


def open_video(path: str | os.PathLike, backend: str = "auto", threads: int = 0,
               max_frame_pixels: int | None = MAX_FRAME_PIXELS) -> _Reader:
    """Open ``path`` with ``backend`` ("auto" = decord, falling back to PyAV on any error).

    ``max_frame_pixels``: frames larger than this raise :class:`VideoTooLarge` from the container header, before a
    frame is decoded (None / 0: no cap).

    ``threads``: decoder threads (0 = FFmpeg's automatic choice, one per core; 1 = single-threaded).  The frames
    are identical either way; one thread costs the least CPU time in total (17-28 % less than automatic
    frame threading on 2 cores, measured in docs/performance.md), which is what counts when decoding runs in the
    background next to training (``data.prefetch``), while more threads can shorten the wait of one inline decode
    of a large video on an idle many-core machine."""
    if threads < 0:
        raise ValueError(f"decoder threads must be >= 0 (0 = automatic), got {threads}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    path = os.fspath(path)
    if path.startswith("file://"):
        path = path[len("file://"):]
    if not os.path.exists(path):
        raise VideoError(path, "file not found")
    if os.path.isdir(path):
        raise VideoError(path, "is a directory, not a video file")
    if os.path.getsize(path) == 0:
        raise VideoError(path, "empty file (0 bytes)")
    if max_frame_pixels and _available("pyav"):
        try:
            head = probe_header(path)
        except VideoError:
            head = None  # unreadable header: the backends below say why
        if head is not None:
            check_frame_size(path, head.width, head.height, max_frame_pixels)
    order = ["decord", "pyav"] if backend == "auto" else [backend]
    errors = []
    for name in order:
        if not _available(name):
            errors.append(f"{name}: not installed")
            continue
        try:
            reader = _READERS[name](path, threads)
        except Exception as e:  # decord raises DECORDError/RuntimeError, PyAV av.error.*: all mean "unreadable"
            errors.append(f"{name}: {type(e).__name__}: {_short(e)}")
            continue
        if reader.info.total_frames <= 0:
            errors.append(f"{name}: zero frames")
            continue
        if reader.info.fps <= 0:
            errors.append(f"{name}: no frame rate in the container")
            continue
        check_frame_size(path, reader.info.width, reader.info.height, max_frame_pixels)  # header unread (no PyAV)
        reader.open_errors = tuple(errors)
        return reader
    raise VideoError(path, "cannot read video (corrupt, truncated or not a video?): " + "; ".join(errors))


def read_frames(path: str | os.PathLike, indices: Sequence[int], backend: str = "auto", threads: int = 0,
                max_frame_pixels: int | None = MAX_FRAME_PIXELS):
    """``(frames uint8 (n,H,W,3), info, backend_name)`` for the given frame indices; VideoError on any failure."""
    reader = open_video(path, backend, threads, max_frame_pixels)
    return _get(reader, os.fspath(path), indices, backend)


def _get(reader: _Reader, path: str, indices: Sequence[int], backend: str):
    try:
        return reader.get_frames(indices), reader.info, reader.name
    except Exception as e:
        first = "; ".join(reader.open_errors + (f"{reader.name}: {type(e).__name__}: {_short(e)}",))
    if backend == "auto" and reader.name == "decord" and _available("pyav"):
        # A file decord opens but cannot decode (e.g. truncated mid-stream) gets a second chance with PyAV.
        try:
            r2 = _PyAVReader(path, reader.threads)
            if r2.info.total_frames != reader.info.total_frames:
                raise ValueError(f"frame count differs between backends ({reader.info.total_frames} vs "
                                 f"{r2.info.total_frames})")
            return r2.get_frames(indices), r2.info, r2.name
        except Exception as e:
            first += f"; pyav: {type(e).__name__}: {_short(e)}"
    raise VideoError(path, "cannot decode frames (corrupt or truncated?): " + first)


def probe_video(path: str | os.PathLike, backend: str = "auto",
                max_frame_pixels: int | None = MAX_FRAME_PIXELS) -> VideoInfo:
    """Frame count, average fps and size of a video file (decord decodes frame 0 for the size; see
    :func:`probe_header` for the header alone)."""
    return open_video(path, backend, max_frame_pixels=max_frame_pixels).info


def _short(e: Exception, n: int = 300) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= n else s[:n] + "..."
