"""`task=video_qa`: questions about a video, mixed question types, verifiable rewards.

Each item carries its own ``question_type`` (Video-R1 style mixed batches): ``multiple_choice``
(``options`` + letter ``answer``), ``numeric`` (number ``answer``; optional ``rel_tol`` /
``abs_tol`` or ``metric="mra"``), ``free_form`` (ROUGE-L) or ``exact``. The reward is
:func:`mmrl.adapters.video.qa_rewards.qa_reward` on the ``<answer>`` content (+ a format reward); eval reports
accuracy overall and per question type (``eval/score`` = accuracy). See docs/tasks/video.md.

Data: synthetic event videos by default (colour of the moving shape, multiple choice; number of
flashes of the square, numeric), or a JSONL file.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from mmrl.errors import ConfigError
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.video.common import (
    AnnotationError,
    VideoInputConfig,
    VideoTaskBase,
    VideoTaskConfig,
    finite_number,
    per_sample_items,
    read_jsonl,
    synthetic_video_folder,
)

DATA_FORMATS: tuple[str, ...] = ("synthetic", "jsonl")
_LETTERS = "ABCDEFGHIJ"


@dataclass
class VideoQAConfig(VideoTaskConfig):
    """Video question answering with verifiable rewards (see docs/tasks/video.md).

    Data source, synthetic videos, ``video`` sampling and the format reward: :class:`VideoTaskConfig`.
    """

    DATA_FORMATS = DATA_FORMATS

    name: str = "video_qa"
    video: VideoInputConfig = field(default_factory=lambda: VideoInputConfig(fps=4.0, max_frames=16))
    """How videos are sampled (default: every frame of the 4 s synthetic videos, so no flash is missed)."""
    mover_scale: float = 0.12
    """synthetic: side of the moving triangle (the colour question's subject) as a fraction of the frame height."""
    option_order: str = "shuffled"
    """synthetic multiple choice: shuffled (each question lists the colours in its own order, so the answer letter must
    be looked up in the prompt) or fixed (always the palette order red, green, blue, yellow: the letter follows from
    the colour alone)."""
    accuracy_weight: float = 1.0
    """Weight of the answer reward (reward/accuracy)."""

    def validate(self) -> None:
        """Raise ConfigError on inconsistent settings."""
        super().validate()
        if self.option_order not in ("shuffled", "fixed"):
            raise ConfigError(f"task.option_order: {self.option_order!r} is not valid; choose from shuffled, fixed")
        if not math.isfinite(self.accuracy_weight):
            raise ConfigError("task.accuracy_weight must be a finite number")


# ----------------------------------------------------------------------------- prompts


def build_prompt(question: str, question_type: str, options: Sequence[str] | None = None) -> str:
    """The user text: question, lettered options (multiple choice) and the answer format."""
    q = question.strip()
    if question_type == "multiple_choice":
        lines = "\n".join(f"{_LETTERS[i]}. {o}" for i, o in enumerate(options or []))
        return f"{q}\n{lines}\nAnswer with the option letter in <answer></answer>."
    if question_type == "numeric":
        return f"{q} Answer with a number in <answer></answer>."
    return f"{q} Put the answer in <answer></answer>."


def format_answer(answer: Any) -> str:
    """``<answer>B</answer>`` / ``<answer>3</answer>`` (integers without a decimal point)."""
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    return f"<answer>{answer}</answer>"


def fixed_option_order(record: Mapping[str, Any]) -> dict:
    """A synthetic multiple-choice record with its options in palette order and the answer letter moved along."""
    from mmrl.adapters.video.synthetic import PALETTE

    chosen = record["options"][_LETTERS.index(record["answer"])]
    options = [c for c in PALETTE if c in record["options"]]
    return {**record, "options": options, "answer": _LETTERS[options.index(chosen)]}


# ----------------------------------------------------------------------------- loaders


def check_qa_record(rec: Mapping[str, Any], where: str) -> dict:
    """Validate one QA record and return the task fields; AnnotationError naming ``where`` otherwise.

    Needs ``question``, ``question_type`` (one of :data:`mmrl.adapters.video.qa_rewards.QUESTION_TYPES`) and
    ``answer``; multiple choice needs ``options`` (2..10 strings) and a letter answer among them
    (an answer equal to an option's text is turned into its letter); numeric needs a number.
    """
    from mmrl.adapters.video.qa_rewards import QUESTION_TYPES, _numeric_target

    question, qtype, answer = rec.get("question"), rec.get("question_type"), rec.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise AnnotationError(f"{where}: missing 'question'")
    if qtype not in QUESTION_TYPES:
        raise AnnotationError(f"{where}: question_type {qtype!r} is not one of {', '.join(QUESTION_TYPES)}")
    if answer is None:
        raise AnnotationError(f"{where}: missing 'answer'")
    out: dict[str, Any] = {"question": question.strip(), "question_type": qtype}
    if qtype == "multiple_choice":
        options = rec.get("options")
        if (
            not isinstance(options, list)
            or not 2 <= len(options) <= len(_LETTERS)
            or not all(isinstance(o, str) and o.strip() for o in options)
        ):
            raise AnnotationError(f"{where}: multiple_choice needs 'options': a list of 2..{len(_LETTERS)} strings")
        letter = str(answer).strip()
        if letter in options and not (len(letter) == 1 and letter.upper() in _LETTERS[: len(options)]):
            letter = _LETTERS[options.index(letter)]
        if len(letter) != 1 or letter.upper() not in _LETTERS[: len(options)]:
            raise AnnotationError(f"{where}: answer {answer!r} is not an option letter A..{_LETTERS[len(options) - 1]}")
        out.update(options=list(options), answer=letter.upper())
    elif qtype == "numeric":
        try:
            _numeric_target(answer)
        except ValueError:
            raise AnnotationError(f"{where}: numeric answer {answer!r} is not a number") from None
        out["answer"] = answer
        for key in ("rel_tol", "abs_tol"):
            if rec.get(key) is not None:
                value = finite_number(rec[key])
                if value is None or value < 0:
                    raise AnnotationError(f"{where}: '{key}' must be a number >= 0")
                out[key] = value
        if rec.get("metric") is not None:
            if rec["metric"] not in ("tolerance", "mra"):
                raise AnnotationError(f"{where}: metric {rec['metric']!r} is not one of tolerance, mra")
            out["metric"] = rec["metric"]
    else:
        out["answer"] = str(answer)
    return out


def load_video_qa_jsonl(path: str | Path, video_root: str | Path | None = None) -> list[dict]:
    """Video QA JSONL -> task records: ``video`` (path, relative to ``video_root`` or the file's folder),
    the fields of :func:`check_qa_record`, optional ``id``, ``clip_start`` / ``clip_end``.

    Raises FileNotFoundError / AnnotationError (``file:line``)."""
    path = Path(path)
    root = Path(video_root) if video_root else path.parent
    out = []
    for n, rec in read_jsonl(path):
        where = f"{path}:{n}"
        video = rec.get("video")
        if not isinstance(video, str) or not video:
            raise AnnotationError(f"{where}: missing 'video' (a path)")
        item = check_qa_record(rec, where)
        item.update(
            video=str(Path(video) if Path(video).is_absolute() else root / video),
            id=str(rec.get("id", f"{path.stem}:{n}")),
            source=where,
        )
        for key in ("clip_start", "clip_end"):
            if rec.get(key) is not None:
                value = finite_number(rec[key])
                if value is None or value < 0:
                    raise AnnotationError(f"{where}: '{key}' must be a finite number >= 0")
                item[key] = value
        out.append(item)
    return out


# ----------------------------------------------------------------------------- rewards


def accuracy_reward(
    prompts, completions, question_type, answer, options=None, *, format_gate: bool = False, **columns
) -> list[float | None]:
    """:func:`mmrl.adapters.video.qa_rewards.qa_reward` per sample, dispatched on its ``question_type``; with
    ``format_gate`` a completion that fails :func:`mmrl.rewards.format.is_clean_answer` scores 0."""
    from mmrl.adapters.video.qa_rewards import qa_reward
    from mmrl.rewards.format import is_clean_answer

    n = len(completions)
    options = options if options is not None else [None] * n
    extra = {k: v for k, v in columns.items() if k in ("rel_tol", "abs_tol", "metric")}
    out = []
    for i, c in enumerate(completions):
        if format_gate and not is_clean_answer(c["text"], bool(c.get("truncated"))):
            out.append(0.0)
            continue
        sample = {"question_type": question_type[i], "answer": answer[i], "options": options[i]}
        sample.update({k: v[i] for k, v in extra.items() if v[i] is not None})
        out.append(qa_reward(c["text"], sample))
    return out


def qa_format_reward(prompts, completions, **_) -> list[float]:
    """1.0 when :func:`mmrl.rewards.format.is_clean_answer`, else 0.0."""
    from mmrl.rewards.format import is_clean_answer

    return [1.0 if is_clean_answer(c["text"], bool(c.get("truncated"))) else 0.0 for c in completions]


# ----------------------------------------------------------------------------- the task


class VideoQATask(VideoTaskBase):
    """Video QA with per-sample question types (multiple choice, numeric, free form, exact)."""

    name = "video_qa"
    description = "Video QA (Qwen-VL): mixed multiple-choice / numeric questions, qa_reward by question_type; synthetic videos by default."
    config_cls = VideoQAConfig

    def _records(self, split: str) -> list[dict]:
        cfg = self.cfg
        if cfg.data_format == "synthetic":
            from mmrl.adapters.video.synthetic import make_video_dataset

            n, seed = (cfg.num_train, cfg.seed) if split == "train" else (cfg.num_eval, cfg.eval_seed)
            recs = make_video_dataset(
                synthetic_video_folder("qa"),
                n,
                seed,
                "qa",
                duration_s=cfg.video_duration_s,
                fps=cfg.video_fps,
                size=tuple(cfg.video_size),
                event_grid=cfg.event_grid,
                event_scale=cfg.event_scale,
                mover_scale=cfg.mover_scale,
            )
            out = []
            for r in recs:
                if cfg.option_order == "fixed" and r["question_type"] == "multiple_choice":
                    r = fixed_option_order(r)
                item = check_qa_record(r, r["video"])
                item.update(video=r["video"], id=r["id"], source=r["video"])
                out.append(item)
            return out
        path = cfg.data if split == "train" or cfg.eval_data is None else cfg.eval_data
        recs = load_video_qa_jsonl(path, cfg.video_root)
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
        return self.finish_items(
            [
                {**r, "prompt": build_prompt(r["question"], r["question_type"], r.get("options"))}
                for r in self._records(split)
            ],
            split,
        )

    def reward_specs(self) -> list[RewardSpec]:
        """accuracy (accuracy_weight) + format (format_weight)."""
        accuracy = functools.partial(accuracy_reward, format_gate=self.cfg.format_gate)
        return [
            RewardSpec("accuracy", accuracy, self.cfg.accuracy_weight),
            RewardSpec("format", qa_format_reward, self.cfg.format_weight),
        ]

    def reward_columns(self, items: Sequence[dict]) -> dict[str, list]:
        """Ground truth the rewards read (every item gets every key; missing ones are None)."""
        keys = ("question_type", "answer", "options", "rel_tol", "abs_tol", "metric", "id")
        return {k: [it.get(k) for it in items] for k in keys}

    def sft_target(self, item: Mapping, meta: Mapping | None = None) -> str:
        """``<answer>{answer}</answer>``."""
        return format_answer(item["answer"])

    def rollout_metrics(self, items: Sequence[Mapping], samples: Sequence[Mapping]) -> dict[str, float]:
        """``monitor/no_answer_rate``: ordered samples without an ``<answer>`` block."""
        from mmrl.parsing.tags import find_tag_content

        ordered = [s for s in samples if not s.get("shuffled")]
        if not ordered:
            return self.load_metrics()
        return {
            "monitor/no_answer_rate": sum(find_tag_content(s["text"], "answer") is None for s in ordered)
            / len(ordered),
            **self.load_metrics(),
        }

    def eval_metrics(self, items: Sequence[Mapping], samples: list, per_fn: dict) -> dict[str, float]:
        """eval/accuracy and eval/accuracy/<question_type> (a sample is correct when its answer reward
        is >= 0.5; for 1/0 rewards that is exact correctness); eval/score = accuracy."""
        items = per_sample_items(items, samples)
        if not items:
            return {}
        scores = accuracy_reward(
            [None] * len(samples),
            samples,
            [it.get("question_type") for it in items],
            [it.get("answer") for it in items],
            [it.get("options") for it in items],
            **{k: [it.get(k) for it in items] for k in ("rel_tol", "abs_tol", "metric")},
        )
        correct = [s is not None and s >= 0.5 for s in scores]
        acc = sum(correct) / len(correct)
        out = {"eval/accuracy": acc, "eval/score": acc}
        for qtype in sorted({it.get("question_type") for it in items}):
            idx = [i for i, it in enumerate(items) if it.get("question_type") == qtype]
            out[f"eval/accuracy/{qtype}"] = sum(correct[i] for i in idx) / len(idx)
        return out
