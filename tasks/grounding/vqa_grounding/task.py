"""`task=vqa_grounding`: visual grounding (referring expressions, multi-object, negatives) with IoU rewards.

A Qwen-VL policy reads an image and an expression ("the small red circle", "all blue squares") and
answers ``[{"bbox_2d": [x1, y1, x2, y2], "label": "..."}]`` (``[]`` when absent) in its family's
box frame (0..1000 for Qwen2-VL / Qwen3-VL, resized-input pixels for Qwen2.5-VL). Rewards convert
the answer to original-image pixels (with the processor's input size carried by each sample) and
score it there: IoU-type reward + format reward - duplicate-box penalty. See
``docs/tasks/vqa_grounding.md``.

Data: synthetic scenes by default (no download), or a canonical grounding JSONL, a VLM-R1 REC
file or RefCOCO annotations through the loaders of :mod:`mmrl.data`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl.adapters.grounding.coords import FrameError, convert_boxes
from mmrl.errors import ConfigError
from mmrl.models.configs import ModelConfig, model_path
from mmrl.models.families import MODEL_BOX_FRAMES
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import SkipItem, Task, TaskConfigBase
from mmrl.tasks.grounding.vqa_grounding.prompts import ANSWER_FRAMES, build_prompt, sft_target
from mmrl.tasks.grounding.vqa_grounding.rewards import (
    GroundingRewardSettings,
    grounding_eval_metrics,
    make_duplicate_reward,
    make_format_reward,
    make_grounding_reward,
    rollout_monitors,
    sample_frame,
    sample_orig_size,
)

log = logging.getLogger(__name__)

DATA_FORMATS: tuple[str, ...] = ("synthetic", "jsonl", "vlm_r1", "refcoco")
BOX_FRAME_CHOICES: tuple[str, ...] = ("auto", *ANSWER_FRAMES)
_SIMPLE_IOU_KINDS = ("iou", "iou_sq", "giou01")
_ACC_KIND = re.compile(r"^acc@(\d*\.?\d+)$")
_MIN_SYNTHETIC_SIDE = 96
ON_INVALID_BOX: tuple[str, ...] = ("error", "skip", "skip_sample")
"""task.on_invalid_box values; skip_sample is the loaders' name of skip (accepted as a synonym)."""


@dataclass
class VQAGroundingConfig(TaskConfigBase):
    """Visual grounding with IoU rewards (see docs/tasks/vqa_grounding.md)."""

    name: str = "vqa_grounding"
    """Task selector."""
    data_format: str = "synthetic"
    """Where the data comes from: synthetic (generated scenes, no download), jsonl (canonical grounding
    JSONL, docs/data_formats.md), vlm_r1 (VLM-R1 REC JSON/JSONL) or refcoco (COCO instances + refs)."""
    data: str | None = None
    """Training file: the JSONL (jsonl), the VLM-R1 file (vlm_r1) or the COCO instances JSON (refcoco)."""
    eval_data: str | None = None
    """Evaluation file of the same format (jsonl, vlm_r1); None holds out the last num_eval training items."""
    image_root: str | None = None
    """Image folder that vlm_r1 / refcoco image names are relative to (jsonl paths are relative to the file)."""
    refs: str | None = None
    """refcoco: the refs file (JSON list; a refs(unc).p pickle only with allow_pickle)."""
    train_split: str = "train"
    """refcoco: split used for training."""
    eval_split: str = "val"
    """refcoco: split used for evaluation."""
    allow_pickle: bool = False
    """refcoco: allow reading a pickled refs file (unpickling can run code: only for files you trust)."""
    on_invalid_box: str = "error"
    """An unusable row of a data file (a box that is not 4 numbers, reversed, empty, or lies entirely outside its
    image; VLM-R1 image sizes are read from the image headers for this check): error (stop before training with one
    line naming file:line, the box and the image size) or skip (drop the row at load time; one warning line
    "skipped K of N rows of <file>: <reason>", and the count is logged as data/load_skipped). skip_sample = skip."""
    num_train: int = 512
    """synthetic: number of training scenes."""
    num_eval: int = 64
    """Evaluation items: synthetic scenes, or items held out of `data` when eval_data is None."""
    seed: int = 0
    """synthetic: seed of the training scenes."""
    eval_seed: int = 1
    """synthetic: seed of the evaluation scenes (differs from seed, so eval scenes are unseen)."""
    image_sizes: list[list[int]] = field(default_factory=lambda: [[192, 144], [144, 192], [168, 168]])
    """synthetic: image sizes [W, H] to draw from (non-square sizes exercise the per-axis frame conversion)."""
    max_objects: int = 4
    """synthetic: most shapes per scene."""
    position_cue: float = 0.0
    """synthetic: strength in [0, 1] of a position-coded background gradient. A tiny model trained
    from scratch has no absolute position signal (rotary embeddings are relative); the CPU default
    sets 1.0 so it can learn localisation in minutes. Real models do not need it."""
    object_scale: float = 1.0
    """synthetic: multiplies object sizes (small 6-8%, large 17-22% of the shorter image side at 1.0)."""
    p_multi: float = 0.15
    """synthetic: fraction of multi-target scenes ("all blue squares"); used only with multi_box."""
    p_negative: float = 0.1
    """synthetic: fraction of negative scenes (the object is absent; the right answer is [])."""
    multi_box: bool = True
    """Multi-target questions: the prompt asks for every matching object. False asks for one object and
    drops multi-target items (synthetic p_multi is then ignored; negatives are kept)."""
    think: bool = False
    """Ask for <think>...</think><answer>...</answer>; False asks for the bare JSON answer."""
    box_frame: str = "auto"
    """Frame the prompt asks the model to answer in: auto (from the model family: norm1000 for Qwen2-VL /
    Qwen3-VL, input_pixels for Qwen2.5-VL), norm1000 or input_pixels (then answers are read in it)."""
    iou_kind: str = "iou"
    """Single-target reward: iou (VLM-R1), iou_sq (Perception-R1), giou01 ((GIoU+1)/2) or acc@T (1 if IoU >= T).
    Multi-target and negative items use matched mean IoU (f1 at T for acc@T)."""
    tau: float = 0.5
    """IoU threshold of a match for precision / recall / f1."""
    iou_weight: float = 1.0
    """Weight of the grounding reward (reward/grounding)."""
    format_weight: float = 0.2
    """Weight of the format reward (reward/format: exact JSON answer layout, not truncated)."""
    duplicate_penalty_weight: float = 0.5
    """Magnitude of the duplicate-box penalty: reward -= this * fraction of repeated boxes (reward/duplicate)."""
    duplicate_iou: float = 0.7
    """IoU above which a predicted box repeats an earlier one."""
    pay_format_for_empty: bool = False
    """Pay the format reward for an empty answer [] on items that have a target. False (default) pays it only on
    negatives: otherwise [] is a cheap answer GRPO collapses onto (the empty-answer hack, Visual-RFT #176)."""
    max_prompt_chars: int = 1000
    """Items whose prompt (instruction + question) has more characters are dropped at load time, never truncated
    (one warning line with the count; counted in data/load_skipped). Guards tokenisation against runaway text."""

    def validate(self) -> None:
        """Raise ConfigError on inconsistent settings."""
        if self.data_format not in DATA_FORMATS:
            raise ConfigError(
                f"task.data_format: {self.data_format!r} is not valid; choose from {', '.join(DATA_FORMATS)}"
            )
        if self.data_format != "synthetic" and not self.data:
            raise ConfigError(f"task.data: data_format={self.data_format} needs a data file (task.data=PATH)")
        if self.data_format == "synthetic" and (self.data or self.eval_data):
            raise ConfigError(
                f"task.data_format=synthetic ignores task.data / task.eval_data ({self.data or self.eval_data}); "
                f"set task.data_format to the file's format ({', '.join(DATA_FORMATS[1:])})"
            )
        if self.data_format in ("vlm_r1", "refcoco") and not self.image_root:
            raise ConfigError(f"task.image_root: data_format={self.data_format} needs the image folder")
        if self.data_format == "refcoco" and not self.refs:
            raise ConfigError("task.refs: data_format=refcoco needs the refs file")
        if self.box_frame not in BOX_FRAME_CHOICES:
            raise ConfigError(
                f"task.box_frame: {self.box_frame!r} is not valid; choose from {', '.join(BOX_FRAME_CHOICES)}"
            )
        match = _ACC_KIND.match(self.iou_kind)
        if self.iou_kind not in _SIMPLE_IOU_KINDS and not (match and 0.0 < float(match.group(1)) <= 1.0):
            raise ConfigError(
                f"task.iou_kind: {self.iou_kind!r} is not valid; choose from {', '.join(_SIMPLE_IOU_KINDS)} or acc@T (0 < T <= 1)"
            )
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"task.tau must be in (0, 1], got {self.tau}")
        if not 0.0 < self.duplicate_iou < 1.0:
            raise ConfigError(f"task.duplicate_iou must be in (0, 1), got {self.duplicate_iou}")
        for name in ("iou_weight", "format_weight", "duplicate_penalty_weight"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"task.{name} must be a finite number")
        if self.duplicate_penalty_weight < 0:
            raise ConfigError("task.duplicate_penalty_weight is the penalty's magnitude; give a value >= 0")
        if self.on_invalid_box not in ON_INVALID_BOX:
            raise ConfigError(f"task.on_invalid_box: {self.on_invalid_box!r} is not valid; choose from error, skip")
        if self.num_train < 1 or self.num_eval < 0:
            raise ConfigError("task.num_train must be >= 1 and task.num_eval >= 0")
        if self.max_prompt_chars < 1:
            raise ConfigError("task.max_prompt_chars must be >= 1")
        if not self.image_sizes or any(len(s) != 2 or min(s) < _MIN_SYNTHETIC_SIDE for s in self.image_sizes):
            raise ConfigError(
                f"task.image_sizes: give [W, H] pairs with sides >= {_MIN_SYNTHETIC_SIDE}, got {self.image_sizes}"
            )
        for name in ("p_multi", "p_negative"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"task.{name} must be in [0, 1]")


# ----------------------------------------------------------------------------- model family -> frame

_FAMILY_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    ("qwen2_5_vl", "qwen25vl"),
    ("qwen2_vl", "qwen2vl"),
    ("qwen3_vl", "qwen3vl"),
)


def model_family_of(model_cfg: ModelConfig | None) -> str | None:
    """The Qwen-VL family of a model config, or None when it cannot be told.

    Looks, in order, at ``name`` / ``path`` as a preset of :data:`mmrl.models.presets.VLM_PRESETS`; ``model_type``
    in ``<path>/config.json`` of a local folder; a hub id or name that spells the family
    (``Qwen/Qwen2.5-VL-3B-Instruct``).
    """
    if model_cfg is None:
        return None
    from mmrl.models.presets import VLM_PRESETS

    path = model_path(model_cfg)
    keys = [str(k) for k in (model_cfg.name, path) if k]
    for key in keys:
        if key in VLM_PRESETS:
            return VLM_PRESETS[key].family
    if path:
        config_json = Path(str(path)).expanduser() / "config.json"
        if config_json.is_file():
            try:
                model_type = json.loads(config_json.read_text()).get("model_type")
            except (OSError, ValueError):
                model_type = None
            if model_type in MODEL_BOX_FRAMES:
                return model_type
    for key in keys:
        squashed = re.sub(r"[^a-z0-9]", "", key.lower())
        for fam, pattern in _FAMILY_NAME_PATTERNS:
            if pattern in squashed:
                return fam
    return None


def describe_model(model_cfg: ModelConfig | None) -> dict | None:
    """``{"type", "name", "path"}`` of a model config, as an error that cannot tell its family shows it."""
    if model_cfg is None:
        return None
    return {"type": model_cfg.type, "name": model_cfg.name, "path": model_path(model_cfg)}


def resolve_answer_frame(box_frame: str, run_cfg: Any) -> str:
    """The frame the prompt asks for: ``box_frame`` when set, else the model family's frame."""
    if box_frame != "auto":
        return box_frame
    model_cfg = run_cfg.model if run_cfg is not None else None
    family = model_family_of(model_cfg)
    if family is None:
        raise ConfigError(
            f"task.box_frame=auto cannot tell the Qwen-VL family of the model {describe_model(model_cfg)}; "
            "set task.box_frame=norm1000 (Qwen2-VL, Qwen3-VL) or task.box_frame=input_pixels (Qwen2.5-VL)"
        )
    return MODEL_BOX_FRAMES[family]


# ----------------------------------------------------------------------------- data files


def check_data_files(cfg: VQAGroundingConfig) -> None:
    """ConfigError (one line naming the key and the path) for a data file that does not exist, before any
    model is built: ``task.data``, ``task.eval_data`` and, for refcoco, ``task.refs``."""
    if cfg.data_format == "synthetic":
        return
    keys = ("data", "eval_data", "refs") if cfg.data_format == "refcoco" else ("data", "eval_data")
    for key in keys:
        path = getattr(cfg, key)
        if path and not Path(path).expanduser().is_file():
            what = "is a directory, not a file" if Path(path).expanduser().is_dir() else "file not found"
            raise ConfigError(f"task.{key}={path}: {what}; give the path of an existing {cfg.data_format} file")


def _loader_mode(on_invalid_box: str) -> str:
    """The loaders' ``on_invalid_box`` for the task's value."""
    return "error" if on_invalid_box == "error" else "skip_sample"


def _with_task_hint(exc: Exception) -> Exception:
    """An InvalidSampleError raised by a loader, with the task-level remedy instead of the loader's keyword hint."""
    from mmrl.adapters.grounding.data import InvalidSampleError

    reason = exc.reason.split("; pass ")[0]
    return InvalidSampleError(
        exc.source, f"{reason}; fix or remove the row, or set task.on_invalid_box=skip to skip such rows", exc.kind
    )


# ----------------------------------------------------------------------------- the task


class VQAGroundingTask(Task):
    """Grounding task: prompts in the model's box frame, rewards in original-image pixels."""

    model_types = ("vlm",)

    name = "vqa_grounding"
    description = (
        "Image grounding (Qwen-VL): boxes as JSON, IoU rewards in original pixels; synthetic scenes by default."
    )
    config_cls = VQAGroundingConfig

    def __init__(self, cfg: VQAGroundingConfig, run_cfg: Any = None) -> None:
        super().__init__(cfg, run_cfg)
        model_type = run_cfg.model.type if run_cfg is not None else None
        if model_type is not None and model_type != "vlm":
            raise ConfigError(
                f"task=vqa_grounding needs a vision-language model (model.type=vlm), got model.type={model_type}"
            )
        self.answer_frame = resolve_answer_frame(cfg.box_frame, run_cfg)
        self.settings = GroundingRewardSettings(
            iou_kind=cfg.iou_kind,
            tau=cfg.tau,
            think=cfg.think,
            strict_frame=cfg.box_frame == "auto",
            duplicate_iou=cfg.duplicate_iou,
            pay_format_for_empty=cfg.pay_format_for_empty,
        )
        self._files: dict[str, list] = {}
        self.load_reports: dict[str, str] = {}
        """Summary line of each data file load (LoadReport.summary) and of the items dropped here."""
        self.load_skipped: dict[str, int] = {}
        """Per split: rows left out at load time for bad data (unusable boxes with on_invalid_box=skip, prompts over
        max_prompt_chars); the training count is logged as ``data/load_skipped``."""
        self._file_skips: dict[str, int] = {}
        check_data_files(cfg)

    # ------------------------------------------------------------------ data
    def _load_samples(self, split: str) -> list:
        """GroundingSample list for ``split`` ("train" / "eval"); errors from the loaders propagate."""
        cfg = self.cfg
        if cfg.data_format == "synthetic":
            from mmrl.adapters.grounding.synthetic_scenes import generate_scenes

            n, seed = (cfg.num_train, cfg.seed) if split == "train" else (cfg.num_eval, cfg.eval_seed)
            return generate_scenes(
                n,
                seed=seed,
                sizes=[tuple(s) for s in cfg.image_sizes],
                max_objects=cfg.max_objects,
                p_multi=cfg.p_multi if cfg.multi_box else 0.0,
                p_negative=cfg.p_negative,
                position_cue=cfg.position_cue,
                object_scale=cfg.object_scale,
            )
        if cfg.data_format == "refcoco":
            from mmrl.adapters.grounding.converters import load_refcoco
            from mmrl.adapters.grounding.data import InvalidSampleError

            try:
                samples = load_refcoco(
                    cfg.data,
                    cfg.refs,
                    cfg.image_root,
                    split=cfg.train_split if split == "train" else cfg.eval_split,
                    allow_pickle=cfg.allow_pickle,
                    on_invalid_box=_loader_mode(cfg.on_invalid_box),
                )
            except InvalidSampleError as exc:
                raise _with_task_hint(exc) from None
            self.load_reports[split] = samples.report.summary()
            self.load_skipped[split] = len(samples.report.skipped)
            return list(samples)
        path = cfg.data if split == "train" or cfg.eval_data is None else cfg.eval_data
        samples = self._load_file(path)
        self.load_skipped[split] = self._file_skips.get(path, 0) if (split == "train" or cfg.eval_data) else 0
        if cfg.eval_data is None:
            if len(samples) <= cfg.num_eval:
                raise ConfigError(
                    f"task.data {path} has {len(samples)} items: too few to hold out task.num_eval={cfg.num_eval} "
                    "for evaluation; give task.eval_data or lower task.num_eval"
                )
            cut = len(samples) - cfg.num_eval
            samples = samples[:cut] if split == "train" else samples[cut:]
        return samples

    def _load_file(self, path: str) -> list:
        if path in self._files:
            return self._files[path]
        cfg = self.cfg
        from mmrl.adapters.grounding.data import InvalidSampleError

        mode = _loader_mode(cfg.on_invalid_box)
        try:  # pixel boxes without a recorded image size: sizes from the image headers, so a box outside is caught
            if cfg.data_format == "jsonl":
                from mmrl.adapters.grounding.data import load_grounding_jsonl

                samples = load_grounding_jsonl(path, on_invalid_box=mode, read_image_sizes=True)
            else:
                from mmrl.adapters.grounding.converters import load_vlm_r1_rec

                samples = load_vlm_r1_rec(path, cfg.image_root, on_invalid_box=mode, read_image_sizes=True)
        except InvalidSampleError as exc:
            raise _with_task_hint(exc) from None
        self.load_reports[str(path)] = samples.report.summary()
        self._file_skips[path] = len(samples.report.skipped)
        self._files[path] = list(samples)
        return self._files[path]

    def item_from_sample(self, sample: Any) -> dict:
        """The task record of one :class:`~mmrl.adapters.grounding.data.GroundingSample`.

        Keys: ``prompt``, ``question``, ``image`` (path or PIL image), ``gt_boxes`` (list of
        ``[x1, y1, x2, y2]`` in original pixels; None until :meth:`prepare_item` when a normalised
        box frame meets an unknown image size), ``gt_labels``, ``id``, ``source``, ``image_size``
        (``(W, H)`` or None until prepared), ``answer_frame``.
        """
        item: dict[str, Any] = {
            "prompt": build_prompt(
                sample.question, self.answer_frame, think=self.cfg.think, multi_box=self.cfg.multi_box
            ),
            "question": sample.question,
            "image": sample.image,
            "gt_labels": list(sample.labels),
            "id": str(sample.id),
            "source": sample.source,
            "image_size": sample.image_size,
            "answer_frame": self.answer_frame,
        }
        if sample.bbox_frame == "pixels" or sample.image_size is not None:
            item["gt_boxes"] = sample.boxes_in_pixels().tolist()
        elif len(sample.boxes) == 0:
            item["gt_boxes"] = []
        else:  # normalised boxes, size known only once the image is read
            item["gt_boxes"] = None
            item["data_boxes"] = sample.boxes.tolist()
            item["data_frame"] = sample.bbox_frame
        return item

    def build_items(self, split: str) -> list[dict]:
        samples = self._load_samples(split)
        items, multi, too_long = [], [], []
        for s in samples:
            if not self.cfg.multi_box and len(s.boxes) > 1:
                multi.append(s.source)
                continue
            item = self.item_from_sample(s)
            if len(item["prompt"]) > self.cfg.max_prompt_chars:
                too_long.append(s.source)
                continue
            items.append(item)
        dropped = []
        if multi:
            dropped.append(f"{len(multi)} multi-target items (task.multi_box=false; first: {multi[0]})")
        if too_long:
            dropped.append(
                f"{len(too_long)} items with prompts over task.max_prompt_chars={self.cfg.max_prompt_chars} (first: {too_long[0]})"
            )
        if dropped:
            line = f"{split}: dropped " + "; ".join(dropped)
            self.load_reports[f"{split}/dropped"] = line
            log.warning("vqa_grounding %s", line)
        self.load_skipped[split] = self.load_skipped.get(split, 0) + len(too_long)
        if not items and (split == "train" or self.cfg.num_eval > 0):
            raise ConfigError(f"task=vqa_grounding: no usable {split} items (see the warnings above)")
        return items

    def prepare_item(self, item: dict) -> dict:
        """A copy of ``item`` with the image decoded (RGB PIL), ``image_size`` set and ``gt_boxes`` in pixels.

        Raises :class:`SkipItem` (``"<path>: <reason>"``) for a missing/corrupt image or one whose
        size differs from the recorded ``image_size`` (its boxes would be in another frame).
        """
        from mmrl.data.media import MediaError, load_image

        try:
            image = load_image(item["image"])
        except MediaError as exc:
            raise SkipItem(f"{exc.path}: {exc.reason}") from exc
        size = (int(image.size[0]), int(image.size[1]))
        recorded = item.get("image_size")
        if recorded is not None and tuple(int(v) for v in recorded) != size:
            where = item["image"] if isinstance(item["image"], (str, Path)) else item.get("source", item.get("id"))
            raise SkipItem(
                f"{where}: image is {size[0]}x{size[1]} but the record says {recorded[0]}x{recorded[1]} "
                "(its boxes would be in another frame)"
            )
        out = dict(item)
        out["image"] = image
        out["image_size"] = size
        if out.get("gt_boxes") is None:
            out["gt_boxes"] = convert_boxes(out["data_boxes"], out["data_frame"], "pixels", orig_size=size).tolist()
        return out

    # ------------------------------------------------------------------ rewards
    def reward_specs(self) -> list[RewardSpec]:
        """grounding (iou_weight), format (format_weight), duplicate (-duplicate_penalty_weight)."""
        return [
            RewardSpec("grounding", make_grounding_reward(self.settings), self.cfg.iou_weight),
            RewardSpec("format", make_format_reward(self.settings), self.cfg.format_weight),
            RewardSpec("duplicate", make_duplicate_reward(self.settings), -self.cfg.duplicate_penalty_weight),
        ]

    def reward_columns(self, items: Sequence[dict]) -> dict[str, list]:
        """Ground truth and frame facts the reward functions read (never the images)."""
        keys = ("gt_boxes", "gt_labels", "answer_frame", "image_size", "id")
        return {k: [it.get(k) for it in items] for k in keys}

    def sft_target(self, item: Mapping, meta: Mapping | None = None) -> str:
        """The ideal completion of a prepared ``item`` in this run's answer frame (see prompts.sft_target).

        ``meta`` is what the policy knows after preprocessing the item (the sample-dict keys
        ``input_size``, ``orig_size``, ``box_frame``); ``input_size`` is required for
        ``input_pixels``. The frame and size are cross-checked like the rewards do.
        """
        meta = dict(meta or {})
        if meta:
            sample_frame(meta, self.answer_frame, strict=self.settings.strict_frame)
            sample_orig_size(meta, item.get("image_size"))
        if self.answer_frame == "input_pixels" and meta.get("input_size") is None:
            raise FrameError(
                "an input_pixels SFT target needs the model-input size (W, H) of the item's image in meta['input_size'] "
                "(the policy's sample_meta gives it from the processor output)"
            )
        return sft_target(item, self.answer_frame, meta.get("input_size"), think=self.cfg.think)

    # ------------------------------------------------------------------ metrics
    @staticmethod
    def _per_sample_items(items: Sequence[Mapping], samples: Sequence) -> list[Mapping]:
        if len(items) == len(samples):
            return list(items)
        if items and len(samples) % len(items) == 0:
            group = len(samples) // len(items)
            return [it for it in items for _ in range(group)]
        raise ValueError(f"{len(samples)} samples cannot be matched to {len(items)} items")

    def rollout_metrics(self, items: Sequence[Mapping], samples: Sequence[Mapping]) -> dict[str, float]:
        """Parser and reward-hacking monitors of a rollout batch (``monitor/...``).

        ``items[i]`` is the prepared item of ``samples[i]``; one item per prompt is also accepted
        when ``len(samples)`` is a multiple (prompt-major groups).
        """
        out = (
            rollout_monitors(self._per_sample_items(items, samples), samples, strict=self.settings.strict_frame)
            if samples
            else {}
        )
        if self.load_skipped.get("train"):
            out["data/load_skipped"] = float(self.load_skipped["train"])
        return out

    def eval_metrics(self, items: Sequence[Mapping], samples: list, per_fn: dict) -> dict[str, float]:
        """eval/acc@0.5, eval/mean_iou, eval/precision, eval/recall, eval/f1, eval/parse_fail_rate, eval/score."""
        return grounding_eval_metrics(
            self._per_sample_items(items, samples), samples, tau=self.cfg.tau, strict=self.settings.strict_frame
        )
