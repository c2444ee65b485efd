"""Evaluation outputs of agent trajectories (mmrl/agents/outputs.py): with a task folder (what `mmrl eval` gives),
task=visual_search writes trajectories.jsonl (turns, tool calls, observations) and each turn's zoom crops as PNG
files beside it, inside the policy's evaluation_outputs context."""

import json

import numpy as np
from PIL import Image

from mmrl.config import load_config
from tests.agents.agent_helpers import ScriptedToolEnv, zoom_call


def test_eval_writes_trajectories_and_their_crops(tmp_path):
    from mmrl.builders import build_policy, build_task
    from mmrl.policies.base import PromptBatch

    cfg = load_config(["task=visual_search", "task.num_eval=2", "model.max_new_tokens=6"])
    task = build_task(cfg)
    policy = build_policy(cfg, task)
    script = [zoom_call([0, 0, 500, 500]), zoom_call([500, 500, 1000, 1000])]
    policy.make_env = lambda item, tools: ScriptedToolEnv(tools, script)
    items = [task.prepare_item(it) for it in task.eval_items()]
    with policy.evaluation_outputs():
        ro = policy.rollout(PromptBatch(items=items, indices=[0, 1], seeds=[0, 1]), 1, greedy=True)
    assert not policy.record_images
    task.output_dir = tmp_path
    metrics = task.eval_metrics(items, ro.samples, {})
    assert metrics["eval/tool_call_rate"] == 1.0 and metrics["eval/turns"] == 3.0
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["eval-0", "eval-1"] and all(r["finished"] for r in rows)
    for r, item, traj in zip(rows, items, ro.payload["trajectories"]):
        assert [len(t["images"]) for t in r["turns"]] == [1, 1, 0]
        assert r["turns"][0]["tool_calls"][0]["info"]["zoom_box"] == [0.0, 0.0, 192.0, 192.0]
        assert r["turns"][2]["text"] == ro.samples[rows.index(r)]["text"]
        for t, crop in zip(r["turns"][:2], traj.full_inputs().images[1:]):
            saved = Image.open(tmp_path / t["images"][0])
            assert saved.size == crop.size == (192, 192)
            assert np.array_equal(np.asarray(saved.convert("RGB")), np.asarray(crop))
        top_left = np.asarray(item["image"])[:192, :192]
        assert np.array_equal(np.asarray(Image.open(tmp_path / r["turns"][0]["images"][0]).convert("RGB")), top_left)
