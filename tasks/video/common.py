"""What the video tasks share: frame budget config, decoding in ``prepare_item``, synthetic data folder.

Both ``task=video_temporal_grounding`` and ``task=video_qa`` decode each video in
:meth:`VideoTaskBase.prepare_item` through the frame cache (once per video and sampling config;
later rollouts, the shuffled T-GRPO copies and the rewards reuse the same clip) and replace the
item's ``video`` path by the decoded :class:`~mmrl.adapters.video.decode.VideoClip`. A video that cannot be
decoded (missing, corrupt, truncated, zero frames, no fps, clip outside the video, decode
timeout) raises :class:`~mmrl.tasks.base.SkipItem` naming the file: the trainer skips it and
counts it in ``data/skipped``.

Bad annotation files stop the run before training with one line (``mmrl train: error: ...``): a missing
``task.data`` / ``task.eval_data`` file, a malformed line (:class:`AnnotationError`, ``file:line``), a file with no
usable rows. Items whose prompt is longer than ``task.max_prompt_chars`` are dropped at load time and counted
(:meth:`VideoTaskBase.finish_items`: one warning line, ``data/load_skipped``), never truncated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from mmrl.adapters.video.decode import VideoSamplingBaseConfig, VideoSamplingConfig
from mmrl.errors import ConfigError
from mmrl.tasks.base import SkipItem, Task, TaskConfigBase

__all__ = [
    "VideoInputConfig",
    "VideoTaskConfig",
    "VideoTaskBase",
    "size_multiple_for_model",
    "synthetic_video_folder",
    "per_sample_items",
    "read_jsonl",
    "AnnotationError",
]

_FAMILY_SIZE_MULTIPLE = {"qwen2_vl": 28, "qwen2_5_vl": 28, "qwen3_vl": 32}

log = logging.getLogger(__name__)


class AnnotationError(ConfigError):
    """A malformed annotation file; the message names ``file:line`` and what is wrong.

    A :class:`~mmrl.errors.ConfigError` (hence a ``ValueError``): ``mmrl train`` prints it as one line, exit code 2."""


@dataclass
class VideoInputConfig(VideoSamplingBaseConfig):
    """How videos are sampled for the model (see docs/video_input.md for the rule and budgets).

    The fields and their meaning are those of :class:`~mmrl.adapters.video.decode.VideoSamplingBaseConfig`;
    ``max_frames``, ``max_pixels_per_frame`` and ``size_multiple`` have task defaults of their own.
    """

    max_frames: int = 8
    """Most frames per video (longer videos get a lower effective fps)."""
    max_pixels_per_frame: int = 56 * 56
    """Pixel cap per frame (sides are multiples of the model's patch*merge: 28, or 32 for Qwen3-VL)."""
    size_multiple: int | None = None
    """Frame sides are multiples of this; None: from the model family (28 Qwen2/2.5-VL, 32 Qwen3-VL)."""

    def validate(self) -> None:
        """Raise ConfigError on values VideoSamplingConfig would refuse."""
        try:
            self.sampling(self.size_multiple or 28)
        except ValueError as exc:
            raise ConfigError(f"task.video: {exc}") from None

    def sampling(self, size_multiple: int, frame_factor: int = 2) -> VideoSamplingConfig:
        """The :class:`~mmrl.adapters.video.decode.VideoSamplingConfig` of these settings."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(VideoSamplingBaseConfig)}
        shared.update(fps=float(self.fps), size_multiple=int(self.size_multiple or size_multiple))
        return VideoSamplingConfig(**shared, frame_factor=frame_factor)


@dataclass
class VideoTaskConfig(TaskConfigBase):
    """Settings every video task has: data source, synthetic event videos, frame sampling, format reward.

    ``task=video_qa`` (:class:`~mmrl.tasks.video.video_qa.VideoQAConfig`) and ``task=video_temporal_grounding``
    (:class:`~mmrl.tasks.video.video_temporal_grounding.VideoTemporalGroundingConfig`) extend it; each sets
    ``name`` and its ``DATA_FORMATS``. See docs/tasks/video.md.
    """

    DATA_FORMATS = ("synthetic", "jsonl")  # not a field: the task's accepted data_format values

    name: str = ""
    """Task selector."""
    data_format: str = "synthetic"
    """synthetic (generated event videos, no download), jsonl (one object per line: a question for video_qa,
    {"video", "query", "segments"} for video_temporal_grounding; docs/tasks/video.md) or, video_temporal_grounding
    only, charades (Charades-STA 'vid start end##sentence' lines)."""
    data: str | None = None
    """Training annotation file (data_format jsonl or charades)."""
    eval_data: str | None = None
    """Evaluation annotation file; None holds out the last num_eval training items."""
    video_root: str | None = None
    """jsonl: relative video paths are relative to this folder (default: the JSONL's folder); charades: folder of
    the videos (<video_root>/<id><video_ext>)."""
    num_train: int = 256
    """synthetic: number of training videos (video_qa: even ones ask the colour, odd ones the flash count)."""
    num_eval: int = 32
    """Evaluation items: synthetic videos, or items held out of `data` when eval_data is None."""
    seed: int = 0
    """synthetic: seed of the training videos."""
    eval_seed: int = 1
    """synthetic: seed of the evaluation videos (unseen in training)."""
    video_duration_s: float = 4.0
    """synthetic: length of each video."""
    video_fps: int = 4
    """synthetic: frame rate of the written files (events start and end on this grid)."""
    video_size: list[int] = field(default_factory=lambda: [128, 96])
    """synthetic: [W, H] of the written files."""
    event_grid: int = 1
    """synthetic: events (the grounding event, each flash of the QA square) start on and last whole multiples of
    this many frames of the file (2 with video.fps equal to video_fps = one temporal patch of the model, so an event
    is exactly resolvable)."""
    event_scale: float = 0.11
    """synthetic: radius of the event circle as a fraction of the shorter frame side (0.05 - 0.3)."""
    video: VideoInputConfig = field(default_factory=VideoInputConfig)
    """How videos are sampled for the model (fps, frame count, pixel budget, decoder, timeout, cache)."""
    format_weight: float = 0.1
    """Weight of the format reward (reward/format: one <answer>...</answer> block in the task's answer format that
    parses as written, nothing after it, completion finished)."""
    format_gate: bool = True
    """The task's answer reward counts only for completions that pass the format check. Without the gate an answer
    followed by junk scores like a clean one, RL reinforces the junk and the policy stops ending its completions
    (docs/tasks/video.md)."""
    max_prompt_chars: int = 4000
    """Items whose prompt (query / question, options and answer format) has more characters are dropped at load
    time, never truncated (one warning line with the count; data/load_skipped). A 33,000-character Charades sentence
    made one step take minutes."""

    def validate(self) -> None:
        """Raise ConfigError on inconsistent shared settings (subclasses add their own checks)."""
        if self.data_format not in self.DATA_FORMATS:
            raise ConfigError(
                f"task.data_format: {self.data_format!r} is not valid; choose from {', '.join(self.DATA_FORMATS)}"
            )
        if self.data_format != "synthetic" and not self.data:
            raise ConfigError(f"task.data: data_format={self.data_format} needs an annotation file (task.data=PATH)")
        if self.data_format == "synthetic" and (self.data or self.eval_data):
            raise ConfigError(
                f"task.data_format=synthetic ignores task.data / task.eval_data ({self.data or self.eval_data}); "
                f"set task.data_format to the file's format ({', '.join(self.DATA_FORMATS[1:])})"
            )
        if self.num_train < 1 or self.num_eval < 0:
            raise ConfigError("task.num_train must be >= 1 and task.num_eval >= 0")
        if not math.isfinite(self.format_weight):
            raise ConfigError("task.format_weight must be a finite number")
        if self.max_prompt_chars < 1:
            raise ConfigError(f"task.max_prompt_chars must be >= 1, got {self.max_prompt_chars}")


def size_multiple_for_model(run_cfg: Any) -> int:
    """28 (Qwen2-VL / Qwen2.5-VL) or 32 (Qwen3-VL) from the run's model config.

    Raises ConfigError when the family cannot be told (then set ``task.video.size_multiple``).
    """
    from mmrl.tasks.grounding.vqa_grounding.task import describe_model, model_family_of

    model_cfg = run_cfg.model if run_cfg is not None else None
    family = model_family_of(model_cfg)
    if family not in _FAMILY_SIZE_MULTIPLE:
        raise ConfigError(
            f"cannot tell the Qwen-VL family of the model {describe_model(model_cfg)}; set task.video.size_multiple "
            "(28 for Qwen2-VL / Qwen2.5-VL, 32 for Qwen3-VL)"
        )
    return _FAMILY_SIZE_MULTIPLE[family]


def synthetic_video_folder(kind: str) -> Path:
    """Folder of the synthetic videos of a task: ``$MMRL_CACHE/datasets/synthetic_video_<kind>``."""
    from mmrl.models.cache import cache_root

    return cache_root() / "datasets" / f"synthetic_video_{kind}"


def per_sample_items(items: Sequence[Mapping], samples: Sequence) -> list[Mapping]:
    """``items`` matched to ``samples``: one per sample, or one per prompt repeated (prompt-major)."""
    if len(items) == len(samples):
        return list(items)
    if items and len(samples) % len(items) == 0:
        group = len(samples) // len(items)
        return [it for it in items for _ in range(group)]
    raise ValueError(f"{len(samples)} samples cannot be matched to {len(items)} items")


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """``(line number, record)`` of each non-empty line of a JSONL file.

    Raises:
        FileNotFoundError: no such file.
        AnnotationError: a line that is not a JSON object (``file:line`` in the message).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"annotation file {path} not found")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise AnnotationError(f"{path}:{n}: not valid JSON ({exc})") from None
        if not isinstance(rec, dict):
            raise AnnotationError(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}")
        out.append((n, rec))
    return out


class VideoTaskBase(Task):
    """Common parts of the video tasks: the sampling config and decoding in :meth:`prepare_item`."""

    model_types = ("vlm",)

    def __init__(self, cfg: Any, run_cfg: Any = None) -> None:
        super().__init__(cfg, run_cfg)
        model_type = run_cfg.model.type if run_cfg is not None else None
        if model_type is not None and model_type != "vlm":
            raise ConfigError(
                f"task={self.name} needs a vision-language model (model.type=vlm), got model.type={model_type}"
            )
        multiple = cfg.video.size_multiple or (size_multiple_for_model(run_cfg) if run_cfg is not None else 28)
        self.sampling = cfg.video.sampling(multiple)
        """The :class:`~mmrl.adapters.video.decode.VideoSamplingConfig` every item of this run is decoded with."""
        self.load_skipped: dict[str, int] = {}
        """Per split: items dropped at load time (prompts over ``task.max_prompt_chars``); the training count is
        logged as ``data/load_skipped``."""
        if cfg.data_format != "synthetic":
            for key in ("data", "eval_data"):
                path = getattr(cfg, key)
                if path and not Path(path).expanduser().is_file():
                    what = "is a directory, not a file" if Path(path).expanduser().is_dir() else "file not found"
                    raise ConfigError(
                        f"task.{key}={path}: {what}; give the path of an existing {cfg.data_format} annotation file"
                    )

    def data_path(self, split: str) -> tuple[str, str]:
        """``(config key, path)`` of the annotation file ``split`` is read from."""
        if split == "train" or self.cfg.eval_data is None:
            return "data", self.cfg.data
        return "eval_data", self.cfg.eval_data

    def check_rows(self, recs: Sequence[dict], split: str) -> None:
        """ConfigError (one line naming the file) when an annotation file gives no rows at all."""
        if not recs:
            key, path = self.data_path(split)
            raise ConfigError(
                f"task.{key}={path}: no usable rows (the file has no annotation lines); "
                "give a non-empty annotation file"
            )

    def finish_items(self, items: list[dict], split: str) -> list[dict]:
        """``items`` without those whose prompt is over ``task.max_prompt_chars`` (one warning line with the count;
        counted in :attr:`load_skipped`). ConfigError when nothing usable is left of a split that needs items."""
        limit = self.cfg.max_prompt_chars
        kept = [it for it in items if len(it["prompt"]) <= limit]
        dropped = len(items) - len(kept)
        self.load_skipped[split] = dropped
        if dropped:
            first = next(it for it in items if len(it["prompt"]) > limit)
            log.warning(
                "%s %s: skipped %d of %d items with prompts over task.max_prompt_chars=%d (first: %s, %d characters)",
                self.name,
                split,
                dropped,
                len(items),
                limit,
                first.get("source", first.get("id")),
                len(first["prompt"]),
            )
        if not kept and items and (split == "train" or self.cfg.num_eval > 0):
            key, path = self.data_path(split)
            raise ConfigError(
                f"task.{key}={path}: no usable {split} items: all {len(items)} have prompts over "
                f"task.max_prompt_chars={limit}; raise it or fix the annotation file"
            )
        return kept

    def load_metrics(self) -> dict[str, float]:
        """``data/load_skipped``: training items dropped at load time (only when some were)."""
        n = self.load_skipped.get("train", 0)
        return {"data/load_skipped": float(n)} if n else {}

    @property
    def frame_cache(self):
        """The process-wide frame cache of this run's sampling config."""
        from mmrl.adapters.video.frame_cache import frame_cache_for

        return frame_cache_for(self.sampling)

    def decode(self, item: Mapping[str, Any]):
        """The item's clip (window ``clip_start``/``clip_end`` of the item, if any) from the frame cache.

        Raises SkipItem naming the file for every data problem (VideoError).
        """
        from mmrl.adapters.video.decode import VideoClip, VideoError

        src = item.get("video")
        if isinstance(src, VideoClip):
            return src
        if not isinstance(src, (str, Path)):
            raise SkipItem(f"item {item.get('id')}: 'video' must be a file path, got {type(src).__name__}")
        cfg = self.sampling
        if item.get("clip_start") is not None or item.get("clip_end") is not None:
            cfg = cfg.with_clip(item.get("clip_start"), item.get("clip_end"))
        try:
            return self.frame_cache.get_or_decode(src, cfg)
        except VideoError as exc:
            raise SkipItem(f"{exc.path}: {exc.reason}") from exc

    def prepare_item(self, item: dict) -> dict:
        """A copy of ``item`` with ``video`` decoded (a VideoClip), ``duration`` = seconds the model's
        clock covers (the clip window) and ``clip_start``; then :meth:`check_annotation`."""
        clip = self.decode(item)
        out = dict(item)
        out["video"] = clip
        out["video_path"] = clip.path
        out["duration"] = float(clip.clip_end - clip.clip_start)
        out["clip_start"] = float(clip.clip_start)
        return self.check_annotation(out, clip)

    def check_annotation(self, item: dict, clip) -> dict:
        """Validate / convert the annotation against the decoded clip (SkipItem when unusable)."""
        return item

    def reward_columns(self, items: Sequence[dict]) -> dict[str, list]:
        """Per-item fields for the rewards (never the decoded frames)."""
        keys = [k for k in (items[0] if items else {}) if k not in ("prompt", "video", "truth")]
        return {k: [it.get(k) for it in items] for k in keys}


def finite_number(value: Any) -> float | None:
    """``float(value)`` when it is a finite real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
