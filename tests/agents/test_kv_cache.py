"""Continuing each turn from the previous turn's KV cache (mmrl/agents/kv_cache.py) samples exactly what re-encoding
the whole trajectory each turn samples: the same tokens and behaviour log-probs (within 1e-5) on the tiny Qwen3-VL,
with zoom crops added mid-trajectory (new images, 3-D positions), with text-only tool results (positions from the
kept rotary offsets), and with trajectories that end at different turns (cache rows dropped); the training forward
gives the cached path's log-probs back (ratio 1 within 1e-6)."""

import pytest
import torch

pytest.importorskip("transformers")

from mmrl.agents.tools import load_tools  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from tests.agents.agent_helpers import ScriptedToolEnv, batch, make_policy, zoom_call  # noqa: E402

MULTIPLY = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'


@pytest.fixture(scope="module")
def folder() -> str:
    return resolve_vlm("tiny_qwen3_vl")


def both_ways(policy):
    runs = {}
    for reuse in (True, False):
        policy.agent.reuse_cache = reuse
        before = dict(policy.turn_counts)
        runs[reuse] = policy.rollout(batch(), 2)
        runs[reuse].metrics["continued"] = policy.turn_counts["continued"] - before["continued"]
    return runs[True], runs[False]


def assert_same(cached, plain, policy):
    assert cached.metrics["continued"] > 0 and plain.metrics["continued"] == 0
    assert torch.equal(cached.mask, plain.mask)
    for a, b in zip(cached.payload["trajectories"], plain.payload["trajectories"]):
        assert torch.equal(a.rest_ids(), b.rest_ids())
        assert float((a.behaviour_logp() - b.behaviour_logp()).abs().max()) < 1e-5
    with torch.no_grad():
        out = policy.log_probs(cached)
    assert float(((out.logp - cached.rollout_logp) * cached.mask).abs().max()) < 1e-6


def test_cache_reuse_equals_reencoding_with_images_added_mid_trajectory(folder):
    policy = make_policy(folder, [zoom_call([400, 250, 700, 600]), zoom_call([0, 0, 500, 500])])
    cached, plain = both_ways(policy)
    assert cached.metrics["agent/turns"] == 3.0 and cached.metrics["continued"] == 8  # 4 rows x turns 2 and 3
    assert_same(cached, plain, policy)


def test_cache_reuse_equals_reencoding_with_text_results_and_rows_ending_at_different_turns(folder):
    policy = make_policy(folder, [])
    tools = load_tools(["tests/agents/trl_style_tools.py:multiply", "zoom"])
    scripts = {  # the first prompt's trajectories call twice (text, then an image), the second's answer at once
        "What is on the red tile?": [MULTIPLY, zoom_call([100, 100, 600, 600])],
        "Read the blue tile.": ["<answer>3</answer>"],
    }
    policy.tools = tools
    policy.make_env = lambda item, t: ScriptedToolEnv(tools, scripts[item["prompt"]])
    cached, plain = both_ways(policy)
    assert [s["num_turns"] for s in cached.samples] == [3, 3, 1, 1]
    assert cached.samples[0]["turns"][0]["observation"] == "42"
    assert_same(cached, plain, policy)


def test_cache_reuse_equals_reencoding_when_turns_end_at_different_lengths(folder):
    """Many end-of-turn ids make rows of one turn end at different steps: the cache then holds, between a row's turn
    and its observation, tokens generated after the row's end, which the attention mask must hide."""
    policy = make_policy(folder, [zoom_call([400, 250, 700, 600]), zoom_call([0, 0, 500, 500])], max_new_tokens=12)
    policy.eos_ids = policy.eos_ids + list(range(200, 700))
    cached, plain = both_ways(policy)
    first_turns = [len(t.segments[0].ids) for t in cached.payload["trajectories"]]
    assert len(set(first_turns)) > 1 and max(first_turns) < 12  # ragged turns: garbage columns in the cache
    assert cached.metrics["continued"] == 8
    assert_same(cached, plain, policy)
