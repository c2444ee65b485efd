"""`task=video_temporal_grounding`: find when an event happens in a video; temporal-IoU rewards.

A Qwen-VL policy reads a video and a query ("When does the red circle appear in the video?") and
answers ``<answer>start to end</answer>`` in seconds of the video it was shown. Rewards: temporal
IoU of the first predicted segment (``reward_kind``: tiou, tiou_dist (Time-R1), giou01, f1;
:func:`mmrl.adapters.video.temporal_rewards.temporal_reward`) + a format reward. Eval: mIoU, R@0.3/0.5/0.7
(``eval/score`` = mIoU). See docs/tasks/video.md.

Data: synthetic event videos (real mp4 files written under the mmrl cache, decoded back with
decord; no download), Charades-STA annotation lines (``video_id start end##sentence``) or a
generic JSONL (docs/tasks/video.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mmrl.errors import ConfigError
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import SkipItem
from mmrl.tasks.video.common import (
    AnnotationError,
    VideoTaskBase,
    VideoTaskConfig,
    finite_number,
    per_sample_items,
    read_jsonl,
    synthetic_video_folder,
)

DATA_FORMATS: tuple[str, ...] = ("synthetic", "charades", "jsonl")
_CHARADES_LINE = re.compile(r"^\s*(\S+)\s+(\S+)\s+(\S+)\s*##(.*)$")


@dataclass
class VideoTemporalGroundingConfig(VideoTaskConfig):
    """Temporal grounding with temporal-IoU rewards (see docs/tasks/video.md).

    Data source, synthetic videos, ``video`` sampling and the format reward: :class:`VideoTaskConfig`.
    """

    DATA_FORMATS = DATA_FORMATS

    name: str = "video_temporal_grounding"
    video_ext: str = ".mp4"
    """charades: file extension of the videos."""
    reward_kind: str = "tiou"
    """tiou (temporal IoU), tiou_dist (Time-R1: IoU * (1-|ds|/D) * (1-|de|/D)), giou01 ((GIoU+1)/2, partial credit
    for near misses) or f1 (multi-segment F1 at tau)."""
    tau: float = 0.5
    """IoU threshold of a match for reward_kind=f1."""
    iou_weight: float = 1.0
    """Weight of the temporal reward (reward/temporal)."""
    on_reversed: str = "reject"
    """A predicted segment with start > end: reject (scores 0) or swap."""
    annotation_tolerance_s: float = 0.5
    """An annotated end up to this far past the video's end is clipped to it; further -> the item is skipped."""

    def validate(self) -> None:
        """Raise ConfigError on inconsistent settings."""
        from mmrl.adapters.video.temporal_rewards import REWARD_KINDS

        super().validate()
        if self.data_format == "charades" and not self.video_root:
            raise ConfigError("task.video_root: data_format=charades needs the folder of the videos")
        if self.reward_kind not in REWARD_KINDS:
            raise ConfigError(
                f"task.reward_kind: {self.reward_kind!r} is not valid; choose from {', '.join(REWARD_KINDS)}"
            )
        if self.on_reversed not in ("reject", "swap"):
            raise ConfigError(f"task.on_reversed: {self.on_reversed!r} is not valid; choose from reject, swap")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"task.tau must be in (0, 1], got {self.tau}")
        if not (math.isfinite(self.annotation_tolerance_s) and self.annotation_tolerance_s >= 0):
            raise ConfigError("task.annotation_tolerance_s must be a finite number >= 0")
        if not math.isfinite(self.iou_weight):
            raise ConfigError("task.iou_weight must be a finite number")


# ----------------------------------------------------------------------------- prompts and targets


def build_prompt(query: str) -> str:
    """The user text: the query, then the answer format."""
    query = query.strip()
    if not query.endswith("?"):
        query = f"When does this happen in the video: {query.rstrip('.')}?"
    return f"{query} Answer with the start and end time in seconds as <answer>start to end</answer>."


def format_answer(start: float, end: float) -> str:
    """``<answer>1.5 to 3.2</answer>`` (one decimal)."""
    return f"<answer>{start:.1f} to {end:.1f}</answer>"


# ----------------------------------------------------------------------------- loaders


def _segment_from(value: Any, where: str) -> list[float]:
    """A ``[start, end]`` pair of finite numbers with ``0 <= start <= end``; AnnotationError otherwise."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise AnnotationError(f"{where}: a segment must be [start, end], got {value!r}")
    s, e = finite_number(value[0]), finite_number(value[1])
    if s is None or e is None:
        raise AnnotationError(f"{where}: segment bounds must be finite numbers, got {value!r}")
    if s < 0 or e < s:
        raise AnnotationError(f"{where}: segment {value!r} must satisfy 0 <= start <= end")
    return [s, e]


def load_charades_sta(path: str | Path, video_root: str | Path, *, video_ext: str = ".mp4") -> list[dict]:
    """Charades-STA lines ``"<video_id> <start> <end>##<sentence>"`` -> task records.

    Records: ``{"video": <video_root>/<id><ext>, "query", "segments": [[s, e]], "id", "source"}``.

    Raises:
        FileNotFoundError: no such annotation file.
        AnnotationError: a malformed line, non-numeric or reversed times, an empty sentence
            (``file:line`` in the message).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Charades-STA annotation file {path} not found")
    root = Path(video_root)
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        m = _CHARADES_LINE.match(line)
        if m is None:
            raise AnnotationError(f"{where}: expected '<video_id> <start> <end>##<sentence>', got {line[:80]!r}")
        vid, s, e, sentence = m.groups()
        try:
            seg = _segment_from([float(s), float(e)], where)
        except ValueError as exc:
            if isinstance(exc, AnnotationError):
                raise
            raise AnnotationError(f"{where}: start/end must be numbers, got {s!r} {e!r}") from None
        if not sentence.strip():
            raise AnnotationError(f"{where}: empty sentence")
        out.append(
            {
                "video": str(root / f"{vid}{video_ext}"),
                "query": sentence.strip(),
                "segments": [seg],
                "id": f"{vid}@{n}",
                "source": where,
            }
        )
    return out


def load_temporal_jsonl(path: str | Path, video_root: str | Path | None = None) -> list[dict]:
    """Generic temporal-grounding JSONL -> task records.

    One object per line: ``video`` (path; relative to ``video_root`` or the file's folder),
    ``query`` (or ``question`` / ``sentence``), ``segments`` (``[[s, e], ...]``) or ``timestamp``
    (``[s, e]``), optional ``id``, ``duration``, ``clip_start`` / ``clip_end`` (a window of the
    video in seconds; segments are then in source-video seconds and are shifted to the window).

    Raises:
        FileNotFoundError / AnnotationError (``file:line``) for missing fields or bad segments.
    """
    path = Path(path)
    root = Path(video_root) if video_root else path.parent
    out = []
    for n, rec in read_jsonl(path):
        where = f"{path}:{n}"
        video = rec.get("video")
        query = rec.get("query", rec.get("question", rec.get("sentence")))
        if not isinstance(video, str) or not video:
            raise AnnotationError(f"{where}: missing 'video' (a path)")
        if not isinstance(query, str) or not query.strip():
            raise AnnotationError(f"{where}: missing 'query' (or 'question' / 'sentence')")
        if "segments" in rec:
            raw = rec["segments"]
            if not isinstance(raw, list) or not raw:
                raise AnnotationError(f"{where}: 'segments' must be a non-empty list of [start, end]")
            segments = [_segment_from(s, where) for s in raw]
        elif "timestamp" in rec:
            segments = [_segment_from(rec["timestamp"], where)]
        else:
            raise AnnotationError(f"{where}: missing 'segments' (or 'timestamp')")
        item = {
            "video": str(Path(video) if Path(video).is_absolute() else root / video),
            "query": query.strip(),
            "segments": segments,
            "id": str(rec.get("id", f"{path.stem}:{n}")),
            "source": where,
        }
        for key in ("clip_start", "clip_end", "duration"):
            if rec.get(key) is not None:
                value = finite_number(rec[key])
                if value is None or value < 0:
                    raise AnnotationError(f"{where}: '{key}' must be a finite number >= 0, got {rec[key]!r}")
                item[key] = value
        if "duration" in item:
            item["annotated_duration"] = item.pop("duration")
        out.append(item)
    return out


# ----------------------------------------------------------------------------- rewards


def make_temporal_reward(kind: str, *, tau: float = 0.5, on_reversed: str = "reject", format_gate: bool = False):
    """Reward fn: ``temporal_reward`` of each completion against its item's ``segments`` (window seconds),
    predictions clipped to ``[0, duration]``; with ``format_gate`` a completion that fails
    :func:`temporal_format_ok` scores 0."""
    from mmrl.adapters.video.temporal_rewards import temporal_reward

    def temporal(prompts, completions, segments, duration, **_) -> list[float]:
        out = []
        for c, seg, d in zip(completions, segments, duration):
            if format_gate and not temporal_format_ok(c["text"], d, bool(c.get("truncated"))):
                out.append(0.0)
                continue
            score, _status = temporal_reward(c["text"], seg, d, kind=kind, tau=tau, on_reversed=on_reversed)
            out.append(score)
        return out

    return temporal


def temporal_format_ok(text: str, duration: float | None, truncated: bool) -> bool:
    """The completion ended, is exactly one ``<answer>`` block (optionally after one ``<think>`` block) with
    nothing after it, and the answer parses as written (status "ok")."""
    from mmrl.adapters.video.temporal_rewards import parse_segments
    from mmrl.rewards.format import is_clean_answer

    if not is_clean_answer(text, truncated):
        return False

    return parse_segments(text, duration=duration).status == "ok"


def temporal_format_reward(prompts, completions, duration, **_) -> list[float]:
    """1.0 when :func:`temporal_format_ok`, else 0.0."""
    return [
        1.0 if temporal_format_ok(c["text"], d, bool(c.get("truncated"))) else 0.0
        for c, d in zip(completions, duration)
    ]


def first_segment_iou(text: str, segments: Sequence[Sequence[float]], duration: float) -> tuple[float, bool]:
    """``(tIoU of the first predicted segment with the first ground truth, parsed)``; 0 when unparseable."""
    from mmrl.adapters.video.temporal_rewards import parse_segments, temporal_iou

    parsed = parse_segments(text, duration=duration)
    if parsed.status == "failed":
        return 0.0, False
    return temporal_iou(parsed.segments[0], segments[0]), True


# ----------------------------------------------------------------------------- the task


class VideoTemporalGroundingTask(VideoTaskBase):
    """Temporal grounding: segments in seconds of the clip the model sees, tIoU rewards."""

    name = "video_temporal_grounding"
    description = "Video temporal grounding (Qwen-VL): '<answer>s to e</answer>' seconds, tIoU rewards; synthetic videos by default."
    config_cls = VideoTemporalGroundingConfig

    # ------------------------------------------------------------------ data
    def _records(self, split: str) -> list[dict]:
        cfg = self.cfg
        if cfg.data_format == "synthetic":
            from mmrl.adapters.video.synthetic import make_video_dataset

            n, seed = (cfg.num_train, cfg.seed) if split == "train" else (cfg.num_eval, cfg.eval_seed)
            recs = make_video_dataset(
                synthetic_video_folder("temporal"),
                n,
                seed,
                "temporal",
                duration_s=cfg.video_duration_s,
                fps=cfg.video_fps,
                size=tuple(cfg.video_size),
                event_grid=cfg.event_grid,
                event_scale=cfg.event_scale,
            )
            return [
                {
                    "video": r["video"],
                    "query": r["question"].split("?")[0] + "?",
                    "segments": r["segments"],
                    "id": r["id"],
                    "source": r["video"],
                    "event": r["event"],
                }
                for r in recs
            ]
        path = cfg.data if split == "train" or cfg.eval_data is None else cfg.eval_data
        if cfg.data_format == "charades":
            recs = load_charades_sta(path, cfg.video_root, video_ext=cfg.video_ext)
        else:
            recs = load_temporal_jsonl(path, cfg.video_root)
        self.check_rows(recs, split)
        if cfg.eval_data is None:
            if len(recs) <= cfg.num_eval:
                raise ConfigError(
                    f"task.data {path} has {len(recs)} items: too few to hold out task.num_eval="
                    f"{cfg.num_eval}; give task.eval_data or lower task.num_eval"
                )
            cut = len(recs) - cfg.num_eval
            recs = recs[:cut] if split == "train" else recs[cut:]
        return recs

    def build_items(self, split: str) -> list[dict]:
        return self.finish_items([{**r, "prompt": build_prompt(r["query"])} for r in self._records(split)], split)

    def check_annotation(self, item: dict, clip) -> dict:
        """Segments -> the model's clock (seconds from the clip start), checked against the clip.

        A segment that starts at/after the end of the window, ends before its start, or ends more than
        ``annotation_tolerance_s`` past its end raises SkipItem (naming the file); an end within the
        tolerance is clipped to the window end.
        """
        duration, start = item["duration"], item["clip_start"]
        tol = self.cfg.annotation_tolerance_s
        segments = []
        for s, e in item["segments"]:
            s, e = s - start, e - start
            if s >= duration or e <= 0 or e > duration + tol or s < -tol:
                raise SkipItem(
                    f"{clip.path}: annotated segment [{s + start:g}, {e + start:g}] s is outside the video "
                    f"window [{start:g}, {start + duration:g}] s"
                )
            segments.append([max(0.0, s), min(duration, e)])
        item["segments"] = segments
        return item

    # ------------------------------------------------------------------ rewards
    def reward_specs(self) -> list[RewardSpec]:
        """temporal (iou_weight) + format (format_weight)."""
        return [
            RewardSpec(
                "temporal",
                make_temporal_reward(
                    self.cfg.reward_kind,
                    tau=self.cfg.tau,
                    on_reversed=self.cfg.on_reversed,
                    format_gate=self.cfg.format_gate,
                ),
                self.cfg.iou_weight,
            ),
            RewardSpec("format", temporal_format_reward, self.cfg.format_weight),
        ]

    def reward_columns(self, items: Sequence[dict]) -> dict[str, list]:
        """Ground truth the rewards read: ``segments`` (window seconds), ``duration``, ``id``."""
        return {k: [it.get(k) for it in items] for k in ("segments", "duration", "id")}

    def sft_target(self, item: Mapping, meta: Mapping | None = None) -> str:
        """The reference answer of a prepared item: its first segment, one decimal."""
        s, e = item["segments"][0]
        return format_answer(s, e)

    # ------------------------------------------------------------------ metrics
    def rollout_metrics(self, items: Sequence[Mapping], samples: Sequence[Mapping]) -> dict[str, float]:
        """``monitor/parse_fail_rate`` and ``monitor/pred_length_frac`` (predicted length / duration: the
        "answer the whole video" hack drives it to 1) over ordered samples."""
        from mmrl.adapters.video.temporal_rewards import parse_segments

        pairs = [(it, s) for it, s in zip(per_sample_items(items, samples), samples) if not s.get("shuffled")]
        if not pairs:
            return self.load_metrics()
        fails, fracs = 0, []
        for it, s in pairs:
            parsed = parse_segments(s["text"], duration=it["duration"])
            if parsed.status == "failed":
                fails += 1
            else:
                a, b = parsed.segments[0]
                fracs.append((b - a) / it["duration"])
        out = {"monitor/parse_fail_rate": fails / len(pairs), **self.load_metrics()}
        if fracs:
            out["monitor/pred_length_frac"] = sum(fracs) / len(fracs)
        return out

    def eval_metrics(self, items: Sequence[Mapping], samples: list, per_fn: dict) -> dict[str, float]:
        """eval/miou, eval/R@0.3, eval/R@0.5, eval/R@0.7, eval/parse_fail_rate; eval/score = mIoU."""
        from mmrl.adapters.video.temporal_rewards import mean_iou, recall_at

        items = per_sample_items(items, samples)
        if not items:
            return {}
        ious, parsed = zip(
            *(first_segment_iou(s["text"], it["segments"], it["duration"]) for it, s in zip(items, samples))
        )
        miou = mean_iou(ious)
        out = {"eval/miou": miou, "eval/parse_fail_rate": 1.0 - sum(parsed) / len(parsed), "eval/score": miou}
        out.update({f"eval/{k}": v for k, v in recall_at(ious).items()})
        return out
