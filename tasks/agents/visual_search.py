"""`task=visual_search`: V*-style visual search with tools. A large image holds many small coloured tiles, each with a
digit; the question asks for the digit on one tile (named by its colour). The colours can be seen at the resolution
the model is given (``model.max_pixels``), the digits cannot: zooming on the tile (the built-in ``zoom`` tool, boxes in
the model family's frame) reveals it. See docs/tasks/visual_search.md.

Data: synthetic scenes generated on the fly from per-item seeds (no download), or V*-Bench / HR-Bench style JSONL
(``image``, ``question``, ``options``, ``answer``; :func:`load_search_jsonl`).

Rewards: ``answer`` (1.0 when the final answer, in ``<answer>`` tags or bare, is right); optional tool-use shaping
``zoom_iou`` (the best IoU of a zoom box with the target's box; ``task.zoom_iou_weight``, 0 by default); the over-turn
penalty under ``agent.over_turn=penalize``. Metrics: accuracy, tool-call rate, turns per trajectory, zoom IoU.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mmrl.errors import ConfigError
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import SkipItem, Task, TaskConfigBase

DATA_FORMATS = ("synthetic", "jsonl")
DIGITS = "0123456789"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_LETTERS = "ABCDEFGHIJ"


@dataclass
class VisualSearchConfig(TaskConfigBase):
    """V*-style visual search with a zoom tool (see docs/tasks/visual_search.md)."""

    name: str = "visual_search"
    """Task selector."""
    data_format: str = "synthetic"
    """synthetic (scenes drawn on the fly, no download) or jsonl (V*-Bench / HR-Bench style rows)."""
    data: str | None = None
    """jsonl: the training file (rows: image, question, options, answer; optional id, bbox)."""
    eval_data: str | None = None
    """jsonl: the evaluation file; None holds out the last num_eval rows of `data`."""
    num_train: int = 256
    """synthetic: training scenes."""
    num_eval: int = 32
    """Evaluation items (synthetic scenes, or rows held out of `data`)."""
    seed: int = 0
    """synthetic: seed of the training scenes."""
    eval_seed: int = 1
    """synthetic: seed of the evaluation scenes (unseen in training)."""
    image_size: list[int] = field(default_factory=lambda: [384, 384])
    """synthetic: [W, H] of a scene; the model sees it shrunk to model.max_pixels."""
    num_tiles: int = 6
    """synthetic: tiles per scene (each a distinct colour, at most 8)."""
    tile_size: int = 22
    """synthetic: side of a tile in pixels of the scene (its digit is about 2/3 of it)."""
    think: bool = False
    """Ask for <think>...</think> before the answer."""
    answer_weight: float = 1.0
    """Weight of the final-answer reward (reward/answer)."""
    sft_zoom: bool = True
    """Warm start (trainer.warm_start.steps): the target trajectory zooms on the target's box, then answers; false: it answers
    at once (the no-tool baseline's warm start)."""
    zoom_margin: float = 1.0
    """Warm start: the target zoom box is the target's box grown by this many box sizes on each side (clipped)."""
    zoom_iou_weight: float = 0.0
    """Weight of the tool-use shaping reward (reward/zoom_iou: best IoU of a zoom box with the target's box). Off by
    default: the answer alone is the objective."""

    def validate(self) -> None:
        if self.data_format not in DATA_FORMATS:
            raise ConfigError(f"task.data_format: {self.data_format!r} is not valid; choose from synthetic, jsonl")
        if self.data_format == "jsonl" and not self.data:
            raise ConfigError("task.data: data_format=jsonl needs a data file (task.data=PATH)")
        if self.data_format == "synthetic" and (self.data or self.eval_data):
            raise ConfigError(
                "task.data_format=synthetic ignores task.data / task.eval_data; set task.data_format=jsonl"
            )
        if len(self.image_size) != 2 or min(self.image_size) < 64:
            raise ConfigError(f"task.image_size: give [W, H] with sides >= 64, got {self.image_size}")
        if not 1 <= self.num_tiles <= 8:
            raise ConfigError(f"task.num_tiles must be in 1..8 (one colour each), got {self.num_tiles}")
        if not 8 <= self.tile_size <= min(self.image_size) // 3:
            raise ConfigError(f"task.tile_size must be in 8..{min(self.image_size) // 3} pixels, got {self.tile_size}")
        if self.num_train < 1 or self.num_eval < 0:
            raise ConfigError("task.num_train must be >= 1 and task.num_eval >= 0")
        if not 0.0 <= self.zoom_margin <= 10.0:
            raise ConfigError(f"task.zoom_margin must be in [0, 10] box sizes, got {self.zoom_margin}")


# ----------------------------------------------------------------------------- synthetic scenes


def draw_scene(seed: int, size: Sequence[int], num_tiles: int, tile: int) -> tuple[Any, list[dict]]:
    """A scene of ``num_tiles`` non-overlapping tiles of distinct colours, each with a digit, on a light noisy
    background; returns the PIL image and the tiles (``color``, ``digit``, ``bbox`` xyxy in pixels). Deterministic in
    ``seed``."""
    from PIL import Image, ImageDraw, ImageFont

    from mmrl.adapters.grounding.synthetic_scenes import PALETTE

    rng = np.random.default_rng(seed)
    w, h = int(size[0]), int(size[1])
    bg = rng.integers(205, 235, size=(h, w, 3), dtype=np.uint8)
    img = Image.fromarray(bg, "RGB")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=max(6, int(tile * 0.7)))
    colors = [str(c) for c in rng.permutation(list(PALETTE))[:num_tiles]]
    tiles: list[dict] = []
    for color in colors:
        for _ in range(200):
            x, y = int(rng.integers(2, w - tile - 2)), int(rng.integers(2, h - tile - 2))
            box = [x, y, x + tile, y + tile]
            if all(
                box[2] + 4 <= t["bbox"][0]
                or t["bbox"][2] + 4 <= box[0]
                or box[3] + 4 <= t["bbox"][1]
                or t["bbox"][3] + 4 <= box[1]
                for t in tiles
            ):
                break
        else:
            raise RuntimeError(f"visual_search: cannot place {num_tiles} tiles of {tile}px in {w}x{h}")
        digit = DIGITS[int(rng.integers(0, 10))]
        rgb = PALETTE[color]
        draw.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=rgb)
        ink = (255, 255, 255) if sum(rgb) < 450 else (0, 0, 0)
        draw.text(((box[0] + box[2]) / 2, (box[1] + box[3]) / 2), digit, fill=ink, font=font, anchor="mm")
        tiles.append({"color": color, "digit": digit, "bbox": [float(v) for v in box]})
    return img, tiles


def build_question(question: str, options: Sequence[str] | None, *, think: bool) -> str:
    """The user text: the question, the lettered options when given, and the answer format."""
    parts = [" ".join(str(question).split())]
    if options:
        parts.append("Options: " + " ".join(f"({_LETTERS[i]}) {o}" for i, o in enumerate(options)))
        fmt = "the option's letter"
    else:
        fmt = "the answer"
    parts.append(
        "You can zoom into the image with the zoom tool when details are too small to read. "
        + ("Think in <think> </think> tags, then give " if think else "Give ")
        + f"{fmt} in <answer> </answer> tags."
    )
    return " ".join(parts)


# ----------------------------------------------------------------------------- JSONL data


def load_search_jsonl(path: str | Path) -> list[dict]:
    """Rows of a V*-Bench / HR-Bench style JSONL: ``image`` (a path, relative to the file), ``question`` (or ``text``),
    ``answer`` (or ``label``), optional ``options`` (list of strings; then ``answer`` is a letter or an option's text),
    ``id``, ``bbox`` ([x1, y1, x2, y2] target box in pixels, for the zoom IoU). A malformed row is one ConfigError line
    ``FILE:LINE: reason``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"visual_search data {path}: file not found")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{where}: not a JSON object ({e})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
        question = row.get("question", row.get("text"))
        answer = row.get("answer", row.get("label"))
        options = row.get("options", row.get("choices"))
        image = row.get("image")
        if not isinstance(image, str) or not image:
            raise ConfigError(f"{where}: 'image' must be a path string")
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"{where}: 'question' (or 'text') must be a non-empty string")
        if not isinstance(answer, (str, int)) or isinstance(answer, bool) or not str(answer).strip():
            raise ConfigError(f"{where}: 'answer' (or 'label') must be a non-empty string")
        if options is not None and (
            not isinstance(options, list)
            or not 2 <= len(options) <= len(_LETTERS)
            or not all(isinstance(o, str) for o in options)
        ):
            raise ConfigError(f"{where}: 'options' must be a list of 2 to {len(_LETTERS)} strings")
        bbox = row.get("bbox")
        if bbox is not None and (
            not isinstance(bbox, list)
            or len(bbox) != 4
            or not all(isinstance(v, (int, float)) for v in bbox)
            or bbox[2] <= bbox[0]
            or bbox[3] <= bbox[1]
        ):
            raise ConfigError(f"{where}: 'bbox' must be [x1, y1, x2, y2] pixels with x1 < x2 and y1 < y2")
        answer = str(answer).strip()
        if options and answer.upper() not in _LETTERS[: len(options)] and answer not in options:
            raise ConfigError(f"{where}: 'answer' {answer!r} is neither an option letter nor one of the options")
        img_path = Path(image) if Path(image).is_absolute() else path.parent / image
        rows.append(
            {
                "id": str(row.get("id", f"{path.stem}:{n}")),
                "image": str(img_path),
                "question": question,
                "options": list(options) if options else None,
                "answer": answer,
                "target_box": [float(v) for v in bbox] if bbox is not None else None,
            }
        )
    if not rows:
        raise ConfigError(f"visual_search data {path}: no rows")
    return rows


# ----------------------------------------------------------------------------- scoring


def final_answer(text: Any) -> str:
    """The answer of a final turn: the last ``<answer>`` block's content, else the whole text; stripped, with
    surrounding brackets and a trailing full stop removed."""
    if not isinstance(text, str):
        return ""
    found = _ANSWER.findall(text)
    ans = (found[-1] if found else text).strip()
    return ans.strip("()[]. ").strip()


def is_correct(pred: str, answer: str, options: Sequence[str] | None) -> bool:
    """Case-insensitive match of ``pred`` with the answer; with options, a letter and its option's text are the same
    answer."""

    def canon(x: str) -> str:
        x = x.strip().lower()
        if options:
            letter = x.upper()
            if len(letter) == 1 and letter in _LETTERS[: len(options)]:
                return options[_LETTERS.index(letter)].strip().lower()
        return x

    return bool(pred) and canon(pred) == canon(answer)


def zoom_boxes(sample: dict) -> list[list[float]]:
    """The boxes (original pixels) of a trajectory's successful zoom calls."""
    return [
        c["info"]["zoom_box"]
        for c in sample.get("tool_calls", [])
        if c.get("error") is None and "zoom_box" in c.get("info", {})
    ]


def best_zoom_iou(sample: dict, target_box: Sequence[float] | None) -> float | None:
    """The best IoU of a zoom box with ``target_box`` (0.0 without a zoom); None without a target box."""
    if target_box is None:
        return None
    from mmrl.adapters.grounding.rewards import iou

    boxes = zoom_boxes(sample)
    return max((float(iou(b, target_box)) for b in boxes), default=0.0)


def search_metrics(items: Sequence[dict], samples: Sequence[dict], prefix: str) -> dict[str, float]:
    """accuracy, tool_call_rate, turns, zoom_iou (mean best zoom IoU over items with a target box), zoom_iou_when_used
    (over trajectories that zoomed), over_turn_frac."""
    n = max(1, len(samples))
    correct = [
        is_correct(final_answer(s.get("text")), it["answer"], it.get("options")) for it, s in zip(items, samples)
    ]
    ious = [best_zoom_iou(s, it.get("target_box")) for it, s in zip(items, samples)]
    scored = [v for v in ious if v is not None]
    used = [v for v, s in zip(ious, samples) if v is not None and zoom_boxes(s)]
    return {
        f"{prefix}/accuracy": sum(correct) / n,
        f"{prefix}/tool_call_rate": sum(s.get("num_tool_calls", 0) > 0 for s in samples) / n,
        f"{prefix}/turns": sum(s.get("num_turns", 1) for s in samples) / n,
        f"{prefix}/zoom_iou": float(np.mean(scored)) if scored else 0.0,
        f"{prefix}/zoom_iou_when_used": float(np.mean(used)) if used else 0.0,
        f"{prefix}/over_turn_frac": sum(bool(s.get("over_turn")) for s in samples) / n,
    }


# ----------------------------------------------------------------------------- the task


class VisualSearchTask(Task):
    """Visual search with a zoom tool: answer about a small object after zooming on it."""

    name = "visual_search"
    description = "V*-style visual search (multi-turn, zoom tool): read a small tile's digit; synthetic by default."
    config_cls = VisualSearchConfig
    model_types = ("vlm_agent",)

    def __init__(self, cfg: VisualSearchConfig, run_cfg: Any = None) -> None:
        super().__init__(cfg, run_cfg)
        if cfg.data_format == "jsonl":
            for key in ("data", "eval_data"):
                p = getattr(cfg, key)
                if p and not Path(p).expanduser().is_file():
                    raise ConfigError(f"task.{key}={p}: file not found")

    def policy_spec(self):
        from mmrl.policies.base import PolicySpec

        return PolicySpec(task_name=self.name, extras={"agent_tools": ["zoom"]})

    def build_items(self, split: str) -> list[dict]:
        cfg = self.cfg
        if cfg.data_format == "jsonl":
            rows = load_search_jsonl(cfg.data if split == "train" or cfg.eval_data is None else cfg.eval_data)
            if cfg.eval_data is None:
                if len(rows) <= cfg.num_eval:
                    raise ConfigError(
                        f"task.data has {len(rows)} rows: too few to hold out task.num_eval={cfg.num_eval}"
                    )
                cut = len(rows) - cfg.num_eval
                rows = rows[:cut] if split == "train" else rows[cut:]
            return [{**r, "prompt": build_question(r["question"], r["options"], think=cfg.think)} for r in rows]
        n, seed = (cfg.num_train, cfg.seed) if split == "train" else (cfg.num_eval, cfg.eval_seed)
        rng = np.random.default_rng(seed)
        items = []
        for k in range(n):
            scene_seed = int(rng.integers(0, 2**31 - 1))
            _, tiles = draw_scene(scene_seed, cfg.image_size, cfg.num_tiles, cfg.tile_size)
            target = tiles[int(np.random.default_rng(scene_seed + 1).integers(0, len(tiles)))]
            question = f"What digit is written on the {target['color']} tile?"
            items.append(
                {
                    "id": f"{split}-{k}",
                    "scene_seed": scene_seed,
                    "question": question,
                    "prompt": build_question(question, None, think=cfg.think),
                    "options": None,
                    "answer": target["digit"],
                    "target_box": target["bbox"],
                }
            )
        return items

    def prepare_item(self, item: dict) -> dict:
        """The item with its image: the synthetic scene drawn from its seed, or the JSONL row's file decoded."""
        out = dict(item)
        if "scene_seed" in item:
            out["image"], _ = draw_scene(
                item["scene_seed"], self.cfg.image_size, self.cfg.num_tiles, self.cfg.tile_size
            )
            return out
        from mmrl.data.media import MediaError, load_image

        try:
            out["image"] = load_image(item["image"])
        except MediaError as exc:
            raise SkipItem(f"{exc.path}: {exc.reason}") from exc
        return out

    def sft_target(self, item: dict, meta: dict | None = None) -> str | list[str]:
        """The warm-start target of a prepared item: ``[zoom call on the target, "<answer>...</answer>"]`` with the box
        in the model's frame (``meta``: ``box_frame``, ``input_size`` from the policy), or only the answer turn
        (``task.sft_zoom=false``, or no target box)."""
        final = f"<answer>{item['answer']}</answer>"
        if self.cfg.think:
            final = "<think>I read it in the zoomed view.</think>" + final
        box = item.get("target_box")
        if not self.cfg.sft_zoom or box is None:
            return final
        from mmrl.adapters.grounding.coords import clip_boxes, convert_boxes, format_box

        meta = dict(meta or {})
        frame = meta.get("box_frame") or "pixels"
        size = item["image"].size
        x1, y1, x2, y2 = box
        m = self.cfg.zoom_margin
        grown = clip_boxes([[x1 - m * (x2 - x1), y1 - m * (y2 - y1), x2 + m * (x2 - x1), y2 + m * (y2 - y1)]], size)
        in_frame = convert_boxes(grown, "pixels", frame, orig_size=size, input_size=meta.get("input_size"))
        call = json.dumps({"name": "zoom", "arguments": {"bbox_2d": format_box(in_frame[0], frame)}})
        return [f"<tool_call>{call}</tool_call>", final]

    def reward_specs(self) -> list[RewardSpec]:
        """answer (answer_weight), zoom_iou (zoom_iou_weight, when > 0), over_turn (agent.over_turn=penalize)."""
        from mmrl.agents.rewards import over_turn_specs

        def answer(prompts, completions, answer=None, options=None, **_) -> list[float]:
            """1.0 when the trajectory's final answer is right."""
            opts = options or [None] * len(completions)
            return [float(is_correct(final_answer(c.get("text")), a, o)) for c, a, o in zip(completions, answer, opts)]

        def zoom_iou(prompts, completions, target_box=None, **_) -> list[float | None]:
            """Best IoU of a zoom box with the target box (None, not scored, without a target box)."""
            return [best_zoom_iou(c, t) for c, t in zip(completions, target_box)]

        specs = [RewardSpec("answer", answer, self.cfg.answer_weight)]
        if self.cfg.zoom_iou_weight:
            specs.append(RewardSpec("zoom_iou", zoom_iou, self.cfg.zoom_iou_weight))
        agent = self.run_cfg.agent if self.run_cfg is not None else None
        return specs + (over_turn_specs(agent) if agent is not None else [])

    def reward_columns(self, items: Sequence[dict]) -> dict[str, list]:
        return {k: [it.get(k) for it in items] for k in ("answer", "options", "target_box", "id")}

    @staticmethod
    def _per_sample(items: Sequence[dict], samples: Sequence) -> list[dict]:
        from mmrl.tasks.video.common import per_sample_items

        return per_sample_items(items, samples)

    def rollout_metrics(self, items: Sequence[dict], samples: list) -> dict[str, float]:
        return search_metrics(self._per_sample(items, samples), samples, "search") if samples else {}

    def eval_metrics(self, items: Sequence[dict], samples: list, per_fn: dict) -> dict[str, float]:
        per_sample = self._per_sample(items, samples)
        out = search_metrics(per_sample, samples, "eval")
        out["eval/score"] = out["eval/accuracy"]
        if self.output_dir is not None:  # mmrl eval: the trajectories and their crops beside predictions.jsonl
            from mmrl.agents.outputs import write_trajectories

            write_trajectories(self.output_dir, per_sample, samples)
        return out
