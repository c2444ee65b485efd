"""Deterministic synthetic videos with exact ground truth (temporal grounding and video QA).

Each video (:func:`make_event_video`) is a real ``.mp4`` (OpenCV ``mp4v``, decodable by
decord) on a dark background with three things in it:

* a circle of one palette colour that is visible **only** in frames ``i`` with
  ``s <= i / fps < e`` (the event; ``s`` and ``e`` lie on the frame grid, so the ground-truth
  segment ``[s, e]`` is exact) -> "When does the red circle appear?";
* a triangle of another colour moving left to right for the whole video
  -> "What colour is the moving shape?" (multiple choice over the palette);
* a white square in the top-left corner that flashes ``k`` times (1-4)
  -> "How many times does the square flash?" (numeric).

Everything is a function of ``seed`` (and the size/fps/duration arguments). Layout: square
in the top-left corner, circle in the upper right part, triangle along the bottom band; they
never overlap, so a pixel check at the circle centre tells whether the event is visible.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = ["PALETTE", "BACKGROUND", "SyntheticVideoError", "make_event_video", "make_video_dataset"]

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 30),
    "blue": (40, 70, 240),
    "yellow": (240, 220, 30),
}
"""Colour names and their RGB values (far apart, so they survive lossy compression)."""

BACKGROUND: tuple[int, int, int] = (40, 40, 40)
"""RGB of the background."""

_SQUARE_RGB = (255, 255, 255)
_GENERATOR_VERSION = 1  # part of the dataset file names: bump when the pictures change


class SyntheticVideoError(ValueError):
    """Bad arguments to the synthetic video generators, or a video that could not be written."""


def _flash_frames(rng: np.random.Generator, num_frames: int, count: int, length: int) -> list[list[int]]:
    """``count`` non-overlapping ``[start, stop)`` frame ranges of ``length`` frames, each in
    its own equal slot of the timeline and separated by at least one dark frame."""
    slot = num_frames // count
    out = []
    for j in range(count):
        lo = j * slot + 1  # the frame before each flash is dark
        hi = (j + 1) * slot - length  # and the flash ends inside its slot
        start = int(rng.integers(lo, hi + 1))
        out.append([start, start + length])
    return out


@dataclass(frozen=True)
class _Scene:
    """Every random choice and all the geometry of one video: what is drawn, where and when."""

    width: int
    height: int
    fps: int
    num_frames: int
    event_color: str
    moving_color: str
    event_frames: list[int]  # [a, b): frames that show the circle
    flash_count: int
    flashes: list[list[int]]  # [start, stop) frames of each flash of the square
    square_box: list[int]  # x0, y0, x1, y1 (exclusive)
    center: tuple[int, int]  # (cx, cy) of the circle
    radius: int
    tri: int  # side of the moving triangle
    band_y: int  # top of the band the triangle moves along


def _bgr(rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    """OpenCV writes BGR."""
    return rgb[::-1]


def _check_video_args(
    width: int, height: int, fps: int, duration_s: float, event_grid: int, event_scale: float, mover_scale: float
) -> int:
    """The number of frames, after checking every argument of :func:`make_event_video`."""
    if width < 48 or height < 48:
        raise SyntheticVideoError(f"make_event_video: size must be at least 48x48, got {width}x{height}")
    if not (isinstance(fps, int) and fps >= 1):
        raise SyntheticVideoError(f"make_event_video: fps must be a positive int, got {fps!r}")
    num_frames = round(duration_s * fps)
    if abs(num_frames - duration_s * fps) > 1e-6 or num_frames < 16:
        raise SyntheticVideoError(
            f"make_event_video: duration_s * fps = {duration_s * fps:g} must be a whole number of frames >= 16"
        )
    if not (isinstance(event_grid, int) and 1 <= event_grid <= num_frames // 4):
        raise SyntheticVideoError(
            f"make_event_video: event_grid must be an int in [1, {num_frames // 4}], got {event_grid!r}"
        )
    for name, value in (("event_scale", event_scale), ("mover_scale", mover_scale)):
        if not 0.05 <= value <= 0.3:
            raise SyntheticVideoError(f"make_event_video: {name} must be in [0.05, 0.3], got {value!r}")
    return num_frames


def _pick_colors(rng: np.random.Generator) -> tuple[str, str]:
    """``(event_color, moving_color)``: two different palette colours."""
    names = list(PALETTE)
    event_color = names[int(rng.integers(len(names)))]
    others = [c for c in names if c != event_color]
    return event_color, others[int(rng.integers(len(others)))]


def _event_frames(rng: np.random.Generator, num_frames: int, event_grid: int) -> list[int]:
    """``[a, b)``: L frames starting at a0, inside (0, N); with a grid g both are multiples of g."""
    g, cells = event_grid, num_frames // event_grid
    min_len, max_len = max(2, round(0.15 * cells)), max(3, round(0.45 * cells))
    event_len = int(rng.integers(min_len, max_len + 1))
    a0 = int(rng.integers(1, cells - event_len))
    return [a0 * g, (a0 + event_len) * g]


def _flash_schedule(
    rng: np.random.Generator, num_frames: int, fps: int, event_grid: int
) -> tuple[int, list[list[int]]]:
    """``(count, [[start, stop), ...])`` of the square's flashes, each ~0.25 s long; with a grid,
    one grid cell long and on the grid."""
    if event_grid == 1:
        flash_len = max(1, round(0.25 * fps))
        max_count = max(1, min(4, num_frames // (2 * flash_len + 2)))
        flash_count = int(rng.integers(1, max_count + 1))
        return flash_count, _flash_frames(rng, num_frames, flash_count, flash_len)
    g, cells = event_grid, num_frames // event_grid
    flash_count = int(rng.integers(1, min(4, cells // 2) + 1))
    return flash_count, [[a * g, b * g] for a, b in _flash_frames(rng, cells, flash_count, 1)]


def _sample_layout(
    rng: np.random.Generator, width: int, height: int, event_scale: float, mover_scale: float
) -> dict[str, Any]:
    """Square in the top-left corner, circle (random centre) in the upper right part, triangle
    along the bottom band: the ``_Scene`` fields ``square_box, center, radius, tri, band_y``."""
    side = max(6, round(0.15 * min(width, height)))
    radius = max(5, round(event_scale * min(width, height)))
    cx = int(rng.integers(max(round(0.4 * width), 2 + side) + radius, width - radius - 2))
    cy = int(rng.integers(radius + 2, max(round(0.6 * height) - radius, radius + 3)))
    tri = max(6, round(mover_scale * height))
    return {
        "square_box": [2, 2, 2 + side, 2 + side],
        "center": (cx, cy),
        "radius": radius,
        "tri": tri,
        "band_y": height - tri - 3,
    }


def _sample_scene(
    rng: np.random.Generator,
    width: int,
    height: int,
    fps: int,
    num_frames: int,
    event_grid: int,
    event_scale: float,
    mover_scale: float,
) -> _Scene:
    """Draw everything random about one video, in a fixed order (colours, event, flashes, circle centre)."""
    event_color, moving_color = _pick_colors(rng)
    event_frames = _event_frames(rng, num_frames, event_grid)
    flash_count, flashes = _flash_schedule(rng, num_frames, fps, event_grid)
    layout = _sample_layout(rng, width, height, event_scale, mover_scale)
    return _Scene(
        width=width,
        height=height,
        fps=fps,
        num_frames=num_frames,
        event_color=event_color,
        moving_color=moving_color,
        event_frames=event_frames,
        flash_count=flash_count,
        flashes=flashes,
        **layout,
    )


def _mover_points(scene: _Scene, i: int) -> np.ndarray:
    """Corners of the triangle in frame ``i``: it moves left to right along the bottom band."""
    tri, band_y = scene.tri, scene.band_y
    x = round(3 + (scene.width - tri - 6) * i / (scene.num_frames - 1))
    return np.array([[x, band_y + tri], [x + tri, band_y + tri], [x + tri // 2, band_y]], np.int32)


def _render_frame(scene: _Scene, i: int, background: np.ndarray, circle: np.ndarray) -> np.ndarray:
    """Frame ``i`` (BGR): the square if it flashes, the circle during the event, the triangle always."""
    import cv2

    frame = background.copy()
    if any(a <= i < b for a, b in scene.flashes):
        x0, y0, x1, y1 = scene.square_box
        frame[y0:y1, x0:x1] = _bgr(_SQUARE_RGB)
    if scene.event_frames[0] <= i < scene.event_frames[1]:
        frame[circle] = _bgr(PALETTE[scene.event_color])
    cv2.fillPoly(frame, [_mover_points(scene, i)], _bgr(PALETTE[scene.moving_color]))
    return frame


def _render_frames(scene: _Scene) -> Iterator[np.ndarray]:
    """All the frames of the video, in order."""
    yy, xx = np.mgrid[0 : scene.height, 0 : scene.width]
    cx, cy = scene.center
    circle = (xx - cx) ** 2 + (yy - cy) ** 2 <= scene.radius**2
    background = np.empty((scene.height, scene.width, 3), np.uint8)
    background[:] = _bgr(BACKGROUND)
    for i in range(scene.num_frames):
        yield _render_frame(scene, i, background, circle)


def _write_mp4(path: Path, frames: Iterable[np.ndarray], fps: int, width: int, height: int) -> None:
    """Write ``frames`` (BGR) to ``path`` with OpenCV's ``mp4v``: to a temporary name, then renamed."""
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".mp4", dir=path.parent)
    os.close(fd)
    writer = cv2.VideoWriter(tmp, cv2.VideoWriter_fourcc(*"mp4v"), float(fps), (width, height))
    try:
        if not writer.isOpened():
            raise SyntheticVideoError(f"make_event_video: OpenCV cannot write mp4v video to {path}")
        for frame in frames:
            writer.write(frame)
        writer.release()
        os.replace(tmp, path)
    finally:
        writer.release()
        if os.path.exists(tmp):
            os.unlink(tmp)


def _questions(path: Path, scene: _Scene, options: list[str]) -> dict[str, dict[str, Any]]:
    """The ``temporal``, ``color`` and ``count`` questions about the video, as dataset records."""
    fps = scene.fps
    s, e = scene.event_frames[0] / fps, scene.event_frames[1] / fps
    common = {"video": str(path), "duration": scene.num_frames / fps}
    return {
        "temporal": {
            **common,
            "task": "temporal_grounding",
            "question": f"When does the {scene.event_color} circle appear in the video? "
            "Output the start and end time in seconds.",
            "event": f"the {scene.event_color} circle appears",
            "segments": [[s, e]],
        },
        "color": {
            **common,
            "task": "video_qa",
            "question_type": "multiple_choice",
            "question": "What colour is the moving shape?",
            "options": options,
            "answer": "ABCD"[options.index(scene.moving_color)],
        },
        "count": {
            **common,
            "task": "video_qa",
            "question_type": "numeric",
            "question": "How many times does the square flash?",
            "answer": scene.flash_count,
        },
    }


def _ground_truth(path: Path, seed: int, scene: _Scene, options: list[str]) -> dict[str, Any]:
    """The dict :func:`make_event_video` returns."""
    fps = scene.fps
    return {
        "video": str(path),
        "seed": int(seed),
        "duration": scene.num_frames / fps,
        "fps": fps,
        "num_frames": scene.num_frames,
        "size": [scene.width, scene.height],
        "segments": [[scene.event_frames[0] / fps, scene.event_frames[1] / fps]],
        "event": f"the {scene.event_color} circle appears",
        "event_color": scene.event_color,
        "event_center": list(scene.center),
        "event_radius": scene.radius,
        "event_frames": scene.event_frames,
        "moving_color": scene.moving_color,
        "flash_count": scene.flash_count,
        "flash_frames": scene.flashes,
        "square_box": scene.square_box,
        "questions": _questions(path, scene, options),
    }


def make_event_video(
    path: str | Path,
    *,
    seed: int,
    duration_s: float = 8.0,
    fps: int = 8,
    size: tuple[int, int] = (128, 96),
    event_grid: int = 1,
    event_scale: float = 0.11,
    mover_scale: float = 0.12,
) -> dict[str, Any]:
    """Write a synthetic video to ``path`` (``.mp4``) and return its ground truth.

    Args:
        path: output file (written to a temporary name, then renamed).
        seed: every random choice derives from it.
        duration_s: length; ``duration_s * fps`` must be a whole number of frames (>= 16).
        fps: frame rate of the file.
        size: ``(width, height)`` in pixels, each at least 48.
        event_grid: the event starts and lasts a whole number of this many frames (e.g. 2 = one
            temporal patch of a Qwen-VL model that samples every frame, so no patch half-shows it);
            with a grid > 1 each flash of the square is one grid cell long, on the grid, 1-4 flashes.
        event_scale: circle radius as a fraction of the shorter side (0.05 - 0.3).
        mover_scale: side of the moving triangle as a fraction of the height (0.05 - 0.3).

    Returns:
        ``{"video", "seed", "duration", "fps", "num_frames", "size", "segments": [[s, e]],
        "event", "event_color", "event_center", "event_radius", "event_frames": [a, b],
        "moving_color", "flash_count", "flash_frames", "square_box", "questions": {"temporal",
        "color", "count"}}``; each question is a dict ready to be a dataset record (see
        :func:`make_video_dataset`).

    Raises:
        SyntheticVideoError: bad arguments, or OpenCV could not write the file.
    """
    import cv2  # noqa: F401  (a missing OpenCV fails here, before the argument checks)

    width, height = int(size[0]), int(size[1])
    num_frames = _check_video_args(width, height, fps, duration_s, event_grid, event_scale, mover_scale)
    rng = np.random.default_rng(seed)
    scene = _sample_scene(rng, width, height, fps, num_frames, event_grid, event_scale, mover_scale)
    path = Path(path)
    _write_mp4(path, _render_frames(scene), fps, width, height)
    options = list(PALETTE)
    rng.shuffle(options)  # the last random draw, after the scene's
    return _ground_truth(path, seed, scene, options)


def _video_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def make_video_dataset(
    folder: str | Path,
    n: int,
    seed: int,
    kind: Literal["temporal", "qa"] = "temporal",
    *,
    duration_s: float = 8.0,
    fps: int = 8,
    size: tuple[int, int] = (128, 96),
    event_grid: int = 1,
    event_scale: float = 0.11,
    mover_scale: float = 0.12,
) -> list[dict[str, Any]]:
    """Write (or reuse) ``n`` synthetic videos in ``folder`` and return one record per video.

    Video ``i`` is :func:`make_event_video` with a seed derived from ``(seed, i)``; it is stored
    as ``ev_<seed>_<i>_<params>.mp4`` with its ground truth in a ``.json`` next to it, and reused
    when both exist and the recorded file size matches (so the same seed is written once).

    Records: ``kind="temporal"``: ``{"video", "duration", "task": "temporal_grounding",
    "question", "event", "segments"}``; ``kind="qa"``: even ``i`` the colour multiple-choice
    question, odd ``i`` the flash-count numeric question (``question_type``, ``answer``,
    ``options`` for multiple choice). Every record also has ``"id"`` and ``"truth"`` (the full
    ground-truth dict of its video).
    """
    if kind not in ("temporal", "qa"):
        raise SyntheticVideoError(f"make_video_dataset: kind must be 'temporal' or 'qa', got {kind!r}")
    if not isinstance(n, int) or n < 0:
        raise SyntheticVideoError(f"make_video_dataset: n must be an int >= 0, got {n!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params = [_GENERATOR_VERSION, float(duration_s), int(fps), list(size)]
    if (event_grid, event_scale, mover_scale) != (1, 0.11, 0.12):  # the original defaults keep their file names
        params += [int(event_grid), float(event_scale), float(mover_scale)]
    params = json.dumps(params)
    tag = hashlib.sha256(params.encode()).hexdigest()[:8]
    records = []
    for i in range(n):
        stem = folder / f"ev_{seed}_{i:05d}_{tag}"
        video, meta = stem.with_suffix(".mp4"), stem.with_suffix(".json")
        truth = None
        if video.exists() and meta.exists():
            try:
                stored = json.loads(meta.read_text())
                if stored.get("file_size") == video.stat().st_size:
                    truth = stored["truth"]
            except (OSError, ValueError, KeyError):
                truth = None
        if truth is None:
            truth = make_event_video(
                video,
                seed=_video_seed(seed, i),
                duration_s=duration_s,
                fps=fps,
                size=size,
                event_grid=event_grid,
                event_scale=event_scale,
                mover_scale=mover_scale,
            )
            payload = json.dumps({"file_size": video.stat().st_size, "truth": truth})
            tmp = meta.with_name(f".{meta.name}.tmp{os.getpid()}")
            tmp.write_text(payload)
            os.replace(tmp, meta)
        truth["video"] = str(video)
        for question in truth["questions"].values():
            question["video"] = str(video)
        if kind == "temporal":
            record = dict(truth["questions"]["temporal"])
        else:
            record = dict(truth["questions"]["color" if i % 2 == 0 else "count"])
        record["video"] = str(video)
        record["id"] = f"{kind}-{seed}-{i}"
        record["truth"] = truth
        records.append(record)
    return records
