"""Image rewards for text-to-image RL, plus group helpers and a diversity monitor.

Reward functions follow the TRL contract ``fn(prompts, completions, **columns) -> list[float | None]``;
a completion is a PIL image or a dict with an ``"image"`` key (what the diffusion policy samples).

* :func:`jpeg_compressibility` / :func:`jpeg_incompressibility` — DDPO: ``-size_kB`` / ``+size_kB``
  of the image saved as JPEG at quality 95.
* :func:`color_rule_reward` — the synthetic default's rule: half the fraction of centre-region pixels
  within ``tol`` (RGB Euclidean distance) of the object colour, plus half the fraction of border
  pixels close to the background colour. 1.0 = a clean object in the centre on the right background.
* :func:`ocr_reward` — ``1 - min(edit, len) / len`` between the OCR'd text (pytesseract) and the
  target; needs the ``tesseract`` binary (:class:`MissingDependencyError` otherwise).
* :class:`CLIPScoreReward`, :class:`PickScoreReward`, :class:`AestheticReward` — model rewards loaded
  through transformers from a local path (or hub id); :class:`MissingWeightsError` names what is missing.
* :func:`group_normalized_sum` — MixGRPO's per-reward group normalisation, then a weighted sum.
* :func:`group_diversity` — mean pairwise RMS pixel distance of the images within each group
  (a reward-hacking / mode-collapse monitor).
"""

from __future__ import annotations

import io
import math
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "AestheticReward",
    "CLIPScoreReward",
    "ImageRewardError",
    "MissingDependencyError",
    "MissingWeightsError",
    "PickScoreReward",
    "color_rule_reward",
    "color_rule_score",
    "edit_distance",
    "group_diversity",
    "group_normalized_sum",
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "jpeg_size_kb",
    "ocr_reward",
    "ocr_score",
    "to_pil",
]


class ImageRewardError(ValueError):
    """A completion that is not an image, or bad reward arguments."""


class MissingDependencyError(RuntimeError):
    """An external program or package a reward needs is not installed."""


class MissingWeightsError(FileNotFoundError):
    """The weights of a model reward are not available locally (and cannot be downloaded)."""


# ---------------------------------------------------------------- inputs


def to_pil(completion: Any):
    """The PIL RGB image of a completion (a PIL image, a dict with ``"image"``, or an HxWx3 uint8 array)."""
    from PIL import Image

    img = completion.get("image") if isinstance(completion, dict) else completion
    if isinstance(img, Image.Image):
        return img.convert("RGB")
    if isinstance(img, np.ndarray) and img.ndim == 3 and img.shape[2] == 3:
        return Image.fromarray(img.astype(np.uint8))
    raise ImageRewardError(f"expected a PIL image, an HxWx3 array or a dict with 'image', got {type(img).__name__}")


def _rgb_array(completion: Any) -> np.ndarray:
    return np.asarray(to_pil(completion), dtype=np.float32)


# ---------------------------------------------------------------- JPEG (DDPO)


def jpeg_size_kb(image: Any, quality: int = 95) -> float:
    """Size in kB (1000 bytes) of the image saved as JPEG at ``quality``."""
    buf = io.BytesIO()
    to_pil(image).save(buf, format="JPEG", quality=quality)
    return buf.tell() / 1000.0


def jpeg_compressibility(prompts: Sequence[str], completions: Sequence[Any], **_: Any) -> list[float]:
    """DDPO compressibility: ``-size_kB`` at JPEG quality 95 (smaller files score higher)."""
    return [-jpeg_size_kb(c) for c in completions]


def jpeg_incompressibility(prompts: Sequence[str], completions: Sequence[Any], **_: Any) -> list[float]:
    """DDPO incompressibility: ``+size_kB`` at JPEG quality 95."""
    return [jpeg_size_kb(c) for c in completions]


# ---------------------------------------------------------------- colour rule (synthetic default)


def _rgb(color: Any) -> np.ndarray:
    if isinstance(color, str):
        from mmrl.adapters.grounding.synthetic_scenes import PALETTE

        if color not in PALETTE:
            raise ImageRewardError(f"unknown colour name {color!r}; known: {', '.join(PALETTE)}")
        color = PALETTE[color]
    arr = np.asarray(color, dtype=np.float32)
    if arr.shape != (3,):
        raise ImageRewardError(f"a colour is a name or an (r, g, b) triple, got {color!r}")
    return arr


def color_rule_score(
    image: Any,
    object_color: Any,
    background_color: Any,
    *,
    center_frac: float = 0.5,
    tol: float = 60.0,
    combine: str = "geometric",
) -> float:
    """Prompt adherence of a centred object on a background, from two pixel fractions.

    ``o`` = fraction of centre pixels near the object colour, ``b`` = fraction of border pixels near
    the background colour. ``combine="geometric"`` (default) returns ``sqrt(o * b)``: both parts must
    be right, so painting the whole image in the background colour scores 0. ``combine="mean"``
    returns ``0.5 o + 0.5 b``, which RL hacks exactly that way (background only = 0.5).

    The centre region is the middle ``center_frac`` of each side (e.g. pixels 8..23 of a 32-pixel
    side for 0.5); the border is everything else. "Near" = RGB Euclidean distance < ``tol``.
    """
    if not 0 < center_frac < 1:
        raise ImageRewardError(f"center_frac must be in (0, 1), got {center_frac}")
    if combine not in ("geometric", "mean"):
        raise ImageRewardError(f"combine must be 'geometric' or 'mean', got {combine!r}")
    arr = _rgb_array(image)
    h, w, _ = arr.shape
    y0, y1 = int(round(h * (1 - center_frac) / 2)), int(round(h * (1 + center_frac) / 2))
    x0, x1 = int(round(w * (1 - center_frac) / 2)), int(round(w * (1 + center_frac) / 2))
    centre = np.zeros((h, w), dtype=bool)
    centre[y0:y1, x0:x1] = True
    near_obj = np.linalg.norm(arr - _rgb(object_color), axis=2) < tol
    near_bg = np.linalg.norm(arr - _rgb(background_color), axis=2) < tol
    o, b = float(near_obj[centre].mean()), float(near_bg[~centre].mean())
    return float(np.sqrt(o * b)) if combine == "geometric" else 0.5 * o + 0.5 * b


def color_rule_reward(
    prompts: Sequence[str],
    completions: Sequence[Any],
    object_color: Sequence[Any],
    background_color: Sequence[Any],
    **_: Any,
) -> list[float]:
    """TRL wrapper of :func:`color_rule_score` (columns ``object_color``, ``background_color``: names or RGB)."""
    return [color_rule_score(c, o, b) for c, o, b in zip(completions, object_color, background_color)]


# ---------------------------------------------------------------- OCR


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _require_tesseract():
    if shutil.which("tesseract") is None:
        raise MissingDependencyError(
            "the OCR reward needs the tesseract binary: install it with `apt-get install tesseract-ocr` "
            "(and `pip install pytesseract`)"
        )
    try:
        import pytesseract
    except ImportError as e:
        raise MissingDependencyError("the OCR reward needs `pip install pytesseract`") from e
    return pytesseract


def ocr_score(recognised: str, target: str) -> float:
    """``1 - min(edit, len) / len`` between recognised and target text (spaces ignored, case-insensitive)."""
    t = "".join(target.lower().split())
    r = "".join(recognised.lower().split())
    if not t:
        raise ImageRewardError("the OCR target text is empty")
    return 1.0 - min(edit_distance(r, t), len(t)) / len(t)


def ocr_reward(prompts: Sequence[str], completions: Sequence[Any], target_text: Sequence[str], **_: Any) -> list[float]:
    """OCR reward (Flow-GRPO): tesseract reads each image, scored by :func:`ocr_score` against ``target_text``."""
    pytesseract = _require_tesseract()
    return [ocr_score(pytesseract.image_to_string(to_pil(c)), t) for c, t in zip(completions, target_text)]


# ---------------------------------------------------------------- model rewards


def _check_weights(path: str | Path, what: str) -> str:
    p = str(path)
    if Path(p).expanduser().exists():
        return p
    import os

    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    if offline or "/" not in p:
        raise MissingWeightsError(
            f"{what}: weights not found at {p!r}. Download them first (e.g. `hf download {p}` on a machine with "
            "hub access) and pass the local folder"
        )
    return p


def _load(loader, path: str, what: str):
    try:
        return loader(path)
    except (OSError, ValueError) as e:
        raise MissingWeightsError(f"{what}: could not load weights from {path!r} ({e})") from e


class _CLIPBased:
    """Shared CLIP loading and embedding (images and texts, L2-normalised)."""

    what = "CLIP reward"

    def __init__(self, model_path: str, processor_path: str | None = None, device: str = "cpu") -> None:
        from transformers import AutoProcessor, CLIPModel

        mp = _check_weights(model_path, self.what)
        pp = _check_weights(processor_path or model_path, self.what)
        self.model = _load(lambda p: CLIPModel.from_pretrained(p), mp, self.what).to(device).eval()
        self.processor = _load(lambda p: AutoProcessor.from_pretrained(p), pp, self.what)
        self.device = device

    @torch.no_grad()
    def embed(self, prompts: Sequence[str], completions: Sequence[Any]) -> tuple[Tensor, Tensor]:
        inputs = self.processor(
            text=list(prompts),
            images=[to_pil(c) for c in completions],
            return_tensors="pt",
            padding=True,
            truncation=True,
        ).to(self.device)
        img = self.model.get_image_features(pixel_values=inputs["pixel_values"])
        txt = self.model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        img = getattr(img, "pooler_output", img)
        txt = getattr(txt, "pooler_output", txt)
        return torch.nn.functional.normalize(img, dim=-1), torch.nn.functional.normalize(txt, dim=-1)


class CLIPScoreReward(_CLIPBased):
    """CLIP score: cosine similarity of image and prompt embeddings (e.g. openai/clip-vit-large-patch14)."""

    what = "CLIPScore reward"

    def __call__(self, prompts: Sequence[str], completions: Sequence[Any], **_: Any) -> list[float]:
        img, txt = self.embed(prompts, completions)
        return (img * txt).sum(-1).tolist()


class PickScoreReward(_CLIPBased):
    """PickScore: ``logit_scale * cos(image, prompt)`` with yuvalkirstain/PickScore_v1 (processor:
    laion/CLIP-ViT-H-14-laion2B-s32B-b79K)."""

    what = "PickScore reward"

    def __call__(self, prompts: Sequence[str], completions: Sequence[Any], **_: Any) -> list[float]:
        img, txt = self.embed(prompts, completions)
        return (self.model.logit_scale.exp() * (img * txt).sum(-1)).tolist()


class AestheticReward(_CLIPBased):
    """LAION aesthetic predictor v2: an MLP (768-1024-128-64-16-1) on normalised CLIP ViT-L/14 image
    embeddings. ``mlp_path`` is the ``sac+logos+ava1-l14-linearMSE.pth`` state dict."""

    what = "aesthetic reward"

    def __init__(self, clip_path: str, mlp_path: str, device: str = "cpu") -> None:
        if not Path(mlp_path).expanduser().exists():
            raise MissingWeightsError(
                f"{self.what}: MLP weights not found at {mlp_path!r} "
                "(sac+logos+ava1-l14-linearMSE.pth from the LAION aesthetic predictor)"
            )
        super().__init__(clip_path, device=device)
        dims = [768, 1024, 128, 64, 16, 1]
        layers: list[torch.nn.Module] = []
        for a, b in zip(dims, dims[1:]):
            layers.append(torch.nn.Linear(a, b))
        self.mlp = torch.nn.Sequential(*layers).to(device).eval()
        state = torch.load(mlp_path, map_location=device)
        # The original checkpoint names its Linear layers layers.0/2/4/6/7 (dropouts in between).
        linear = [k for k in state if k.endswith(".weight")]
        remap = {}
        for i, k in enumerate(linear):
            remap[f"{i}.weight"] = state[k]
            remap[f"{i}.bias"] = state[k[: -len("weight")] + "bias"]
        self.mlp.load_state_dict(remap)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[str], completions: Sequence[Any], **_: Any) -> list[float]:
        inputs = self.processor(images=[to_pil(c) for c in completions], return_tensors="pt").to(self.device)
        img = self.model.get_image_features(pixel_values=inputs["pixel_values"])
        img = torch.nn.functional.normalize(getattr(img, "pooler_output", img), dim=-1)
        return self.mlp(img).squeeze(-1).tolist()


# ---------------------------------------------------------------- group helpers


def group_normalized_sum(
    per_fn: dict[str, Tensor],
    weights: dict[str, float],
    group_ids: Tensor,
    valid: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """MixGRPO combination: ``sum_k w_k (r_k - mean_g(r_k)) / (std_g(r_k) + eps)`` (GRPO normalisation per reward)."""
    from mmrl.algos.advantages import grpo

    missing = set(weights) - set(per_fn)
    if missing:
        raise ImageRewardError(f"weights name rewards that were not computed: {sorted(missing)}")
    total = torch.zeros_like(group_ids, dtype=torch.float32)
    for name, w in weights.items():
        r = per_fn[name].float()
        ok = torch.isfinite(r) if valid is None else (valid & torch.isfinite(r))
        total = total + w * grpo(torch.nan_to_num(r), group_ids, ok, eps=eps, scale="group")
    return total


def group_diversity(images: Sequence[Any], group_ids: Sequence[int] | Tensor) -> float:
    """Mean over groups (of >= 2 images) of the mean pairwise RMS distance between their images.

    An image is an RGB array scaled to [0, 1]; the distance of a pair is ``||a - b||_2 / sqrt(D)``
    (D = H*W*3), so 0 = identical images and 1 = black vs white. NaN when no group has two images.
    """
    gids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(gids) != len(images):
        raise ImageRewardError(f"{len(images)} images but {len(gids)} group ids")
    by_group: dict[int, list[np.ndarray]] = {}
    for img, g in zip(images, gids):
        by_group.setdefault(int(g), []).append(_rgb_array(img).ravel() / 255.0)
    means = []
    for arrs in by_group.values():
        if len(arrs) < 2:
            continue
        x = np.stack(arrs)
        d = [np.sqrt(((x[i] - x[j]) ** 2).mean()) for i in range(len(x)) for j in range(i + 1, len(x))]
        means.append(float(np.mean(d)))
    return float(np.mean(means)) if means else math.nan
