"""Time-consistent video input: frame sampling, decoding under a timeout, clip metadata.

One :class:`VideoSamplingConfig` decides which frames are read and how they are resized;
:func:`load_video` returns a :class:`VideoClip` (uint8 frames + the times they were taken
at). The same clip object feeds generation, the reference forward and the training forward,
so all three see the same frames *and* the same time values: :meth:`VideoClip.metadata` is
what transformers' Qwen video processors need (``video_metadata=``), and
:meth:`VideoClip.second_per_grid_t` is Qwen2.5-VL's ``second_per_grid_ts`` entry. See
``docs/video_input.md`` for the rules and which value reaches which processor.

Sampling rule (all pure functions below, see :func:`plan_sampling`):

1. The window ``[clip_start, clip_end)`` (defaults: the whole video; ``clip_end`` past the
   end is clamped to the duration ``D = num_frames / fps``) is snapped to the frame grid:
   it holds source frames ``first .. stop-1`` whose timestamps ``i / fps`` fall inside it.
2. ``T = round(window_seconds * cfg.fps)``, clamped to ``[min_frames, max_frames]``, then
   rounded to the nearest multiple of ``frame_factor`` (never above ``max_frames``).
3. Frame ``k`` is the source frame under the centre of the ``k``-th of ``T`` equal parts
   of the window: ``index_k = first + floor((2k + 1) * n_window / (2T))``.
   Example: 8 s at 8 fps, ``cfg.fps=2`` -> 16 frames, indices 2, 6, ..., 62, timestamps
   0.25, 0.75, ..., 7.75 s.
4. Each frame is resized (cv2, ``INTER_AREA`` when shrinking) to sides that are multiples of
   ``size_multiple`` with at most ``max_pixels_per_frame`` pixels (at most
   ``total_pixel_budget // T`` when a total budget is set; if even the smallest frame size
   breaks the budget, ``T`` is lowered).

Decoding runs in a persistent worker *process* (``subprocess`` + pickled messages over
pipes, so it works inside daemonic DataLoader workers too); a decode that takes longer than
``decode_timeout_s`` kills that process (a new one starts on the next call) and raises
:class:`VideoDecodeTimeout`. Every data problem raises :class:`VideoError` (a
:class:`~mmrl.data.media.MediaError`, so tasks skip it like a bad image); a missing decoder
library raises :class:`VideoReaderUnavailable` (a setup error, never a silent switch to
another reader).
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mmrl.data.media import MediaError

__all__ = [
    "READERS",
    "DEFAULT_SIZE_MULTIPLE",
    "VideoError",
    "VideoDecodeTimeout",
    "VideoReaderUnavailable",
    "VideoSamplingBaseConfig",
    "VideoSamplingConfig",
    "VideoClip",
    "SamplingPlan",
    "frame_window",
    "num_sampled_frames",
    "sample_frame_indices",
    "target_frame_size",
    "plan_sampling",
    "resolve_fps",
    "resize_frames",
    "check_reader_available",
    "decode_clip",
    "DecodeWorker",
    "default_worker",
    "load_video",
    "size_multiple_of",
    "processor_video_inputs",
]

READERS: tuple[str, ...] = ("decord", "torchcodec")
"""Supported decoders. There is no automatic fallback from one to another."""

DEFAULT_SIZE_MULTIPLE = 28
"""Qwen2-VL / Qwen2.5-VL: patch 14 x merge 2. Qwen3-VL needs 32 (patch 16 x merge 2)."""

_EPS = 1e-6  # tolerance when snapping seconds to the frame grid (0.3 * 10 = 3.0000000000000004)
_MAX_ASPECT = 200.0  # the Qwen processors refuse frames with a longer/shorter side ratio above this


# --------------------------------------------------------------------------- errors


class VideoError(MediaError):
    """A video could not be loaded (missing, empty, corrupt, undecodable, bad clip times...).

    A :class:`~mmrl.data.media.MediaError`, so code that skips bad images skips bad videos.

    Attributes:
        path: the video file.
        reason: what went wrong, e.g. ``"file not found"``.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        Exception.__init__(self, f"cannot load video {self.path}: {reason}")

    def __reduce__(self):  # keep (path, reason) through pickling
        return (type(self), (self.path, self.reason))


class VideoDecodeTimeout(VideoError):
    """Decoding took longer than ``decode_timeout_s``; the decoder process was killed."""


class VideoReaderUnavailable(ImportError):
    """The configured reader (decord / torchcodec) cannot be imported: a setup error, not bad data."""


_INSTALL_HINTS = {
    "decord": "install it with `pip install decord` (x86_64 Linux/Windows wheels; build from source elsewhere)",
    "torchcodec": (
        "install it with `pip install torchcodec` (a version matching your torch) and FFmpeg's shared "
        "libraries (Debian/Ubuntu: `apt-get install ffmpeg`, which provides libavcodec/libavformat/"
        "libavutil/libswscale)"
    ),
}


# --------------------------------------------------------------------------- config


@dataclass
class VideoSamplingBaseConfig:
    """The sampling settings a user chooses (frame rate, frame count, pixel budget, decoder, timeout, cache).

    Declared once here and shared by :class:`VideoSamplingConfig` (which adds the per-call fields
    ``clip_start`` / ``clip_end`` / ``frame_factor`` / ``decoder_threads``) and by the video tasks'
    ``task.video`` (:class:`mmrl.tasks.video.common.VideoInputConfig`, which has its own defaults for
    ``max_frames``, ``max_pixels_per_frame`` and ``size_multiple``).
    """

    fps: float = 2.0
    """Target sampling rate in frames per second of video time, before the frame-count clamps."""
    min_frames: int = 4
    """Fewest frames sampled (source frames repeat when the window holds fewer). A
    ``total_pixel_budget`` wins over this."""
    max_frames: int = 16
    """Most frames sampled; long videos get a lower effective fps (see ``VideoClip.sample_fps``)."""
    max_pixels_per_frame: int = 128 * 28 * 28
    """Pixel cap per resized frame (height * width); sides are multiples of ``size_multiple``."""
    total_pixel_budget: int | None = None
    """Optional cap on ``frames * pixels per frame`` (VideoChat-R1 style): first frames shrink (down to one
    ``size_multiple`` square per side), then the frame count drops."""
    size_multiple: int = DEFAULT_SIZE_MULTIPLE
    """Frame sides are multiples of this: the processor's patch_size * merge_size
    (28 for Qwen2/2.5-VL, 32 for Qwen3-VL; see :func:`size_multiple_of`)."""
    reader: str = "decord"
    """Decoder library: decord or torchcodec. A missing one raises VideoReaderUnavailable; no fallback to the other."""
    fallback_fps: float | None = None
    """Frame rate to assume when the container has none (missing, 0 or NaN). None: such a
    video raises VideoError (the tasks skip it). Must be set explicitly; never guessed."""
    decode_timeout_s: float | None = 10.0
    """Seconds one decode may take in the worker process before it is killed and
    VideoDecodeTimeout raised (the tasks skip the item). None or 0: decode in this process, without a timeout."""
    cache_dir: str | None = None
    """Frame cache folder for :func:`mmrl.adapters.video.frame_cache.get_or_decode`. None:
    ``$MMRL_CACHE/video_frames`` or ``~/.cache/mmrl/video_frames``; "": no disk cache (memory only)."""


@dataclass
class VideoSamplingConfig(VideoSamplingBaseConfig):
    """How frames are chosen and sized. Train-time and eval-time profiles are two instances.

    The user-facing fields are those of :class:`VideoSamplingBaseConfig`; this class adds the
    window and the model's temporal patch. Every field that changes the decoded frames is part of
    the frame cache key (see :meth:`frame_fields`); ``decode_timeout_s``, ``decoder_threads`` and
    ``cache_dir`` are not.
    """

    clip_start: float | None = None
    """Start of the window in seconds (None: 0). At or past the end of the video -> VideoError."""
    clip_end: float | None = None
    """End of the window in seconds (None: the duration); past the end it is clamped to the duration."""
    frame_factor: int = 2
    """The frame count is a multiple of this (the model's temporal patch size)."""
    decoder_threads: int = 1
    """Threads the decoder library may use (1 suits the shared 2-core machines)."""

    FRAME_FIELDS = (
        "fps",
        "min_frames",
        "max_frames",
        "max_pixels_per_frame",
        "total_pixel_budget",
        "clip_start",
        "clip_end",
        "frame_factor",
        "size_multiple",
        "reader",
        "fallback_fps",
    )

    def __post_init__(self) -> None:
        def positive(name: str, value: Any, kind: type = float) -> None:
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
                raise ValueError(f"VideoSamplingConfig.{name} must be a {kind.__name__}, got {value!r}")
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"VideoSamplingConfig.{name} must be > 0, got {value!r}")

        positive("fps", self.fps)
        for name in (
            "min_frames",
            "max_frames",
            "max_pixels_per_frame",
            "frame_factor",
            "size_multiple",
            "decoder_threads",
        ):
            positive(name, getattr(self, name), int)
        if self.min_frames > self.max_frames:
            raise ValueError(f"VideoSamplingConfig: min_frames={self.min_frames} > max_frames={self.max_frames}")
        if self.max_frames < self.frame_factor:
            raise ValueError(
                f"VideoSamplingConfig: max_frames={self.max_frames} < frame_factor={self.frame_factor}: "
                "no frame count is possible"
            )
        if self.max_pixels_per_frame < self.size_multiple**2:
            raise ValueError(
                f"VideoSamplingConfig: max_pixels_per_frame={self.max_pixels_per_frame} is below one "
                f"{self.size_multiple}x{self.size_multiple} patch"
            )
        if self.total_pixel_budget is not None:
            positive("total_pixel_budget", self.total_pixel_budget, int)
            smallest = self.frame_factor * self.size_multiple**2
            if self.total_pixel_budget < smallest:
                raise ValueError(
                    f"VideoSamplingConfig: total_pixel_budget={self.total_pixel_budget} is below "
                    f"frame_factor * size_multiple^2 = {smallest}"
                )
        for name in ("clip_start", "clip_end"):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"VideoSamplingConfig.{name} must be a finite number of seconds, got {value!r}")
        if self.clip_start is not None and self.clip_start < 0:
            raise ValueError(f"VideoSamplingConfig.clip_start must be >= 0, got {self.clip_start}")
        if self.clip_start is not None and self.clip_end is not None and self.clip_end <= self.clip_start:
            raise ValueError(f"VideoSamplingConfig: clip_end={self.clip_end} must be > clip_start={self.clip_start}")
        if self.reader not in READERS:
            raise ValueError(f"VideoSamplingConfig.reader must be one of {READERS}, got {self.reader!r}")
        if self.fallback_fps is not None:
            positive("fallback_fps", self.fallback_fps)
        if self.decode_timeout_s is not None and (
            not isinstance(self.decode_timeout_s, (int, float)) or self.decode_timeout_s < 0
        ):
            raise ValueError(
                f"VideoSamplingConfig.decode_timeout_s must be >= 0 or None, got {self.decode_timeout_s!r}"
            )

    def frame_fields(self) -> dict[str, Any]:
        """The fields that change the decoded frames (the frame cache key uses exactly these)."""
        return {name: getattr(self, name) for name in self.FRAME_FIELDS}

    def with_clip(self, clip_start: float | None, clip_end: float | None) -> VideoSamplingConfig:
        """A copy with another window (per-sample clips of one profile)."""
        return dataclasses.replace(self, clip_start=clip_start, clip_end=clip_end)


# --------------------------------------------------------------------------- sampling math (pure)


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def frame_window(
    num_frames: int, fps: float, clip_start: float | None, clip_end: float | None, path: str | Path = "<video>"
) -> tuple[int, int]:
    """Source frames ``[first, stop)`` whose timestamps ``i / fps`` lie in ``[clip_start, clip_end)``.

    ``clip_start`` None means 0, ``clip_end`` None means the duration ``num_frames / fps``;
    a ``clip_end`` past the duration is clamped to it.

    Raises:
        VideoError: ``clip_start`` negative or at/after the end, ``clip_end <= clip_start``,
            or a window that holds no frame.
    """
    duration = num_frames / fps
    start = 0.0 if clip_start is None else float(clip_start)
    end = duration if clip_end is None else float(clip_end)
    if start < 0 or start >= duration:
        raise VideoError(path, f"clip_start={start:g} s is outside the video (duration {duration:g} s)")
    if end <= start:
        raise VideoError(path, f"clip_end={end:g} s must be after clip_start={start:g} s")
    end = min(end, duration)
    first = math.ceil(start * fps - _EPS)
    stop = min(math.ceil(end * fps - _EPS), num_frames)
    if stop <= first:
        raise VideoError(
            path, f"clip [{start:g}, {end:g}] s holds no frame (frames every {1 / fps:g} s, duration {duration:g} s)"
        )
    return first, stop


def num_sampled_frames(window_s: float, cfg: VideoSamplingConfig) -> int:
    """Frame count before any pixel budget: ``round(window_s * fps)`` clamped to
    ``[min_frames, max_frames]``, then rounded (half up) to a multiple of ``frame_factor``,
    at least one factor and at most the largest multiple ``<= max_frames``."""
    n = min(max(_round_half_up(window_s * cfg.fps), cfg.min_frames), cfg.max_frames)
    f = cfg.frame_factor
    n = max(f, _round_half_up(n / f) * f)
    return min(n, (cfg.max_frames // f) * f)


def sample_frame_indices(first: int, stop: int, count: int) -> list[int]:
    """``count`` source indices at the centres of ``count`` equal parts of ``[first, stop)``.

    ``index_k = first + floor((2k + 1) * (stop - first) / (2 * count))``; integer arithmetic,
    so there is no float drift. Indices repeat when ``count > stop - first``.
    """
    if stop <= first or count < 1:
        raise ValueError(f"sample_frame_indices: empty window [{first}, {stop}) or count={count}")
    n = stop - first
    return [first + ((2 * k + 1) * n) // (2 * count) for k in range(count)]


def target_frame_size(height: int, width: int, max_pixels: int, multiple: int) -> tuple[int, int]:
    """``(h, w)``: sides rounded to multiples of ``multiple``, shrunk (aspect kept) until
    ``h * w <= max_pixels``; a side never goes below ``multiple`` (so a budget below one
    square per side can be exceeded: :func:`plan_sampling` then lowers the frame count)."""
    if height < 1 or width < 1:
        raise ValueError(f"target_frame_size: bad frame size {height}x{width}")
    h = max(multiple, _round_half_up(height / multiple) * multiple)
    w = max(multiple, _round_half_up(width / multiple) * multiple)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(multiple, math.floor(height / beta / multiple) * multiple)
        w = max(multiple, math.floor(width / beta / multiple) * multiple)
    return h, w


@dataclass(frozen=True)
class SamplingPlan:
    """Which source frames to read and what size to give them."""

    first: int
    """First source frame of the window."""
    stop: int
    """One past the last source frame of the window."""
    indices: tuple[int, ...]
    """Source frame indices to decode, in order (may repeat)."""
    height: int
    """Resized frame height."""
    width: int
    """Resized frame width."""


def plan_sampling(
    num_frames: int, fps: float, height: int, width: int, cfg: VideoSamplingConfig, path: str | Path = "<video>"
) -> SamplingPlan:
    """Apply the sampling rule (module docstring) to a video of ``num_frames`` at ``fps``.

    Raises:
        VideoError: bad clip times, an aspect ratio the Qwen processors refuse (> 200), or a
            ``total_pixel_budget`` too small for ``frame_factor`` frames of this aspect ratio.
    """
    if max(height, width) / min(height, width) > _MAX_ASPECT:
        raise VideoError(path, f"aspect ratio {width}x{height} is above {_MAX_ASPECT:g}:1")
    first, stop = frame_window(num_frames, fps, cfg.clip_start, cfg.clip_end, path)
    count = num_sampled_frames((stop - first) / fps, cfg)
    per_frame = cfg.max_pixels_per_frame
    if cfg.total_pixel_budget is not None:
        per_frame = min(per_frame, cfg.total_pixel_budget // count)
    h, w = target_frame_size(height, width, per_frame, cfg.size_multiple)
    if cfg.total_pixel_budget is not None and count * h * w > cfg.total_pixel_budget:
        count = (cfg.total_pixel_budget // (h * w)) // cfg.frame_factor * cfg.frame_factor
        if count < cfg.frame_factor:
            raise VideoError(
                path,
                f"total_pixel_budget={cfg.total_pixel_budget} cannot hold {cfg.frame_factor} frames of "
                f"{h}x{w} (the smallest size for this {width}x{height} video)",
            )
    return SamplingPlan(first, stop, tuple(sample_frame_indices(first, stop, count)), h, w)


def resolve_fps(raw_fps: Any, fallback_fps: float | None, path: str | Path) -> float:
    """The container's fps if it is a finite positive number, else ``fallback_fps`` if set.

    Raises:
        VideoError: fps missing/0/NaN and no ``fallback_fps`` (the error says how to proceed).
    """
    try:
        value = float(raw_fps) if raw_fps is not None else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value
    if fallback_fps is not None:
        return float(fallback_fps)
    raise VideoError(
        path,
        f"the container has no frame rate (fps is {raw_fps!r}); frame times cannot be known. Set "
        "VideoSamplingConfig.fallback_fps explicitly to decode it with an assumed rate",
    )


def resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize ``[T, H, W, 3]`` uint8 frames to ``height x width`` with OpenCV.

    ``INTER_AREA`` when neither side grows (anti-aliased shrink), ``INTER_LINEAR`` otherwise
    (``INTER_AREA`` degrades to nearest-neighbour when enlarging).
    """
    import cv2

    t, h0, w0 = frames.shape[:3]
    if (h0, w0) == (height, width):
        return np.ascontiguousarray(frames)
    interp = cv2.INTER_AREA if height <= h0 and width <= w0 else cv2.INTER_LINEAR
    out = np.empty((t, height, width, 3), dtype=np.uint8)
    for i in range(t):
        out[i] = cv2.resize(frames[i], (width, height), interpolation=interp)
    return out


# --------------------------------------------------------------------------- the clip


@dataclass
class VideoClip:
    """Decoded, resized frames of one video window and the times they show.

    Time convention: ``timestamps`` are seconds of the *source video* (``index / source_fps``).
    The model sees the window as a video of its own that starts at ``clip_start``:
    :meth:`metadata`, :meth:`second_per_grid_t` and :meth:`grid_timestamps` are relative to
    ``clip_start`` (identical to absolute times when there is no clip). Express targets for a
    clipped video in window time (``t - clip_start``).
    """

    frames: np.ndarray
    """uint8 ``[T, H, W, 3]`` RGB; read-only (shared by every rollout through the cache)."""
    frame_indices: list[int]
    """Source frame index of each frame."""
    timestamps: list[float]
    """Source-video time of each frame in seconds (``index / source_fps``)."""
    sample_fps: float
    """Effective rate of the sampled frames: ``T / (clip_end - clip_start)``."""
    source_fps: float
    """Frame rate of the source video (container, or ``fallback_fps``)."""
    clip_start: float
    """Window start in seconds, snapped to the frame grid (``first / source_fps``)."""
    clip_end: float
    """Window end in seconds, snapped (``stop / source_fps``); at most ``duration``."""
    duration: float
    """Duration of the whole source video (``source_num_frames / source_fps``)."""
    path: str
    """The video file."""
    source_num_frames: int = 0
    """Frames in the whole source video."""
    source_height: int = 0
    """Height of the source frames."""
    source_width: int = 0
    """Width of the source frames."""
    window_start_frame: int = 0
    """First source frame of the window."""
    window_num_frames: int = 0
    """Source frames in the window (``stop - first``)."""
    reader: str = "decord"
    """Decoder that produced the frames."""

    @property
    def num_frames(self) -> int:
        """Number of sampled frames ``T``."""
        return int(self.frames.shape[0])

    @property
    def relative_timestamps(self) -> list[float]:
        """Frame times in window time: ``timestamps[k] - clip_start``."""
        return [(i - self.window_start_frame) / self.source_fps for i in self.frame_indices]

    def metadata(self) -> dict[str, Any]:
        """Keyword arguments of ``transformers.video_utils.VideoMetadata`` for this clip.

        Pass one per video as ``video_metadata=[...]`` together with ``do_sample_frames=False``.
        The window is described as a video of its own: ``total_num_frames`` = source frames in
        the window, ``frames_indices`` relative to the window start, ``fps`` = source fps. Then
        ``VideoMetadata.sampled_fps`` (Qwen2.5-VL's ``second_per_grid_ts = 2 / sampled_fps``)
        equals :attr:`sample_fps`, and ``frames_indices / fps`` (Qwen3-VL's prompt timestamps)
        equals :attr:`relative_timestamps`.
        """
        return {
            "total_num_frames": int(self.window_num_frames),
            "fps": float(self.source_fps),
            "width": int(self.frames.shape[2]),
            "height": int(self.frames.shape[1]),
            "duration": float(self.clip_end - self.clip_start),
            "video_backend": self.reader,
            "frames_indices": [int(i - self.window_start_frame) for i in self.frame_indices],
        }

    def second_per_grid_t(self, temporal_patch_size: int = 2) -> float:
        """Seconds covered by one temporal patch: ``temporal_patch_size / sample_fps``
        (Qwen2.5-VL's ``second_per_grid_ts`` entry for this video)."""
        return temporal_patch_size / self.sample_fps

    def grid_timestamps(self, temporal_patch_size: int = 2) -> list[float]:
        """Window time of each temporal patch: the mean of its first and last frame times
        (what Qwen3-VL writes as ``<t seconds>`` before each patch; the last frame repeats
        to fill a partial patch)."""
        times = self.relative_timestamps
        if len(times) % temporal_patch_size:
            times = times + [times[-1]] * (temporal_patch_size - len(times) % temporal_patch_size)
        return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]

    def info(self) -> dict[str, Any]:
        """Everything but the frames, JSON-serialisable (the cache stores it next to the frames)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "frames"}
        out["frame_shape"] = list(self.frames.shape)
        return out

    @classmethod
    def from_info(cls, info: dict[str, Any], frames: np.ndarray) -> VideoClip:
        """Rebuild a clip from :meth:`info` and its frames."""
        names = {f.name for f in dataclasses.fields(cls)} - {"frames"}
        return cls(frames=frames, **{k: info[k] for k in names})


# --------------------------------------------------------------------------- readers


_READER_CHECKED: dict[str, str | None] = {}


def check_reader_available(reader: str) -> None:
    """Import ``reader``'s module once; raise :class:`VideoReaderUnavailable` with install
    instructions when it fails (never falls back to another reader)."""
    if reader not in READERS:
        raise ValueError(f"unknown video reader {reader!r}; valid: {READERS}")
    if reader not in _READER_CHECKED:
        module = "decord" if reader == "decord" else "torchcodec.decoders"
        try:
            __import__(module)
            _READER_CHECKED[reader] = None
        except Exception as exc:  # ImportError, or OSError/RuntimeError when FFmpeg libraries are missing
            _READER_CHECKED[reader] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    problem = _READER_CHECKED[reader]
    if problem is not None:
        raise VideoReaderUnavailable(
            f"video reader {reader!r} was selected (VideoSamplingConfig.reader) but cannot be imported "
            f"({problem}); {_INSTALL_HINTS[reader]}. No other reader is used in its place."
        )


_LOG_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\]\s+\S+:\d+:\s*")


def _short(exc: BaseException) -> str:
    """A one-line description of a decoder exception (decord's carry a log prefix and a C++ trace)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _LOG_PREFIX.sub("", text)[:300]


class _DecordSource:
    """A decord ``VideoReader`` seen through the small interface the sampler needs."""

    def __init__(self, path: Path, threads: int) -> None:
        import decord

        self._vr = decord.VideoReader(str(path), ctx=decord.cpu(0), num_threads=threads)
        self.num_frames = len(self._vr)
        self.fps = self._vr.get_avg_fps()
        if self.num_frames > 0:
            shape = self._vr[0].shape
            self.height, self.width = int(shape[0]), int(shape[1])
            self._vr.seek(0)
        else:
            self.height = self.width = 0

    def get(self, indices: Sequence[int]) -> np.ndarray:
        return self._vr.get_batch(list(indices)).asnumpy()


class _TorchcodecSource:
    """A torchcodec ``VideoDecoder`` (NHWC, exact seeking) behind the same interface."""

    def __init__(self, path: Path, threads: int) -> None:
        from torchcodec.decoders import VideoDecoder

        self._dec = VideoDecoder(str(path), dimension_order="NHWC", num_ffmpeg_threads=threads, seek_mode="exact")
        meta = self._dec.metadata
        self.num_frames = int(meta.num_frames or 0)
        self.fps = meta.average_fps
        self.height, self.width = int(meta.height or 0), int(meta.width or 0)

    def get(self, indices: Sequence[int]) -> np.ndarray:
        return self._dec.get_frames_at(indices=list(indices)).data.numpy()


def _open_source(path: Path, cfg: VideoSamplingConfig):
    check_reader_available(cfg.reader)
    cls = _DecordSource if cfg.reader == "decord" else _TorchcodecSource
    try:
        return cls(path, cfg.decoder_threads)
    except Exception as exc:  # decord raises RuntimeError/DECORDError, torchcodec ValueError/RuntimeError
        raise VideoError(
            path, f"not a readable video (corrupt, truncated or unsupported codec): {_short(exc)}"
        ) from exc


def _check_file(path: Path) -> None:
    if not path.exists():
        raise VideoError(path, "file not found")
    if path.is_dir():
        raise VideoError(path, "is a directory, not a video file")
    if path.stat().st_size == 0:
        raise VideoError(path, "empty file (0 bytes)")


def decode_clip(path: str | Path, cfg: VideoSamplingConfig) -> VideoClip:
    """Decode and resize the frames ``cfg`` selects, in this process (no timeout).

    Only the selected frames are decoded (seek + decode, never the whole file).
    :func:`load_video` runs this in the worker process.

    Raises:
        VideoError: see :func:`load_video`.
        VideoReaderUnavailable: the reader library is missing.
    """
    path = Path(path)
    _check_file(path)
    src = _open_source(path, cfg)
    if src.num_frames <= 0:
        raise VideoError(path, "the video has no frames (zero-length)")
    if src.height <= 0 or src.width <= 0:
        raise VideoError(path, f"the video reports a zero frame size ({src.width}x{src.height})")
    fps = resolve_fps(src.fps, cfg.fallback_fps, path)
    plan = plan_sampling(src.num_frames, fps, src.height, src.width, cfg, path)
    unique = sorted(set(plan.indices))
    try:
        raw = src.get(unique)
    except Exception as exc:
        raise VideoError(
            path, f"cannot decode frames {unique[0]}..{unique[-1]} (corrupt or truncated data): {_short(exc)}"
        ) from exc
    if raw.ndim != 4 or raw.shape[0] != len(unique) or raw.shape[3] != 3 or raw.dtype != np.uint8:
        raise VideoError(
            path, f"decoder returned frames of shape {raw.shape} / {raw.dtype}, expected [{len(unique)}, H, W, 3] uint8"
        )
    if raw.shape[1:3] != (src.height, src.width):
        raise VideoError(
            path, f"frame size changed inside the video ({src.width}x{src.height} -> {raw.shape[2]}x{raw.shape[1]})"
        )
    position = {idx: k for k, idx in enumerate(unique)}
    frames = resize_frames(raw[[position[i] for i in plan.indices]], plan.height, plan.width)
    frames.setflags(write=False)
    window_s = (plan.stop - plan.first) / fps
    return VideoClip(
        frames=frames,
        frame_indices=list(plan.indices),
        timestamps=[i / fps for i in plan.indices],
        sample_fps=len(plan.indices) / window_s,
        source_fps=fps,
        clip_start=plan.first / fps,
        clip_end=plan.stop / fps,
        duration=src.num_frames / fps,
        path=str(path),
        source_num_frames=int(src.num_frames),
        source_height=int(src.height),
        source_width=int(src.width),
        window_start_frame=plan.first,
        window_num_frames=plan.stop - plan.first,
        reader=cfg.reader,
    )


# --------------------------------------------------------------------------- worker process

_HEADER = struct.Struct("<Q")


class _DeadlineExceeded(Exception):
    pass


def _write_msg(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """Read ``n`` bytes from ``fd``; EOFError when it closes, _DeadlineExceeded after ``deadline``."""
    parts: list[bytes] = []
    remaining = n
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _DeadlineExceeded
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
        chunk = os.read(fd, min(remaining, 1 << 22))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def _read_msg(fd: int, deadline: float | None) -> Any:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


def _exit_when_orphaned(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def _worker_main() -> None:
    """Entry point of the decode worker process: read requests on stdin, answer on stdout."""
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints (C or Python) go to stderr, never into the message stream
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    _write_msg(out_fd, ("ready", os.getpid()))
    while True:
        try:
            request = _read_msg(0, None)
        except EOFError:
            return
        req_id, path, cfg, hang_s = request
        if hang_s:
            time.sleep(hang_s)  # test hook: simulates a decoder that hangs
        try:
            reply = ("ok", req_id, decode_clip(path, cfg))
        except VideoReaderUnavailable as exc:
            reply = ("unavailable", req_id, str(exc))
        except VideoError as exc:
            reply = ("error", req_id, exc.reason)
        except Exception as exc:  # anything else is still this file's problem, reported with its type
            reply = ("error", req_id, f"unexpected {type(exc).__name__} while decoding: {_short(exc)}")
        try:
            _write_msg(out_fd, reply)
        except BrokenPipeError:
            return


class DecodeWorker:
    """A persistent decode process; killed and restarted when a decode exceeds its timeout.

    Thread-safe (one decode at a time). After a ``fork`` the child gets a worker of its own.
    ``test_hang_s`` (tests only) makes the worker sleep that long before each decode.
    """

    def __init__(self, *, start_timeout_s: float = 120.0) -> None:
        self.start_timeout_s = start_timeout_s
        self.test_hang_s = 0.0
        self.starts = 0
        """How many worker processes were started (1 + restarts)."""
        self._proc: subprocess.Popen | None = None
        self._owner = 0
        self._lock = threading.Lock()
        self._next_id = 0

    @property
    def pid(self) -> int | None:
        """Process id of the running worker, if any."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.Popen(
            [sys.executable, "-c", "from mmrl.adapters.video.decode import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self._proc, self._owner = proc, os.getpid()
        self.starts += 1
        try:
            msg = _read_msg(proc.stdout.fileno(), time.monotonic() + self.start_timeout_s)
        except EOFError:
            code = self._kill()
            raise RuntimeError(f"the video decode worker exited with code {code} while starting") from None
        except _DeadlineExceeded:
            self._kill()
            raise RuntimeError(f"the video decode worker did not start within {self.start_timeout_s:g} s") from None
        if not (isinstance(msg, tuple) and msg[0] == "ready"):
            self._kill()
            raise RuntimeError(f"the video decode worker sent {msg!r} instead of 'ready'")

    def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        return code

    def close(self) -> None:
        """Stop the worker process (a later decode starts a new one)."""
        with self._lock:
            if self._owner == os.getpid():
                self._kill()
            self._proc = None

    def decode(self, path: str | Path, cfg: VideoSamplingConfig, timeout_s: float) -> VideoClip:
        """:func:`decode_clip` in the worker, waiting at most ``timeout_s`` seconds for it.

        Raises:
            VideoDecodeTimeout: no answer in time (the worker was killed).
            VideoError: the decode failed, or the worker died (e.g. a decoder crash).
            VideoReaderUnavailable: the reader library is missing.
        """
        with self._lock:
            if self._owner != os.getpid():
                self._proc = None  # a forked copy: the pipes belong to the parent's worker
            if self._proc is None or self._proc.poll() is not None:
                self._kill()
                self._start()
            self._next_id += 1
            req_id = self._next_id
            proc = self._proc
            try:
                _write_msg(proc.stdin.fileno(), (req_id, str(path), cfg, float(self.test_hang_s)))
                deadline = time.monotonic() + timeout_s
                while True:
                    kind, got_id, payload = _read_msg(proc.stdout.fileno(), deadline)
                    if got_id == req_id:
                        break
            except _DeadlineExceeded:
                self._kill()
                raise VideoDecodeTimeout(
                    path,
                    f"decoding took longer than decode_timeout_s={timeout_s:g} s; the decoder process was killed "
                    "(a new one starts on the next call)",
                ) from None
            except (EOFError, BrokenPipeError, OSError):
                code = self._kill()
                raise VideoError(path, f"the decoder process died while decoding (exit code {code})") from None
        if kind == "ok":
            return payload
        if kind == "unavailable":
            raise VideoReaderUnavailable(payload)
        raise VideoError(path, payload)


_DEFAULT_WORKER: DecodeWorker | None = None
_DEFAULT_LOCK = threading.Lock()


def default_worker() -> DecodeWorker:
    """The process-wide decode worker used by :func:`load_video` (started on first use)."""
    global _DEFAULT_WORKER
    with _DEFAULT_LOCK:
        if _DEFAULT_WORKER is None:
            _DEFAULT_WORKER = DecodeWorker()
            atexit.register(_DEFAULT_WORKER.close)
        return _DEFAULT_WORKER


def load_video(
    path: str | Path, cfg: VideoSamplingConfig | None = None, *, worker: DecodeWorker | None = None
) -> VideoClip:
    """Decode the frames ``cfg`` selects from ``path`` (no caching: see
    :func:`mmrl.adapters.video.frame_cache.get_or_decode`).

    With ``cfg.decode_timeout_s`` set, decoding runs in ``worker`` (default: the shared
    :func:`default_worker`) and is abandoned after that many seconds; otherwise in this process.

    Raises:
        VideoError: missing/empty file, corrupt or truncated data, unreadable codec, no video
            stream, zero frames, fps missing without ``fallback_fps``, clip times outside the
            video, a budget too small; :class:`VideoDecodeTimeout` when decoding hangs.
        VideoReaderUnavailable: ``cfg.reader`` is not installed.
    """
    cfg = cfg if cfg is not None else VideoSamplingConfig()
    path = Path(path)
    check_reader_available(cfg.reader)  # a setup error, raised before any file is touched
    _check_file(path)
    if not cfg.decode_timeout_s:
        return decode_clip(path, cfg)
    return (worker or default_worker()).decode(path, cfg, float(cfg.decode_timeout_s))


# --------------------------------------------------------------------------- processor glue


def size_multiple_of(processor: Any) -> int:
    """``patch_size * merge_size`` of a Qwen processor or video processor (28 or 32)."""
    vp = getattr(processor, "video_processor", processor)
    patch, merge = getattr(vp, "patch_size", None), getattr(vp, "merge_size", None)
    if not isinstance(patch, int) or not isinstance(merge, int):
        raise ValueError(f"{type(vp).__name__} has no integer patch_size/merge_size")
    return patch * merge


def processor_video_inputs(clips: Sequence[VideoClip]) -> dict[str, Any]:
    """Keyword arguments for a Qwen processor call so that it uses *these* frames and times.

    ``videos`` (the uint8 frames), ``video_metadata`` (:meth:`VideoClip.metadata`),
    ``do_sample_frames=False`` (the frames are already sampled) and ``do_resize=False`` (they
    are already sized to multiples of ``size_multiple``). Use the same call for generation,
    reference and training forwards.
    """
    if not clips:
        raise ValueError("processor_video_inputs: no clips")
    return {
        # writable copies: torch.from_numpy warns on (and must not alias) the shared read-only frames
        "videos": [np.array(c.frames) for c in clips],
        "video_metadata": [c.metadata() for c in clips],
        "do_sample_frames": False,
        "do_resize": False,
    }
