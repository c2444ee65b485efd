"""`task=visual_search` (tasks/agents/visual_search.py): deterministic synthetic scenes whose target tile is where the
item says, the V*-Bench style JSONL loader (one-line errors), the final-answer reward and zoom-IoU metric by hand, and
a short `mmrl train task=visual_search` run on the tiny Qwen3-VL that changes the parameters and logs the agent
metrics."""

import json
import math

import numpy as np
import pytest
import torch

from mmrl.config import load_config
from mmrl.errors import ConfigError
from mmrl.tasks.agents.visual_search import (
    VisualSearchConfig,
    VisualSearchTask,
    draw_scene,
    final_answer,
    is_correct,
    load_search_jsonl,
    search_metrics,
)


def test_scenes_are_deterministic_and_the_target_tile_is_where_the_item_says():
    task = VisualSearchTask(VisualSearchConfig(num_train=3, num_eval=2))
    a, b = task.train_items(), VisualSearchTask(VisualSearchConfig(num_train=3, num_eval=2)).train_items()
    assert [i["answer"] for i in a] == [i["answer"] for i in b]
    assert {i["id"] for i in task.eval_items()} == {"eval-0", "eval-1"}
    for item in a:
        prepared = task.prepare_item(item)
        again = task.prepare_item(item)
        assert np.array_equal(np.asarray(prepared["image"]), np.asarray(again["image"]))
        assert prepared["image"].size == (384, 384) and item["answer"] in "0123456789"
        color = item["question"].split(" the ")[1].split(" tile")[0]
        from mmrl.adapters.grounding.synthetic_scenes import PALETTE

        x1, y1, x2, y2 = (int(v) for v in item["target_box"])
        tile = np.asarray(prepared["image"])[y1:y2, x1:x2].reshape(-1, 3)
        share = float((tile == np.array(PALETTE[color])).all(1).mean())
        assert share > 0.6  # the tile is the asked colour (its digit covers the rest)
    _, tiles = draw_scene(7, (384, 384), 8, 22)
    boxes = [t["bbox"] for t in tiles]
    for i, p in enumerate(boxes):  # no two tiles overlap
        for q in boxes[i + 1 :]:
            assert p[2] <= q[0] or q[2] <= p[0] or p[3] <= q[1] or q[3] <= p[1]


def test_jsonl_loader_reads_vstar_rows_and_rejects_malformed_ones_in_one_line(tmp_path):
    f = tmp_path / "bench.jsonl"
    rows = [
        {
            "image": "a.png",
            "question": "What colour is the cup?",
            "options": ["red", "blue"],
            "answer": "B",
            "bbox": [1, 2, 30, 40],
        },
        {"image": "/abs/b.png", "text": "How many?", "label": 3},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    got = load_search_jsonl(f)
    assert got[0]["image"] == str(tmp_path / "a.png") and got[0]["target_box"] == [1.0, 2.0, 30.0, 40.0]
    assert got[1] == {
        "id": "bench:2",
        "image": "/abs/b.png",
        "question": "How many?",
        "options": None,
        "answer": "3",
        "target_box": None,
    }
    bad = {
        "{oops": "not a JSON object",
        json.dumps({"question": "q", "answer": "a"}): "'image' must be a path string",
        json.dumps({"image": "x.png", "answer": "a"}): "'question' (or 'text') must be a non-empty string",
        json.dumps(
            {"image": "x.png", "question": "q", "options": ["a", "b"], "answer": "C"}
        ): "is neither an option letter",
        json.dumps({"image": "x.png", "question": "q", "answer": "a", "bbox": [5, 5, 1, 9]}): "'bbox' must be",
    }
    for line, words in bad.items():
        f.write_text(json.dumps(rows[0]) + "\n" + line + "\n")
        with pytest.raises(ConfigError) as e:
            load_search_jsonl(f)
        assert str(e.value).startswith(f"{f}:2: ") and words in str(e.value) and "\n" not in str(e.value)


def test_answer_reward_and_zoom_iou_by_hand():
    assert final_answer("I zoomed. <answer> 7 </answer>") == "7" and final_answer("(B).") == "B"
    assert is_correct("7", "7", None) and not is_correct("1", "7", None) and not is_correct("", "7", None)
    assert is_correct("b", "blue", ["red", "blue"]) and is_correct("Blue", "B", ["red", "blue"])
    items = [{"answer": "7", "options": None, "target_box": [5.0, 0.0, 15.0, 10.0]}] * 2
    samples = [
        {
            "text": "<answer>7</answer>",
            "num_turns": 2,
            "num_tool_calls": 1,
            "over_turn": False,
            "tool_calls": [{"name": "zoom", "error": None, "info": {"zoom_box": [0.0, 0.0, 10.0, 10.0]}}],
        },
        {"text": "<answer>3</answer>", "num_turns": 1, "num_tool_calls": 0, "over_turn": False, "tool_calls": []},
    ]
    m = search_metrics(items, samples, "eval")
    assert m["eval/accuracy"] == 0.5 and m["eval/tool_call_rate"] == 0.5 and m["eval/turns"] == 1.5
    assert m["eval/zoom_iou_when_used"] == pytest.approx(50 / 150)  # overlap 5x10 over union 150
    assert m["eval/zoom_iou"] == pytest.approx(50 / 300)  # the trajectory without a zoom scores 0
    cfg = load_config(["task=visual_search", "task.zoom_iou_weight=0.5", "agent.over_turn=penalize"])
    task = VisualSearchTask(cfg.task, cfg)
    specs = {s.name: s for s in task.reward_specs()}
    assert sorted(specs) == ["answer", "over_turn", "zoom_iou"] and specs["over_turn"].weight == -1.0
    cols = task.reward_columns(items)
    assert specs["answer"].fn([], samples, **cols) == [1.0, 0.0]
    assert specs["zoom_iou"].fn([], samples, **cols) == pytest.approx([1 / 3, 0.0])


def test_task_config_selects_the_agent_policy_for_any_qwen_vl_preset():
    cfg = load_config(["task=visual_search", "model=tiny_qwen2_5_vl"])
    assert cfg.model.type == "vlm_agent" and cfg.agent.max_turns == 3 and cfg.model.max_pixels == 16384
    from mmrl.builders import build_policy, build_task

    plain = load_config(["task=visual_search", "agent.tools=[none]"])
    policy = build_policy(plain, build_task(plain))
    assert policy.tools == {}  # the no-tool baseline: no schemas in the prompt, every turn is a final answer
    assert policy.make_env({}, policy.tools).tools == {}
    with pytest.raises(ConfigError, match="agent.over_turn: 'sometimes' is not valid"):
        load_config(["task=visual_search", "agent.over_turn=sometimes"])


def test_visual_search_trains_on_the_tiny_vlm(tmp_path):
    from mmrl.trainer import Trainer

    cfg = load_config(
        [
            "task=visual_search",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=r",
            "task.num_train=4",
            "task.num_eval=1",
            "trainer.batch_size=2",
            "algo.group_size=2",
            "trainer.max_steps=1",
            "trainer.eval.every=0",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
            "model.max_new_tokens=8",
            "agent.max_turns=2",
            "reward.fns=[tests/agents/length_reward.py:text_length]",
            "trainer.warm_start.steps=1",
            "trainer.warm_start.batch_size=2",
        ]
    )
    tr = Trainer(cfg)
    assert type(tr.policy).__name__ == "AgentVLMPolicy" and sorted(tr.policy.tools) == ["zoom"]
    before = [p.detach().clone() for p in tr.policy.trainable_parameters()]
    final = tr.fit()
    changed = sum(not torch.equal(b, p) for b, p in zip(before, tr.policy.trainable_parameters()))
    assert changed > len(before) // 2
    assert math.isfinite(final["loss/policy"]) and final["rollout/logp_abs_diff"] < 1e-5
    for key in (
        "agent/turns",
        "agent/tool_call_rate",
        "search/accuracy",
        "search/zoom_iou",
        "eval/accuracy",
        "eval/turns",
    ):
        assert key in final
    assert final["eval/n"] == 1.0 and 1.0 <= final["agent/turns"] <= 2.0
    sft = [json.loads(line) for line in (tmp_path / "r" / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["sft/step"] for r in sft] == [1] and all(math.isfinite(r["sft/loss"]) for r in sft)


def test_warm_start_target_zooms_on_the_target_in_the_models_frame_and_trains_only_its_turns():
    """The SFT target of an item: a zoom call on the target's box grown by one box size (0-1000 numbers of the
    tiny Qwen3-VL, hand-computed), then the answer; its teacher trajectory holds the real crop as context, and the
    loss is the mean cross-entropy of the two turns' tokens only (equal to the log-probs of the same trajectory)."""
    from mmrl.builders import build_policy, build_task
    from mmrl.policies.base import PromptBatch, Rollout

    cfg = load_config(["task=visual_search", "task.num_train=4"])
    task = build_task(cfg)
    policy = build_policy(cfg, task)
    items = [task.prepare_item(it) for it in task.train_items()[:2]]
    metas = policy.sample_meta(items)
    targets = [task.sft_target(it, m) for it, m in zip(items, metas)]
    for item, target in zip(items, targets):
        x1, y1, x2, y2 = item["target_box"]
        w, h = x2 - x1, y2 - y1
        grown = [max(0, x1 - w), max(0, y1 - h), min(384, x2 + w), min(384, y2 + h)]
        want = [int(math.floor(v * 1000 / 384 + 0.5)) for v in grown]
        assert target == [
            '<tool_call>{"name": "zoom", "arguments": {"bbox_2d": ' + json.dumps(want) + "}}</tool_call>",
            f"<answer>{item['answer']}</answer>",
        ]
        traj = policy.teacher_trajectory(item, target)
        assert [s.kind for s in traj.segments] == [1, 2, 1] and len(traj.full_inputs().images) == 2
        px = [v * 384 / 1000 for v in want]
        crop = traj.full_inputs().images[1]
        assert crop.size == (round(px[2]) - int(px[0]), round(px[3]) - int(px[1]))
        turn_tokens = [len(policy.tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in target]
        assert max(turn_tokens) <= cfg.model.max_new_tokens  # the default turn limit fits a zoom call
        assert traj.length < cfg.agent.max_tokens  # and the budget the whole target trajectory
    no_zoom = load_config(["task=visual_search", "task.sft_zoom=false"])
    assert build_task(no_zoom).sft_target(items[0], metas[0]) == f"<answer>{items[0]['answer']}</answer>"
    batch = PromptBatch(items=items, indices=[0, 1], seeds=[0, 1])
    loss = policy.sft_loss(batch, targets)
    trajs = [policy.teacher_trajectory(it, t) for it, t in zip(items, targets)]
    T = max(t.length for t in trajs)
    mask = torch.stack([torch.nn.functional.pad((t.kinds() == 1).float(), (0, T - t.length)) for t in trajs])
    ro = Rollout(
        rollout_logp=torch.zeros_like(mask),
        mask=mask,
        group_id=torch.zeros(2, dtype=torch.long),
        samples=[{}, {}],
        payload={"trajectories": trajs},
    )
    suppressed, policy.suppress_ids = policy.suppress_ids, []  # SFT is the plain cross-entropy (full softmax)
    with torch.no_grad():
        ref = -(policy.log_probs(ro).logp * mask).sum() / mask.sum()
    policy.suppress_ids = suppressed
    assert policy.cfg.temperature == 1.0 and float(loss.detach()) == pytest.approx(float(ref), rel=1e-5)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())


def test_items_match_samples_outside_the_repository_root(tmp_path):
    """The task's modules import each other as ``mmrl.tasks.*``: a run started outside the repository root (the
    ``mmrl`` console script, where ``tasks`` is no top-level package) matches items to samples too (it once imported
    ``tasks.video.common`` and every evaluation of an installed ``mmrl train task=visual_search`` stopped there)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path = [p for p in sys.path if p not in ('', '.')]\n"
        "from mmrl.tasks.agents.visual_search import VisualSearchTask\n"
        "print(VisualSearchTask._per_sample([{'id': 'a'}, {'id': 'b'}], [{}] * 4))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-400:]
    assert out.stdout.strip() == "[{'id': 'a'}, {'id': 'a'}, {'id': 'b'}, {'id': 'b'}]"
