"""`task=vqa_grounding`: frames, rewards, monitors, eval metrics, prompts, SFT targets and data loading.

No model: completions are hand-made dicts in the VLM policy's schema (text, length, truncated,
orig_size, input_size, family, box_frame). Expected values are worked out in the comments.
"""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import numpy as np
import pytest
from PIL import Image

from mmrl.adapters.grounding.boxes import parse_boxes
from mmrl.adapters.grounding.coords import FrameError, convert_boxes
from mmrl.adapters.grounding.data import DataFormatError
from mmrl.config import ConfigError
from mmrl.models.configs import VLMConfig
from mmrl.models.families import box_frame_for, smart_resize
from mmrl.rewards.manager import RewardManager
from mmrl.tasks.base import SkipItem
from mmrl.tasks.grounding.vqa_grounding import VQAGroundingConfig, VQAGroundingTask
from mmrl.tasks.grounding.vqa_grounding.prompts import answer_frame, build_prompt, sft_target
from mmrl.tasks.grounding.vqa_grounding.rewards import (
    GroundingRewardSettings,
    answer_schema_ok,
    grounding_eval_metrics,
    make_duplicate_reward,
    make_format_reward,
    make_grounding_reward,
    predicted_pixels,
    rollout_monitors,
    score_boxes,
)
from mmrl.tasks.grounding.vqa_grounding.task import model_family_of, resolve_answer_frame

W, H = 640, 480
INPUT_25 = (644, 476)  # smart_resize(480, 640, factor=28): round(640/28)=23 -> 644, round(480/28)=17 -> 476
GT = [64.0, 48.0, 320.0, 240.0]
FRAME_OF = {"qwen2_vl": "norm1000", "qwen2_5_vl": "input_pixels", "qwen3_vl": "norm1000"}


def completion(text, family="qwen2_5_vl", *, orig=(W, H), inp=INPUT_25, truncated=False, length=20):
    return {
        "text": text,
        "length": length,
        "truncated": truncated,
        "orig_size": orig,
        "input_size": inp,
        "family": family,
        "box_frame": FRAME_OF[family],
    }


def answer(*boxes, label="thing"):
    return json.dumps([{"bbox_2d": list(b), "label": label} for b in boxes])


def iou_ref(a, b):
    """Independent IoU for the checks below."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def grounding(completions, gts, frames, sizes, **kw):
    fn = make_grounding_reward(GroundingRewardSettings(**kw))
    return fn([""] * len(completions), completions, gt_boxes=gts, answer_frame=frames, image_size=sizes)


# ----------------------------------------------------------------------------- frames


def test_input_size_assumed_by_these_tests_is_qwens():
    assert smart_resize(H, W, factor=28, min_pixels=4 * 784, max_pixels=16384 * 784) == (476, 644)
    assert box_frame_for("qwen2_5_vl") == "input_pixels" and box_frame_for("qwen3_vl") == "norm1000"


def test_qwen2_5_input_pixel_answer_equal_to_gt_scores_one():
    # GT in input pixels: x * 644/640, y * 476/480 -> [64.4, 47.6, 322.0, 238.0].
    pred = [64.4, 47.6, 322.0, 238.0]
    r = grounding([completion(answer(pred))], [[GT]], ["input_pixels"], [(W, H)])
    assert r[0] == pytest.approx(1.0, abs=1e-9)


def test_same_numbers_in_the_wrong_frame_score_below_half():
    # Read as norm1000 instead: x * 640/1000, y * 480/1000 -> [41.216, 22.848, 206.08, 114.24].
    # Overlap with GT: x [64, 206.08] = 142.08, y [48, 114.24] = 66.24 -> 9411.38; union = 49152 +
    # 164.864 * 91.392 - 9411.38 = 54807.9 -> IoU 0.1717.
    pred = [64.4, 47.6, 322.0, 238.0]
    wrong = grounding([completion(answer(pred), "qwen2_vl")], [[GT]], ["norm1000"], [(W, H)])[0]
    assert wrong == pytest.approx(iou_ref([41.216, 22.848, 206.08, 114.24], GT)) and wrong == pytest.approx(
        0.1717, abs=1e-4
    )
    assert wrong < 0.5
    # Read as original pixels (no resize undone): IoU of [64.4, 47.6, 322, 238] with GT, still < 1.
    as_pixels = predicted_pixels({"text": answer(pred), "orig_size": (W, H)}, "pixels", (W, H))
    assert iou_ref(as_pixels.boxes[0], GT) < 1.0


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_norm1000_answer(family):
    # GT in thousandths: 64/640 = 0.1, 48/480 = 0.1, 320/640 = 0.5, 240/480 = 0.5 -> [100, 100, 500, 500].
    r = grounding([completion(answer([100, 100, 500, 500]), family, inp=(644, 476))], [[GT]], ["norm1000"], [(W, H)])
    assert r == [pytest.approx(1.0)]
    # [100, 100, 300, 500] -> pixels [64, 48, 192, 240]: half of GT's width -> IoU 0.5.
    r = grounding([completion(answer([100, 100, 300, 500]), family)], [[GT]], ["norm1000"], [(W, H)])
    assert r == [pytest.approx(0.5)]


def test_strict_frame_refuses_a_model_in_another_frame():
    c = completion(answer([100, 100, 500, 500]), "qwen2_vl")  # writes norm1000
    with pytest.raises(FrameError, match="input_pixels.*norm1000"):
        grounding([c], [[GT]], ["input_pixels"], [(W, H)])
    # Not strict (task.box_frame set on purpose): read in the prompt's frame, input_pixels here.
    # [100, 100, 500, 500] input px -> [99.38, 100.84, 496.89, 504.20] px, y2 clipped to 480.
    r = grounding([c], [[GT]], ["input_pixels"], [(W, H)], strict_frame=False)
    px = convert_boxes([[100, 100, 500, 500]], "input_pixels", "pixels", orig_size=(W, H), input_size=INPUT_25)[0]
    assert px[3] > H
    assert r[0] == pytest.approx(iou_ref([px[0], px[1], px[2], H], GT))


def test_size_problems_raise_frame_errors():
    with pytest.raises(FrameError, match="input_size"):
        grounding([completion(answer(GT), inp=None)], [[GT]], ["input_pixels"], [(W, H)])
    with pytest.raises(FrameError, match="different frame"):
        grounding([completion(answer(GT))], [[GT]], ["input_pixels"], [(320, 240)])


# ----------------------------------------------------------------------------- reward values


def test_negative_sample_empty_answer_one_hallucination_zero():
    assert grounding([completion("[]")], [[]], ["input_pixels"], [(W, H)]) == [1.0]
    assert grounding([completion("There is no such object.")], [[]], ["input_pixels"], [(W, H)]) == [1.0]
    assert grounding([completion(answer([10, 10, 50, 50]))], [[]], ["input_pixels"], [(W, H)]) == [0.0]
    # And the reverse: an empty answer when there is a target scores 0.
    assert grounding([completion("[]")], [[GT]], ["input_pixels"], [(W, H)]) == [0.0]


def test_unparseable_scores_zero_and_is_counted():
    comps = [completion("blah blah"), completion(answer([64.4, 47.6, 322.0, 238.0]))]
    assert grounding(comps, [[GT], [GT]], ["input_pixels"] * 2, [(W, H)] * 2) == [0.0, pytest.approx(1.0)]
    # Unparseable on a NEGATIVE is still 0 (not the 1.0 of a correct empty answer).
    assert grounding([completion("blah blah")], [[]], ["input_pixels"], [(W, H)]) == [0.0]
    items = [{"gt_boxes": [GT], "answer_frame": "input_pixels", "image_size": (W, H)}] * 2
    mon = rollout_monitors(items, comps)
    assert mon["monitor/parse_fail_rate"] == 0.5
    assert mon["monitor/pred_box_count"] == 0.5  # (0 + 1) / 2
    assert mon["monitor/gt_box_count"] == 1.0
    assert mon["monitor/response_length"] == 20.0
    assert mon["monitor/wrong_count_rate"] == 0.5  # the failed parse


def test_prediction_outside_image_is_clipped():
    # Input pixels [-50, -50, 322, 238] -> pixels [-49.69, -50.42, 320, 240] -> clipped [0, 0, 320, 240].
    r = grounding([completion(answer([-50, -50, 322, 238]))], [[[0, 0, 320, 240]]], ["input_pixels"], [(W, H)])
    assert r == [pytest.approx(1.0)]
    # norm1000 [500, 500, 1500, 1500] -> pixels [320, 240, 960, 720] -> clipped to the image corner.
    r = grounding(
        [completion(answer([500, 500, 1500, 1500]), "qwen3_vl")], [[[320, 240, 640, 480]]], ["norm1000"], [(W, H)]
    )
    assert r == [pytest.approx(1.0)]
    # Entirely outside: clipped to zero area -> 0.
    r = grounding([completion(answer([1100, 0, 1200, 100]), "qwen3_vl")], [[GT]], ["norm1000"], [(W, H)])
    assert r == [0.0]


def test_multibox_mean_iou():
    # 1000x1000 image and norm1000 answers, so numbers are pixels. A exact (IoU 1), B shifted by 50
    # (overlap 50*100 = 5000, union 15000 -> 1/3): mean over max(2, 2) = (1 + 1/3) / 2 = 2/3.
    gt = [[0, 0, 100, 100], [200, 200, 300, 300]]
    size = (1000, 1000)
    two = completion(answer([0, 0, 100, 100], [250, 200, 350, 300]), "qwen2_vl", orig=size)
    three = completion(answer([0, 0, 100, 100], [250, 200, 350, 300], [600, 600, 700, 700]), "qwen2_vl", orig=size)
    r = grounding([two, three], [gt, gt], ["norm1000"] * 2, [size] * 2)
    assert r == [pytest.approx(2 / 3), pytest.approx(4 / 9)]  # extra box: (4/3) / 3


def test_iou_kinds_single_target():
    # GT [0,0,100,100]; pred [0,0,100,50] inside it: IoU 0.5, IoU^2 0.25, enclosing = GT so GIoU = 0.5
    # -> (0.5 + 1)/2 = 0.75; acc@0.5 = 1, acc@0.6 = 0. Only the FIRST box counts for one target.
    size = (1000, 1000)
    c = completion(answer([0, 0, 100, 50], [0, 0, 100, 100]), "qwen2_vl", orig=size)
    expected = {"iou": 0.5, "iou_sq": 0.25, "giou01": 0.75, "acc@0.5": 1.0, "acc@0.6": 0.0}
    for kind, value in expected.items():
        assert grounding([c], [[[0, 0, 100, 100]]], ["norm1000"], [size], iou_kind=kind) == [pytest.approx(value)], kind


def test_score_boxes_acc_kind_uses_f1_for_several_targets():
    gt = [[0, 0, 100, 100], [200, 200, 300, 300]]
    pred = parse_boxes(answer([0, 0, 100, 100]))
    # One of two matched at IoU 1: precision 1, recall 1/2 -> f1 = 2/3; mean_iou = 1/2.
    assert score_boxes(pred, gt, kind="acc@0.5") == pytest.approx(2 / 3)
    assert score_boxes(pred, gt, kind="iou") == pytest.approx(0.5)


def test_duplicate_penalty_and_total_through_the_reward_manager():
    task = VQAGroundingTask(VQAGroundingConfig(box_frame="norm1000"), None)
    size = (1000, 1000)
    dup = completion(answer([0, 0, 100, 100], [0, 0, 100, 100]), "qwen2_vl", orig=size)
    item = {
        "gt_boxes": [[0, 0, 100, 100]],
        "gt_labels": ["a"],
        "answer_frame": "norm1000",
        "image_size": size,
        "id": "x",
    }
    manager = RewardManager(task.reward_specs())
    res = manager(["p"], [dup], task.reward_columns([item]))
    # grounding: first box IoU 1; format: exact JSON -> 1; duplicate: 1 of 2 boxes repeats -> 0.5.
    assert res.per_fn["grounding"].tolist() == [1.0]
    assert res.per_fn["format"].tolist() == [1.0]
    assert res.per_fn["duplicate"].tolist() == [0.5]
    assert res.total.tolist() == [pytest.approx(1.0 * 1.0 + 0.2 * 1.0 - 0.5 * 0.5)]
    dup_fn = make_duplicate_reward(GroundingRewardSettings())
    assert dup_fn([""], [completion("nonsense", orig=size)], answer_frame=["input_pixels"], image_size=[size]) == [0.0]


def test_format_reward():
    fmt = make_format_reward(GroundingRewardSettings(think=False))
    fmt_think = make_format_reward(GroundingRewardSettings(think=True))
    good = answer([1, 2, 3, 4])
    cases = [
        (good, False, 1.0),
        ("[]", False, 1.0),
        (f"Sure! {good}", False, 0.0),  # prose around the JSON: the parser reads it, the format does not pay
        (good, True, 0.0),  # truncated
        ('[{"bbox_2d": [1, 2, 3]}]', False, 0.0),  # 3 numbers
        ('[{"bbox_2d": [1, 2, 3, 4], "score": 1}]', False, 0.0),  # unknown key
    ]
    for text, truncated, value in cases:
        assert fmt([""], [{"text": text, "truncated": truncated}]) == [value], text
    # The empty answer earns the format reward only where it can be right (a negative item).
    empty = [{"text": "[]"}, {"text": "[]"}, {"text": good}]
    assert fmt([""] * 3, empty, gt_boxes=[[], [GT], [GT]]) == [1.0, 0.0, 1.0]
    lenient = make_format_reward(GroundingRewardSettings(pay_format_for_empty=True))
    assert lenient([""] * 3, empty, gt_boxes=[[], [GT], [GT]]) == [1.0, 1.0, 1.0]
    assert fmt_think([""], [{"text": f"<think>left of it</think><answer>{good}</answer>"}]) == [1.0]
    assert fmt_think([""], [{"text": good}]) == [0.0]
    assert fmt_think([""], [{"text": "<think>x</think><answer>box</answer>"}]) == [0.0]
    assert not answer_schema_ok(None, think=False)


# ----------------------------------------------------------------------------- eval metrics


def test_eval_metrics_by_hand():
    size = (1000, 1000)
    items = [
        {"gt_boxes": [[0, 0, 100, 100]], "answer_frame": "norm1000", "image_size": size},
        {"gt_boxes": [], "answer_frame": "norm1000", "image_size": size},
        {"gt_boxes": [[0, 0, 100, 100], [200, 200, 300, 300]], "answer_frame": "norm1000", "image_size": size},
        {"gt_boxes": [[0, 0, 100, 100]], "answer_frame": "norm1000", "image_size": size},
    ]
    samples = [
        completion(answer([0, 0, 100, 50]), "qwen2_vl", orig=size),  # IoU 0.5: acc 1, p=r=f1=1
        completion("[]", "qwen2_vl", orig=size),  # correct negative: all 1
        completion(answer([0, 0, 100, 100]), "qwen2_vl", orig=size),  # 1 of 2: miou 1/2, acc 0, p 1, r 1/2, f1 2/3
        completion("garbage", "qwen2_vl", orig=size),  # failed parse: all 0
    ]
    m = grounding_eval_metrics(items, samples)
    assert m["eval/acc@0.5"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    assert m["eval/mean_iou"] == pytest.approx((0.5 + 1 + 0.5 + 0) / 4)
    assert m["eval/precision"] == pytest.approx((1 + 1 + 1 + 0) / 4)
    assert m["eval/recall"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert m["eval/f1"] == pytest.approx((1 + 1 + 2 / 3 + 0) / 4)
    assert m["eval/parse_fail_rate"] == 0.25
    assert m["eval/score"] == m["eval/mean_iou"]


# ----------------------------------------------------------------------------- prompts and SFT targets


def test_prompts_mention_the_right_frame():
    p_norm = build_prompt("the red circle", "norm1000")
    p_pix = build_prompt("the red circle", "qwen2_5_vl")  # a family is accepted too
    assert "0 to 1000" in p_norm and "absolute pixel" not in p_norm
    assert "absolute pixel" in p_pix and "1000" not in p_pix
    assert "the red circle" in p_norm and '"bbox_2d"' in p_norm and "[]" in p_norm
    assert "<think>" in build_prompt("x", "norm1000", think=True) and "<think>" not in p_norm
    assert "every object" in p_norm and "every object" not in build_prompt("x", "norm1000", multi_box=False)
    assert answer_frame("qwen3_vl") == "norm1000"
    with pytest.raises(FrameError):
        build_prompt("x", "pixels")
    with pytest.raises(ValueError):
        build_prompt("  ", "norm1000")


@pytest.mark.parametrize(
    "family,size",
    [("qwen2_5_vl", (640, 480)), ("qwen2_vl", (640, 480)), ("qwen3_vl", (4000, 3000)), ("qwen2_5_vl", (4000, 3000))],
)
def test_sft_target_round_trip(family, size):
    w, h = size
    factor = 32 if family == "qwen3_vl" else 28
    ih, iw = smart_resize(h, w, factor=factor, min_pixels=4 * factor**2, max_pixels=1280 * factor**2)
    rng = np.random.default_rng(0)
    x1, y1 = rng.uniform(0, w * 0.5, 5), rng.uniform(0, h * 0.5, 5)
    gt = np.stack([x1, y1, x1 + rng.uniform(5, w * 0.4, 5), y1 + rng.uniform(5, h * 0.4, 5)], 1)
    item = {"gt_boxes": gt.tolist(), "gt_labels": ["a"] * 5, "image_size": size, "id": "t"}
    text = sft_target(item, family, (iw, ih))
    parsed = parse_boxes(text)
    assert parsed.status == "ok" and len(parsed) == 5
    back = convert_boxes(parsed.boxes, FRAME_OF[family], "pixels", orig_size=size, input_size=(iw, ih))
    # Rounding to integers in the frame moves a coordinate by <= 0.5 frame units = 0.5 * W / W_frame px.
    extent = (1000, 1000) if FRAME_OF[family] == "norm1000" else (iw, ih)
    bound_x, bound_y = 0.5 * w / extent[0], 0.5 * h / extent[1]
    err = np.abs(back - gt)
    assert err[:, [0, 2]].max() <= bound_x + 1e-9 and err[:, [1, 3]].max() <= bound_y + 1e-9
    if size == (640, 480):
        assert max(bound_x, bound_y) <= 1.0  # <= 1 px on ordinary images
    else:
        assert FRAME_OF[family] != "norm1000" or bound_x == 2.0  # 0.5 * 4000 / 1000: norm1000 is coarse on huge images
    # And the target is a perfect-format answer that the reward reads back.
    comp = {"text": text, "orig_size": size, "input_size": (iw, ih), "box_frame": FRAME_OF[family], "truncated": False}
    assert make_format_reward(GroundingRewardSettings())([""], [comp]) == [1.0]
    assert predicted_pixels(comp, FRAME_OF[family], size).boxes.shape == (5, 4)


def test_sft_target_negative_think_and_errors():
    item = {"gt_boxes": [], "gt_labels": [], "image_size": (W, H)}
    assert sft_target(item, "norm1000") == "[]"
    think = sft_target({"gt_boxes": [GT], "gt_labels": ["cat"], "image_size": (W, H)}, "norm1000", think=True)
    assert think.endswith('<answer>[{"bbox_2d": [100, 100, 500, 500], "label": "cat"}]</answer>')
    assert answer_schema_ok(think, think=True)
    with pytest.raises(FrameError, match="input_size"):
        sft_target({"gt_boxes": [GT], "gt_labels": [None], "image_size": (W, H)}, "input_pixels")
    with pytest.raises(ValueError, match="prepare_item"):
        sft_target({"gt_boxes": None, "image_size": (W, H)}, "norm1000")
    # A missing label is left out.
    assert (
        sft_target({"gt_boxes": [GT], "gt_labels": [None], "image_size": (W, H)}, "norm1000")
        == '[{"bbox_2d": [100, 100, 500, 500]}]'
    )


# ----------------------------------------------------------------------------- model family -> frame


def test_model_family_and_frame_resolution(tmp_path):
    vlm = VLMConfig
    assert model_family_of(vlm(name="tiny_qwen2_5_vl", path="tiny_qwen2_5_vl")) == "qwen2_5_vl"
    assert model_family_of(vlm(name="x", path="qwen3_vl_4b")) == "qwen3_vl"
    assert model_family_of(vlm(name="custom", path="Qwen/Qwen2-VL-7B-Instruct")) == "qwen2_vl"
    assert model_family_of(vlm(name="custom", path="someone/Qwen2.5-VL-32B-Instruct")) == "qwen2_5_vl"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    assert model_family_of(vlm(name="local", path=str(tmp_path))) == "qwen3_vl"
    assert model_family_of(vlm(name="llava", path="llava-hf/llava-1.5-7b-hf")) is None
    assert model_family_of(NS(type="audio_lm", name="qwen3_vl_4b")) == "qwen3_vl"  # no path: its name alone
    assert (
        resolve_answer_frame("auto", NS(model=vlm(name="qwen2_5_vl_3b", path="Qwen/Qwen2.5-VL-3B-Instruct")))
        == "input_pixels"
    )
    assert resolve_answer_frame("norm1000", None) == "norm1000"
    with pytest.raises(ConfigError, match="task.box_frame.*'path': 'llava'"):
        resolve_answer_frame("auto", NS(model=vlm(name="llava", path="llava")))
    with pytest.raises(ConfigError, match="model.type=vlm"):
        VQAGroundingTask(VQAGroundingConfig(), NS(model=NS(type="causal_lm", name="tiny_lm", path="tiny")))


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"data_format": "coco"}, "data_format"),
        ({"data_format": "jsonl"}, "task.data"),
        ({"data_format": "vlm_r1", "data": "x.jsonl"}, "image_root"),
        ({"data_format": "refcoco", "data": "i.json", "image_root": "."}, "task.refs"),
        ({"iou_kind": "dice"}, "iou_kind"),
        ({"iou_kind": "acc@1.5"}, "iou_kind"),
        ({"box_frame": "pixels"}, "box_frame"),
        ({"duplicate_penalty_weight": -1.0}, "magnitude"),
        ({"image_sizes": [[50, 50]]}, "image_sizes"),
        ({"tau": 0.0}, "tau"),
    ],
)
def test_config_validation(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        VQAGroundingConfig(**kwargs).validate()


# ----------------------------------------------------------------------------- data


def qwen25_run():
    return NS(model=NS(type="vlm", name="tiny_qwen2_5_vl", path="tiny_qwen2_5_vl"))


def test_synthetic_items_prompts_and_monitors_per_group():
    task = VQAGroundingTask(VQAGroundingConfig(num_train=120, num_eval=4), qwen25_run())
    items = task.train_items()
    assert len(items) == 120 and len(task.eval_items()) == 4
    counts = [len(it["gt_boxes"]) for it in items]
    assert 0 in counts and max(counts) >= 2 and 1 in counts  # negatives, multi-target, single
    assert {it["image_size"] for it in items} >= {(192, 144), (144, 192)}  # non-square sizes
    assert all("absolute pixel" in it["prompt"] and it["answer_frame"] == "input_pixels" for it in items)
    assert {it["id"] for it in items}.isdisjoint({it["id"] for it in task.eval_items()})
    prepared = task.prepare_item(items[0])
    assert prepared["image"].size == prepared["image_size"] and items[0]["image"] is not prepared["image"]
    # One item per prompt, G = 2 samples each: the task repeats the items.
    g = [completion("[]", orig=prepared["image_size"], inp=(196, 140)) for _ in range(2)]
    mon = task.rollout_metrics([prepared], g)
    assert mon["monitor/empty_answer_rate"] == 1.0 and mon["monitor/gt_box_count"] == len(prepared["gt_boxes"])
    single = VQAGroundingTask(VQAGroundingConfig(num_train=60, num_eval=2, multi_box=False), qwen25_run())
    assert max(len(it["gt_boxes"]) for it in single.train_items()) <= 1
    assert "every object" not in single.train_items()[0]["prompt"]


def write_image(path, size, color=(200, 30, 30)):
    Image.new("RGB", size, color).save(path)


def test_jsonl_loading_prepare_and_skips(tmp_path):
    (tmp_path / "imgs").mkdir()
    write_image(tmp_path / "imgs" / "a.png", (200, 100))
    write_image(tmp_path / "imgs" / "b.png", (300, 150))
    records = [
        {
            "id": "a",
            "image": "imgs/a.png",
            "question": "the red thing",
            "boxes": [{"bbox": [20, 10, 120, 60], "label": "red"}],
            "bbox_frame": "pixels",
            "image_size": [200, 100],
        },
        # norm1000 without image_size: pixels known only once the image is read (300x150).
        {
            "id": "b",
            "image": "imgs/b.png",
            "question": "the left half",
            "boxes": [{"bbox": [0, 0, 500, 1000]}],
            "bbox_frame": "norm1000",
        },
        {"id": "neg", "image": "imgs/a.png", "question": "a purple star", "boxes": [], "bbox_frame": "pixels"},
        {"id": "gone", "image": "imgs/missing.png", "question": "anything", "boxes": [], "bbox_frame": "pixels"},
        {
            "id": "wrong_size",
            "image": "imgs/a.png",
            "question": "x",
            "boxes": [],
            "bbox_frame": "pixels",
            "image_size": [400, 200],
        },
        {
            "id": "held_out",
            "image": "imgs/b.png",
            "question": "eval one",
            "boxes": [{"bbox": [1, 1, 50, 50]}],
            "bbox_frame": "pixels",
        },
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    cfg = VQAGroundingConfig(data_format="jsonl", data=str(data), num_eval=1, box_frame="norm1000")
    cfg.validate()
    task = VQAGroundingTask(cfg, None)
    train = {it["id"]: it for it in task.train_items()}
    assert list(train) == ["a", "b", "neg", "gone", "wrong_size"] and [it["id"] for it in task.eval_items()] == [
        "held_out"
    ]
    assert train["a"]["gt_boxes"] == [[20.0, 10.0, 120.0, 60.0]] and train["b"]["gt_boxes"] is None
    assert "0 to 1000" in train["a"]["prompt"]
    b = task.prepare_item(train["b"])
    assert b["gt_boxes"] == [[0.0, 0.0, 150.0, 150.0]] and b["image_size"] == (300, 150)  # 500/1000 * 300
    assert task.prepare_item(train["neg"])["gt_boxes"] == []
    with pytest.raises(SkipItem, match=r"missing\.png: file not found"):
        task.prepare_item(train["gone"])
    with pytest.raises(SkipItem, match="200x100 but the record says 400x200"):
        task.prepare_item(train["wrong_size"])
    # The SFT target of the prepared pixel item, in norm1000: 20/200*1000 = 100, 10/100*1000 = 100, ...
    prepared_a = task.prepare_item(train["a"])
    assert task.sft_target(prepared_a, {}) == '[{"bbox_2d": [100, 100, 600, 600], "label": "red"}]'
    meta = {"orig_size": (200, 100), "input_size": (196, 112), "box_frame": "norm1000", "family": "qwen2_vl"}
    assert task.sft_target(prepared_a, meta) == '[{"bbox_2d": [100, 100, 600, 600], "label": "red"}]'
    with pytest.raises(FrameError, match="different frame"):
        task.sft_target(prepared_a, {**meta, "orig_size": (100, 50)})


def test_task_sft_target_uses_the_policy_input_size():
    task = VQAGroundingTask(VQAGroundingConfig(num_train=4, num_eval=0), qwen25_run())
    item = {"gt_boxes": [GT], "gt_labels": ["cat"], "image_size": (W, H)}
    meta = {"orig_size": (W, H), "input_size": INPUT_25, "box_frame": "input_pixels", "family": "qwen2_5_vl"}
    # 64 * 644/640 = 64.4 -> 64; 48 * 476/480 = 47.6 -> 48; 320 * 644/640 = 322; 240 * 476/480 = 238.
    assert task.sft_target(item, meta) == '[{"bbox_2d": [64, 48, 322, 238], "label": "cat"}]'
    with pytest.raises(FrameError, match="input_size"):
        task.sft_target(item, {})
    with pytest.raises(FrameError, match="writes 'norm1000'"):
        task.sft_target(item, {**meta, "box_frame": "norm1000", "family": "qwen2_vl"})


def test_malformed_jsonl_box_names_file_and_line(tmp_path):
    data = tmp_path / "bad.jsonl"
    lines = [
        {"image": "a.png", "question": "ok", "boxes": [{"bbox": [1, 1, 5, 5]}], "bbox_frame": "pixels"},
        {"image": "a.png", "question": "reversed", "boxes": [{"bbox": [50, 10, 20, 40]}], "bbox_frame": "pixels"},
    ]
    data.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    task = VQAGroundingTask(
        VQAGroundingConfig(data_format="jsonl", data=str(data), num_eval=0, box_frame="norm1000"), None
    )
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2: box 0 has x2 < x1"):
        task.train_items()
    skipping = VQAGroundingTask(
        VQAGroundingConfig(
            data_format="jsonl", data=str(data), num_eval=0, box_frame="norm1000", on_invalid_box="skip_sample"
        ),
        None,
    )
    assert len(skipping.train_items()) == 1 and "1 skipped" in skipping.load_reports[str(data)]


def test_vlm_r1_loading(tmp_path):
    write_image(tmp_path / "c.jpg", (320, 240))
    rec = {
        "image": "c.jpg",
        "problem": "Please provide the bounding box coordinate of the region this sentence describes: the cup.",
        "solution": [10, 20, 110, 220],
        "normal_caption": "the cup",
    }
    (tmp_path / "train.jsonl").write_text(json.dumps(rec) + "\n")
    (tmp_path / "val.jsonl").write_text(json.dumps({**rec, "normal_caption": "a cup"}) + "\n")
    cfg = VQAGroundingConfig(
        data_format="vlm_r1",
        data=str(tmp_path / "train.jsonl"),
        eval_data=str(tmp_path / "val.jsonl"),
        image_root=str(tmp_path),
        multi_box=False,
    )
    task = VQAGroundingTask(cfg, NS(model=NS(type="vlm", name="qwen2_vl_2b", path="Qwen/Qwen2-VL-2B-Instruct")))
    (item,) = task.train_items()
    assert item["question"] == "the cup" and item["gt_boxes"] == [[10.0, 20.0, 110.0, 220.0]]
    assert "Locate the cup in the image" in item["prompt"] and "0 to 1000" in item["prompt"]
    assert task.eval_items()[0]["question"] == "a cup"


def test_prompt_length_limit_drops_items(tmp_path):
    task = VQAGroundingTask(VQAGroundingConfig(num_train=5, num_eval=0, max_prompt_chars=50), qwen25_run())
    with pytest.raises(ConfigError, match="no usable train items"):
        task.train_items()
    assert "max_prompt_chars=50" in task.load_reports["train/dropped"]


# ----------------------------------------------------------------------------- registry and config


def test_task_is_listed(capsys):
    from mmrl.cli import main
    from mmrl.config import field_docs
    from mmrl.tasks import get_task_class, task_names

    assert "vqa_grounding" in task_names() and get_task_class("vqa_grounding") is VQAGroundingTask
    assert main(["tasks"]) == 0
    assert "vqa_grounding" in capsys.readouterr().out
    import dataclasses

    docs = field_docs(VQAGroundingConfig)
    assert all(docs.get(f.name) for f in dataclasses.fields(VQAGroundingConfig))


def test_config_file_loads():
    from mmrl.config import configs_dir, load_config
    from mmrl.models.registry import MODEL_TYPES

    assert (configs_dir() / "model" / "tiny_qwen3_vl.yaml").is_file() and "vlm" in MODEL_TYPES
    cfg = load_config(["task=vqa_grounding"])
    assert isinstance(cfg.task, VQAGroundingConfig) and cfg.model.type == "vlm"
    assert cfg.algo.group_size == 8 and cfg.trainer.batch_size == 16
    task = VQAGroundingTask(cfg.task, cfg)
    assert task.answer_frame == "norm1000"  # the CPU default is the tiny Qwen3-VL
    # the frame follows the model family: Qwen2.5-VL writes pixels of the resized input
    cfg25 = load_config(["task=vqa_grounding", "model=tiny_qwen2_5_vl"])
    assert VQAGroundingTask(cfg25.task, cfg25).answer_frame == "input_pixels"


def test_refcoco_loading_by_split(tmp_path):
    write_image(tmp_path / "img1.jpg", (320, 240))
    instances = {
        "images": [{"id": 1, "file_name": "img1.jpg", "width": 320, "height": 240}],
        "annotations": [{"id": 10, "image_id": 1, "bbox": [10, 20, 100, 50], "category_id": 3}],
        "categories": [{"id": 3, "name": "cup"}],
    }
    refs = [
        {
            "ref_id": 1,
            "ann_id": 10,
            "image_id": 1,
            "split": "train",
            "sentences": [{"sent": "the cup"}, {"sent": "a mug"}],
        },
        {"ref_id": 2, "ann_id": [], "image_id": 1, "split": "val", "sentences": [{"sent": "the purple dog"}]},
    ]
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    cfg = VQAGroundingConfig(
        data_format="refcoco",
        data=str(tmp_path / "instances.json"),
        refs=str(tmp_path / "refs.json"),
        image_root=str(tmp_path),
        box_frame="norm1000",
    )
    cfg.validate()
    task = VQAGroundingTask(cfg, None)
    train = task.train_items()
    # One item per sentence; COCO [x, y, w, h] = [10, 20, 100, 50] -> xyxy [10, 20, 110, 70].
    assert [it["question"] for it in train] == ["the cup", "a mug"]
    assert train[0]["gt_boxes"] == [[10.0, 20.0, 110.0, 70.0]] and train[0]["gt_labels"] == ["cup"]
    (neg,) = task.eval_items()
    assert neg["gt_boxes"] == [] and task.prepare_item(neg)["image_size"] == (320, 240)
