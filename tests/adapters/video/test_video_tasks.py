"""task=video_temporal_grounding and task=video_qa: rewards by hand, loaders, bad inputs, end-to-end."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("decord")
pytest.importorskip("cv2")

from mmrl.adapters.video.decode import VideoClip  # noqa: E402
from mmrl.adapters.video.synthetic import make_video_dataset  # noqa: E402
from mmrl.config import ConfigError, load_config  # noqa: E402
from mmrl.tasks.base import SkipItem  # noqa: E402
from mmrl.tasks.video.common import AnnotationError  # noqa: E402
from mmrl.tasks.video.video_qa import (  # noqa: E402
    VideoQATask,
    accuracy_reward,
    check_qa_record,
    load_video_qa_jsonl,
    qa_format_reward,
)
from mmrl.tasks.video.video_temporal_grounding import (  # noqa: E402
    VideoTemporalGroundingTask,
    load_charades_sta,
    load_temporal_jsonl,
    make_temporal_reward,
    temporal_format_reward,
)

TG_BASE = [
    "trainer.logging.progress=false",
    "trainer.logging.tensorboard=false",
    "trainer.logging.plot=false",
    "trainer.device=cpu",
    "task.video.decode_timeout_s=null",
]


@pytest.fixture(scope="module")
def vids(tmp_path_factory) -> list[dict]:
    """Four synthetic 4 s videos at 4 fps (128x96) with their ground truth."""
    return make_video_dataset(tmp_path_factory.mktemp("tv"), 4, 11, "temporal", duration_s=4.0, fps=4)


def tg_task(tmp_path, *extra) -> VideoTemporalGroundingTask:
    cfg = load_config(
        [
            "task=video_temporal_grounding",
            f"task.video.cache_dir={tmp_path / 'frames'}",
            "task.num_train=4",
            "task.num_eval=2",
            *TG_BASE,
            *extra,
        ]
    )
    return VideoTemporalGroundingTask(cfg.task, cfg)


def sample(text, **kw):
    return {"text": text, "truncated": False, **kw}


# ----------------------------------------------------------------------------- temporal rewards by hand


def test_temporal_rewards_by_hand():
    seg, dur = [[1.0, 3.0]], 4.0
    fn = make_temporal_reward("tiou")
    texts = [
        "<answer>2.0 to 3.0</answer>",  # inter 1, union 2 -> 0.5
        "<answer>0 to 4</answer>",  # inter 2, union 4 -> 0.5 (the whole-video answer)
        "<answer>1.0 to 3.0</answer>",  # exact -> 1
        "<answer>3.5 to 4.5</answer>",  # clipped to [3.5, 4]: no overlap -> 0
        "<answer>3.0 to 1.0</answer>",  # reversed: rejected -> 0
        "no idea",
    ]  # unparseable -> 0
    got = fn(None, [sample(t) for t in texts], [seg] * 6, [dur] * 6)
    assert got == pytest.approx([0.5, 0.5, 1.0, 0.0, 0.0, 0.0])
    # Time-R1 distance weighting: [2, 3] vs [1, 3] in 4 s: 0.5 * (1 - 1/4) * (1 - 0/4) = 0.375
    assert make_temporal_reward("tiou_dist")(None, [sample(texts[0])], [seg], [dur]) == pytest.approx([0.375])
    # GIoU01: [3.5, 4] vs [1, 3]: IoU 0, hull [1, 4] = 3, union 2.5 -> GIoU = 0 - 0.5/3; (GIoU + 1)/2 = 0.41667
    assert make_temporal_reward("giou01")(None, [sample(texts[3])], [seg], [dur]) == pytest.approx([5 / 12])
    # swap mode reads the reversed answer as [1, 3]
    assert make_temporal_reward("tiou", on_reversed="swap")(None, [sample(texts[4])], [seg], [dur]) == [1.0]
    fmt = temporal_format_reward(
        None, [sample(texts[0]), sample("2.0 to 3.0"), sample(texts[3]), sample(texts[0], truncated=True)], [dur] * 4
    )
    # ok; no tag; clipped (status "repaired" is not the format as written); cut off
    assert fmt == [1.0, 0.0, 0.0, 0.0]


def test_format_gate_zeroes_answers_with_junk_after_them():
    seg, dur = [[1.0, 3.0]], 4.0
    texts = [
        "<answer>1.0 to 3.0</answer>",  # clean, exact -> 1
        "<answer>1.0 to 3.0</answer>2.0</answer>",  # junk after the block: gated -> 0 (ungated 1)
        "<answer>1.0 to 3.0</answer><answer>0 to 4</answer>",  # two blocks -> 0 (ungated: the last, 0.5)
        "<think>the circle shows at 1 s</think><answer>2.0 to 3.0</answer>",
    ]  # think + answer is clean -> 0.5
    gated = make_temporal_reward("tiou", format_gate=True)(None, [sample(t) for t in texts], [seg] * 4, [dur] * 4)
    assert gated == pytest.approx([1.0, 0.0, 0.0, 0.5])
    ungated = make_temporal_reward("tiou")(None, [sample(t) for t in texts], [seg] * 4, [dur] * 4)
    assert ungated[1] == pytest.approx(1.0)
    # a clean answer that was cut off (no EOS) is gated too
    assert make_temporal_reward("tiou", format_gate=True)(None, [sample(texts[0], truncated=True)], [seg], [dur]) == [
        0.0
    ]
    assert temporal_format_reward(None, [sample(t) for t in texts], [dur] * 4) == [1.0, 0.0, 0.0, 1.0]


def test_temporal_eval_and_rollout_metrics_by_hand(tmp_path):
    task = tg_task(tmp_path)
    items = [
        {"segments": [[1.0, 3.0]], "duration": 4.0},
        {"segments": [[0.0, 1.0]], "duration": 4.0},
        {"segments": [[2.0, 4.0]], "duration": 4.0},
    ]
    samples = [
        sample("<answer>1.0 to 3.0</answer>"),  # IoU 1
        sample("<answer>0.0 to 2.0</answer>"),  # IoU 1/2
        sample("nothing"),
    ]  # 0, parse failure
    m = task.eval_metrics(items, samples, {})
    assert m["eval/miou"] == pytest.approx(0.5) and m["eval/score"] == m["eval/miou"]
    assert m["eval/R@0.3"] == pytest.approx(2 / 3) and m["eval/R@0.5"] == pytest.approx(2 / 3)
    assert m["eval/R@0.7"] == pytest.approx(1 / 3) and m["eval/parse_fail_rate"] == pytest.approx(1 / 3)
    # rollout monitors skip shuffled samples: predicted lengths 2/4 and 2/4 -> 0.5; 1 failure of 3
    shuffled = sample("<answer>0 to 4</answer>", shuffled=True)
    r = task.rollout_metrics(items + [items[0]], samples + [shuffled])
    assert r["monitor/pred_length_frac"] == pytest.approx(0.5) and r["monitor/parse_fail_rate"] == pytest.approx(1 / 3)
    assert task.sft_target({"segments": [[1.25, 2.5]]}, {}) == "<answer>1.2 to 2.5</answer>"


# ----------------------------------------------------------------------------- QA rewards by hand


def test_qa_rewards_by_hand():
    items = [
        {"question_type": "multiple_choice", "answer": "B", "options": ["red", "green", "blue", "yellow"]},
        {"question_type": "multiple_choice", "answer": "B", "options": ["red", "green", "blue", "yellow"]},
        {"question_type": "numeric", "answer": 3},
        {"question_type": "numeric", "answer": 3},
        {"question_type": "numeric", "answer": 3, "abs_tol": 1.0},
    ]
    texts = [
        "<answer>B</answer>",
        "<answer>blue</answer>",
        "<answer>3</answer>",
        "<answer>three</answer> 4",
        "<answer>4</answer>",
    ]
    cols = {
        k: [it.get(k) for it in items] for k in ("question_type", "answer", "options", "rel_tol", "abs_tol", "metric")
    }
    got = accuracy_reward(None, [sample(t) for t in texts], **cols)
    # B right; "blue" is option C -> wrong; 3 right; "three" read as 3 -> right; 4 within abs_tol 1 -> right
    assert got == [1.0, 0.0, 1.0, 1.0, 1.0]
    fmt = qa_format_reward(
        None,
        [
            sample("<answer>B</answer>"),
            sample("B"),
            sample("<answer></answer>"),
            sample("<answer>B</answer><answer>C</answer>"),
            sample("<answer>B</answer>", truncated=True),
        ],
    )
    assert fmt == [1.0, 0.0, 0.0, 0.0, 0.0]
    # the format gate: "<answer>three</answer> 4" has text after the block -> 0; a cut-off right answer -> 0
    gated = accuracy_reward(None, [sample(t) for t in texts], **cols, format_gate=True)
    assert gated == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert accuracy_reward(
        None, [sample(texts[0], truncated=True)], **{k: v[:1] for k, v in cols.items()}, format_gate=True
    ) == [0.0]
    cfg = load_config(["task=video_qa", "task.video.decode_timeout_s=null"])
    task = VideoQATask(cfg.task, cfg)
    m = task.eval_metrics(items[:4], [sample(t) for t in texts[:4]], {})
    # correct: 1, 0, 1, 1 -> 0.75; MC 1/2, numeric 2/2
    assert m["eval/accuracy"] == m["eval/score"] == pytest.approx(0.75)
    assert m["eval/accuracy/multiple_choice"] == 0.5 and m["eval/accuracy/numeric"] == 1.0
    assert task.sft_target({"answer": 3.0}, {}) == "<answer>3</answer>"
    assert task.rollout_metrics(items[:2], [sample("x"), sample("<answer>A</answer>")]) == {
        "monitor/no_answer_rate": 0.5
    }


# ----------------------------------------------------------------------------- loaders


def test_charades_sta_loader(tmp_path):
    ann = tmp_path / "charades_sta_train.txt"
    ann.write_text(
        "3MSZA 24.3 30.4##person turn a light on.\n\nAO8RW 0.0 6.9##a person is putting a book on a shelf.\n"
    )
    recs = load_charades_sta(ann, tmp_path / "videos")
    assert [r["segments"] for r in recs] == [[[24.3, 30.4]], [[0.0, 6.9]]]
    assert recs[0]["video"] == str(tmp_path / "videos" / "3MSZA.mp4") and recs[0]["query"] == "person turn a light on."
    assert recs[1]["source"] == f"{ann}:3"
    for bad, msg in [
        ("3MSZA 24.3##x", "expected '<video_id> <start> <end>##<sentence>'"),
        ("3MSZA a b##x", "must be numbers"),
        ("3MSZA 5 2##x", "0 <= start <= end"),
        ("3MSZA 1 2##  ", "empty sentence"),
    ]:
        ann.write_text("ok 1 2##fine\n" + bad + "\n")
        with pytest.raises(AnnotationError, match=msg) as err:
            load_charades_sta(ann, tmp_path)
        assert f"{ann}:2" in str(err.value)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_charades_sta(tmp_path / "nope.txt", tmp_path)


def test_temporal_jsonl_loader(tmp_path):
    ann = tmp_path / "tg.jsonl"
    rows = [
        {"video": "a.mp4", "query": "the door opens", "segments": [[1, 2], [3, 4]]},
        {"video": "/abs/b.mp4", "question": "When?", "timestamp": [0.5, 1.5], "id": "b", "clip_start": 2.0},
    ]
    ann.write_text("\n".join(json.dumps(r) for r in rows))
    recs = load_temporal_jsonl(ann)
    assert recs[0]["video"] == str(tmp_path / "a.mp4") and recs[0]["segments"] == [[1.0, 2.0], [3.0, 4.0]]
    assert recs[1]["video"] == "/abs/b.mp4" and recs[1]["id"] == "b" and recs[1]["clip_start"] == 2.0
    for bad, msg in [
        ({"query": "x", "segments": [[0, 1]]}, "missing 'video'"),
        ({"video": "a.mp4", "segments": [[0, 1]]}, "missing 'query'"),
        ({"video": "a.mp4", "query": "x"}, "missing 'segments'"),
        ({"video": "a.mp4", "query": "x", "segments": [[2, 1]]}, "0 <= start <= end"),
        ({"video": "a.mp4", "query": "x", "segments": [[0, math.inf]]}, "finite"),
    ]:
        ann.write_text(json.dumps(bad) + "\n")
        with pytest.raises(AnnotationError, match=msg) as err:
            load_temporal_jsonl(ann)
        assert f"{ann}:1" in str(err.value)
    ann.write_text("{not json\n")
    with pytest.raises(AnnotationError, match="not valid JSON"):
        load_temporal_jsonl(ann)


def test_qa_jsonl_loader_and_record_checks(tmp_path):
    ann = tmp_path / "qa.jsonl"
    rows = [
        {
            "video": "v.mp4",
            "question": "Colour?",
            "question_type": "multiple_choice",
            "options": ["red", "blue"],
            "answer": "blue",
        },
        {"video": "v.mp4", "question": "How many?", "question_type": "numeric", "answer": "4", "abs_tol": 0.5},
    ]
    ann.write_text("\n".join(json.dumps(r) for r in rows))
    recs = load_video_qa_jsonl(ann)
    assert recs[0]["answer"] == "B"  # option text turned into its letter
    assert recs[1]["abs_tol"] == 0.5 and recs[1]["video"] == str(tmp_path / "v.mp4")
    for bad, msg in [
        ({"question": "q", "question_type": "essay", "answer": "x"}, "not one of"),
        (
            {"question": "q", "question_type": "multiple_choice", "answer": "E", "options": ["a", "b"]},
            "not an option letter A..B",
        ),
        ({"question": "q", "question_type": "multiple_choice", "answer": "A", "options": ["a"]}, "2..10"),
        ({"question": "q", "question_type": "numeric", "answer": "about 3"}, "not a number"),
        ({"question_type": "numeric", "answer": 3}, "missing 'question'"),
    ]:
        with pytest.raises(AnnotationError, match=msg):
            check_qa_record(bad, "f.jsonl:7")


# ----------------------------------------------------------------------------- prepare_item and bad input


def test_prepare_item_decodes_once_and_converts_clip_time(tmp_path, vids):
    task = tg_task(tmp_path)
    rec = vids[0]
    item = {"video": rec["video"], "prompt": "p", "segments": rec["segments"], "id": "a"}
    out = task.prepare_item(item)
    assert isinstance(out["video"], VideoClip) and out["video_path"] == rec["video"]
    assert out["duration"] == 4.0 and out["clip_start"] == 0.0 and out["segments"] == rec["segments"]
    # 128x96 source under 6272 px per frame, sides multiples of 32 (Qwen3-VL default) -> 64x64
    assert out["video"].num_frames == 8 and out["video"].frames.shape[1:3] == (64, 64)
    again = task.prepare_item(item)
    assert again["video"] is out["video"] and task.frame_cache.stats.decodes == 1
    # a window: clock starts at clip_start; segments shift into window time
    s, e = rec["segments"][0]
    win = task.prepare_item({**item, "clip_start": 1.0, "clip_end": 4.0, "segments": [[max(s, 1.0), e]]})
    assert win["duration"] == 3.0 and win["clip_start"] == 1.0
    assert win["segments"] == [[pytest.approx(max(s, 1.0) - 1.0), pytest.approx(e - 1.0)]]
    cols = task.reward_columns([out])
    assert set(cols) == {"segments", "duration", "id"}


def test_bad_inputs_are_counted_skips_naming_the_file(tmp_path, vids, monkeypatch):
    task = tg_task(tmp_path)
    good = Path(vids[1]["video"])
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00garbage" * 500)
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    cases = [
        (corrupt, "not a readable video"),
        (truncated, "not a readable video"),
        (empty, r"empty file \(0 bytes\)"),
        (tmp_path / "missing.mp4", "file not found"),
    ]
    for path, reason in cases:
        with pytest.raises(SkipItem, match=reason) as err:
            task.prepare_item({"video": str(path), "prompt": "p", "segments": [[0.0, 1.0]]})
        assert str(path) in str(err.value)
    # annotation outside the video (4 s): start past the end, or end beyond the 0.5 s tolerance
    for seg in ([4.5, 5.0], [1.0, 4.8]):
        with pytest.raises(SkipItem, match="outside the video window") as err:
            task.prepare_item({"video": str(good), "prompt": "p", "segments": [seg]})
        assert str(good) in str(err.value)
    near = task.prepare_item({"video": str(good), "prompt": "p", "segments": [[3.0, 4.3]]})
    assert near["segments"] == [[3.0, 4.0]]  # within tolerance: clipped to the end
    # a container without a frame rate: skipped (never guessed) unless fallback_fps is set
    import mmrl.adapters.video.decode as video_mod

    nofps = tmp_path / "nofps.mp4"
    shutil.copy(good, nofps)
    # decord reports the container rate in __init__; make it report none (as for a container without one)
    monkeypatch.setattr(video_mod._DecordSource, "fps", property(lambda self: 0.0, lambda self, v: None), raising=False)
    with pytest.raises(SkipItem, match="no frame rate") as err:
        task.prepare_item({"video": str(nofps), "prompt": "p", "segments": [[0.0, 1.0]]})
    assert "nofps.mp4" in str(err.value)
    with_fallback = tg_task(tmp_path, "task.video.fallback_fps=4.0")
    assert with_fallback.prepare_item({"video": str(nofps), "prompt": "p", "segments": [[0.0, 1.0]]})["duration"] == 4.0


def test_config_errors():
    for overrides, msg in [
        (["task.data_format=charades"], "needs an annotation file"),
        (["task.reward_kind=iou"], "reward_kind"),
        (["algo.tgrpo.shuffled_group=-2"], "shuffled_group"),
        (["task.video.max_frames=1"], "task.video"),
        (["model=tiny_lm"], "model.type=causal_lm cannot run task video_temporal_grounding"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            cfg = load_config(["task=video_temporal_grounding", *overrides])
            VideoTemporalGroundingTask(cfg.task, cfg)
    # T-GRPO is an algorithm option; its correctness reward must be one of the task's rewards
    from mmrl.config.validate import check_algo_against_task

    cfg = load_config(
        ["task=video_temporal_grounding", "algo.tgrpo.shuffled_group=2", "algo.tgrpo.correct_reward=accuracy"]
    )
    names = [s.name for s in VideoTemporalGroundingTask(cfg.task, cfg).reward_specs()]
    with pytest.raises(
        ConfigError, match="not a reward of task=video_temporal_grounding; choose from temporal, format"
    ):
        check_algo_against_task(cfg.algo, names, "video_temporal_grounding")
    tg = load_config(["task=video_temporal_grounding"])
    assert tg.algo.tgrpo.correct_reward == "temporal" and tg.algo.tgrpo.threshold == 0.5
    qa = load_config(["task=video_qa"])
    assert qa.task.video.max_frames == 16 and qa.algo.tgrpo.correct_reward == "accuracy"
    with pytest.raises(ConfigError, match="option_order"):
        load_config(["task=video_qa", "task.option_order=sorted"])


def test_fixed_option_order_moves_the_answer_letter():
    from mmrl.tasks.video.video_qa import fixed_option_order

    rec = {"question_type": "multiple_choice", "options": ["blue", "yellow", "red", "green"], "answer": "B"}
    out = fixed_option_order(rec)  # the answer was "yellow": last in palette order red, green, blue, yellow
    assert out["options"] == ["red", "green", "blue", "yellow"] and out["answer"] == "D"
    assert rec["answer"] == "B"  # the input record is not modified
    tg = load_config(["task=video_temporal_grounding", "model=tiny_qwen3_vl"])
    assert VideoTemporalGroundingTask(tg.task, tg).sampling.size_multiple == 32


# ----------------------------------------------------------------------------- end to end


def test_two_step_training_run_with_tgrpo_and_a_bad_video(tmp_path, vids):
    """SFT warm start + 2 GRPO steps with T-GRPO on the tiny Qwen2.5-VL; a corrupt video is skipped and counted."""
    from mmrl.trainer import Trainer

    cfg = load_config(
        [
            "task=video_temporal_grounding",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=e2e",
            "task.num_train=6",
            "task.num_eval=2",
            f"task.video.cache_dir={tmp_path / 'frames'}",
            "algo.tgrpo.shuffled_group=2",
            "trainer.max_steps=2",
            "trainer.batch_size=3",
            "trainer.warm_start.steps=2",
            "trainer.eval.every=0",
            "trainer.eval.at_end=true",
            "trainer.eval.size=2",
            "trainer.optim.lr=0.01",
            "algo.group_size=3",
            "model.max_new_tokens=6",
            *TG_BASE,
            # Qwen2.5-VL (time via second_per_grid_ts) on 4 s videos at 4 fps: 8 frames of 84x56
            "model=tiny_qwen2_5_vl",
            "task.video_duration_s=4",
            "task.video_fps=4",
        ]
    )
    tr = Trainer(cfg)
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video" * 100)
    tr.train_items[0] = {**tr.train_items[0], "video": str(bad)}
    before = [p.detach().clone() for p in tr.policy.trainable_parameters()]
    seen = []
    tr.callbacks.append(lambda t, m: seen.append(m))
    out = tr.fit()
    changed = sum(not torch.equal(b, p) for b, p in zip(before, tr.policy.trainable_parameters()))
    assert changed > len(before) // 2
    assert len(seen) == 2 and all(math.isfinite(m["loss/policy"]) for m in seen)
    assert all(m["rollout/logp_abs_diff"] < 1e-4 for m in seen)
    assert all(m["video/frames"] == 8.0 and m["video/visual_tokens"] == 24.0 for m in seen)
    assert all("tgrpo/bonus_frac" in m and m["tgrpo/compared_groups"] >= 1 for m in seen)
    # the shuffled probes (2 per prompt) never reach the update: at most 3 prompts x 3 ordered samples train
    assert all(m["update/samples"] <= 9.0 for m in seen)
    assert tr.skipped_total >= 1 and seen[-1]["data/skipped_total"] == tr.skipped_total
    assert "eval/miou" in out and out["eval/n"] == 2.0
    assert (tr.run_dir / "sft_metrics.jsonl").exists()
