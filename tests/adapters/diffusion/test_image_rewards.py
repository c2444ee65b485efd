"""Image rewards: JPEG size, colour rule, OCR score, model-reward errors, group helpers, diversity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.adapters.diffusion import image_rewards as ir
from mmrl.rewards.manager import RewardManager, RewardSpec

RED, BLUE, GREEN = (220, 40, 40), (40, 80, 220), (40, 170, 60)


def _flat(rgb, size=32):
    return Image.new("RGB", (size, size), rgb)


def _noise(size=32, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


# ---------------------------------------------------------------- JPEG


def test_jpeg_noise_is_less_compressible_than_flat():
    flat, noise = _flat(RED), _noise()
    comp = ir.jpeg_compressibility(["p", "p"], [flat, {"image": noise}])
    assert comp[0] > comp[1]  # -size: the flat image is smaller
    assert ir.jpeg_incompressibility(["p", "p"], [flat, noise]) == [-c for c in comp]
    # size in kB = bytes / 1000, independently measured
    import io

    buf = io.BytesIO()
    noise.save(buf, format="JPEG", quality=95)
    assert ir.jpeg_size_kb(noise) == pytest.approx(buf.tell() / 1000)


def test_not_an_image_is_a_clear_error():
    with pytest.raises(ir.ImageRewardError, match="PIL image"):
        ir.jpeg_size_kb("not an image")


# ---------------------------------------------------------------- colour rule


def _scene(size=8):
    """8x8 blue background with a red 4x4 centre (rows/cols 2..5 = the middle half)."""
    arr = np.zeros((size, size, 3), dtype=np.uint8)
    arr[:] = BLUE
    arr[2:6, 2:6] = RED
    return arr


def test_color_rule_geometric_default_blocks_the_background_hack():
    arr = _scene()
    assert ir.color_rule_score(arr, "red", "blue") == pytest.approx(1.0)
    arr2 = arr.copy()
    arr2[2:4, 2:6] = GREEN  # centre 8/16 red, border all blue -> sqrt(0.5 * 1)
    assert ir.color_rule_score(arr2, RED, BLUE) == pytest.approx(0.5**0.5)
    all_bg = np.zeros_like(arr) + np.array(BLUE, dtype=arr.dtype)  # background painted everywhere
    assert ir.color_rule_score(all_bg, RED, BLUE) == 0.0
    assert ir.color_rule_score(all_bg, RED, BLUE, combine="mean") == pytest.approx(0.5)
    with pytest.raises(ir.ImageRewardError, match="combine"):
        ir.color_rule_score(arr, RED, BLUE, combine="max")


def test_color_rule_mean_by_hand():
    arr = _scene()
    # perfect: 16/16 centre pixels red, 48/48 border pixels blue -> 0.5 * 1 + 0.5 * 1
    assert ir.color_rule_score(arr, "red", "blue", combine="mean") == pytest.approx(1.0)
    # half the centre green: 8/16 red -> 0.5 * 0.5 + 0.5 * 1 = 0.75
    arr2 = arr.copy()
    arr2[2:4, 2:6] = GREEN
    assert ir.color_rule_score(arr2, RED, BLUE, combine="mean") == pytest.approx(0.75)
    # the first border row red too: border blue 40/48 -> 0.5 * 0.5 + 0.5 * 40/48
    arr2[0, :] = RED
    assert ir.color_rule_score(arr2, RED, BLUE, combine="mean") == pytest.approx(0.25 + 0.5 * 40 / 48)
    # wrong prompt colours: nothing matches green object / red background except row 0 (8 of 48 border px)
    assert ir.color_rule_score(arr, "green", "red", combine="mean") == pytest.approx(0.0)
    # tolerance: a pixel at distance 50 counts with tol 60, not with tol 40
    near = np.array(_scene())
    near[2:6, 2:6] = (220, 40, 90)  # 50 away from RED in blue
    assert ir.color_rule_score(near, RED, BLUE, tol=60, combine="mean") == pytest.approx(1.0)
    assert ir.color_rule_score(near, RED, BLUE, tol=40, combine="mean") == pytest.approx(0.5)


def test_color_rule_reward_wrapper_and_errors():
    out = ir.color_rule_reward(
        ["a", "b"], [{"image": _scene()}, _scene()], object_color=["red", "blue"], background_color=["blue", "red"]
    )
    assert out == pytest.approx([1.0, 0.0])
    with pytest.raises(ir.ImageRewardError, match="unknown colour"):
        ir.color_rule_score(_scene(), "mauve", "blue")
    with pytest.raises(ir.ImageRewardError, match="center_frac"):
        ir.color_rule_score(_scene(), "red", "blue", center_frac=1.5)


# ---------------------------------------------------------------- OCR


def test_edit_distance_and_ocr_score():
    assert ir.edit_distance("kitten", "sitting") == 3  # k->s, e->i, +g
    assert ir.edit_distance("", "abc") == 3
    assert ir.ocr_score("helo", "hello") == pytest.approx(1 - 1 / 5)
    assert ir.ocr_score("Hello World", "helloworld") == pytest.approx(1.0)  # case and spaces ignored
    assert ir.ocr_score("zzzzzzzzzzzz", "abc") == 0.0  # edit 12 capped at len 3
    with pytest.raises(ir.ImageRewardError, match="empty"):
        ir.ocr_score("x", "  ")


def test_missing_tesseract_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ir.shutil, "which", lambda name: None)
    with pytest.raises(ir.MissingDependencyError, match="apt-get install tesseract-ocr"):
        ir.ocr_reward(["p"], [_flat(RED)], target_text=["hi"])


# ---------------------------------------------------------------- model rewards


def test_missing_model_weights_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = tmp_path / "no_such_clip"
    with pytest.raises(ir.MissingWeightsError, match="no_such_clip"):
        ir.CLIPScoreReward(str(missing))
    with pytest.raises(ir.MissingWeightsError, match="PickScore"):
        ir.PickScoreReward("yuvalkirstain/PickScore_v1", processor_path="laion/CLIP-ViT-H-14-laion2B-s32B-b79K")
    with pytest.raises(ir.MissingWeightsError, match="sac\\+logos"):
        ir.AestheticReward(str(missing), str(tmp_path / "mlp.pth"))
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(ir.MissingWeightsError, match="could not load"):
        ir.CLIPScoreReward(str(empty))


# ---------------------------------------------------------------- group helpers


def test_group_normalized_sum_by_hand():
    gid = torch.tensor([0, 0, 1, 1])
    per_fn = {"a": torch.tensor([1.0, 3.0, 5.0, 5.0]), "b": torch.tensor([0.0, 2.0, 1.0, 3.0])}
    out = ir.group_normalized_sum(per_fn, {"a": 1.0, "b": 0.5}, gid)  # eps 1e-6
    # a: group 0 mean 2, unbiased std sqrt(2) -> -/+ 1/sqrt(2); group 1 constant -> 0
    # b: each group (x - mean) = -/+1, std sqrt(2) -> -/+ 1/sqrt(2), weight 0.5
    s = 1 / math.sqrt(2)
    assert out.tolist() == pytest.approx([-s - 0.5 * s, s + 0.5 * s, -0.5 * s, 0.5 * s], rel=1e-5)
    with pytest.raises(ir.ImageRewardError, match="not computed"):
        ir.group_normalized_sum(per_fn, {"c": 1.0}, gid)


def test_group_diversity_by_hand():
    black, white = np.zeros((4, 4, 3), np.uint8), np.full((4, 4, 3), 255, np.uint8)
    assert ir.group_diversity([black, white], [0, 0]) == pytest.approx(1.0)
    assert ir.group_diversity([black, black.copy()], [0, 0]) == pytest.approx(0.0)
    # group 0: pairs (b,w)=1, (b,b)=0, (w,b)=1 -> 2/3; group 1 has one image (ignored); group 2: identical -> 0
    imgs = [black, white, black, white, white, white]
    assert ir.group_diversity(imgs, torch.tensor([0, 0, 0, 1, 2, 2])) == pytest.approx((2 / 3 + 0.0) / 2)
    assert math.isnan(ir.group_diversity([black], [0]))
    with pytest.raises(ir.ImageRewardError, match="group ids"):
        ir.group_diversity([black, white], [0])


def test_reward_manager_isolates_an_image_that_fails():
    def picky(prompts, completions, **_):
        out = []
        for c in completions:
            if ir.to_pil(c).getpixel((0, 0)) == (0, 0, 0):
                raise RuntimeError("cannot score a black image")
            out.append(1.0)
        return out

    imgs = [{"image": _flat(RED)}, {"image": _flat((0, 0, 0))}, {"image": _flat(BLUE)}]
    mgr = RewardManager([RewardSpec("picky", picky), RewardSpec("jpeg", ir.jpeg_compressibility, 0.0)])
    res = mgr(["p"] * 3, imgs, {})
    assert res.valid.tolist() == [True, False, True]
    assert res.total.tolist() == pytest.approx([1.0, 0.0, 1.0])
    assert res.metrics["reward/picky/errors"] == 1.0
    assert torch.isfinite(res.per_fn["jpeg"]).all()


def test_ocr_reward_reads_rendered_text_with_real_tesseract():
    import shutil

    if shutil.which("tesseract") is None:
        pytest.skip("tesseract binary not installed (apt-get install tesseract-ocr)")
    from PIL import ImageDraw, ImageFont

    img = Image.new("RGB", (360, 90), "white")
    draw = ImageDraw.Draw(img)
    try:
        font = ImageFont.load_default(size=40)
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    draw.text((12, 20), "HELLO RL", fill="black", font=font)
    blank = Image.new("RGB", (360, 90), "white")
    scores = ir.ocr_reward(["p", "p"], [img, blank], target_text=["hello rl", "hello rl"])
    assert scores[0] >= 0.85, scores  # real OCR of clean rendered text
    assert scores[1] == 0.0  # nothing to read: edit distance = len
