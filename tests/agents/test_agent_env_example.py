"""examples/agent_env/guess_env.py, the custom environment of docs/agents.md: selected by agent.environment, its
hints reach the model as context tokens (mask 0) between sampled turns, and its info is kept in the trajectory."""

from pathlib import Path

import pytest
import torch

from mmrl.agents.trajectory import GEN, OBS
from mmrl.config import load_config
from mmrl.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_env" / "guess_env.py"


def test_guess_env_hints_become_context_turns():
    from mmrl.builders import build_policy, build_task
    from mmrl.policies.base import PromptBatch

    cfg = load_config(
        [
            "task=visual_search",
            f"agent.environment={EXAMPLE}:GuessEnv",
            "agent.max_turns=3",
            "model.max_new_tokens=6",
            "task.num_train=4",
        ]
    )
    task = build_task(cfg)
    policy = build_policy(cfg, task)
    items = [task.prepare_item(it) for it in task.train_items()[:2]]
    env_cls = type(policy.make_env(items[0], {}))
    assert env_cls.__name__ == "GuessEnv"

    class Scripted(env_cls):  # the example's logic on scripted answers: one wrong guess, then the right digit
        def step(self, completion):
            wrong = (self.answer + 1) % 10
            return super().step(str(wrong) if not self.guesses else str(self.answer))

    policy.make_env = lambda item, tools: Scripted(item, tools)
    ro = policy.rollout(PromptBatch(items=items, indices=[0, 1], seeds=[3, 4]), 2)
    assert "<tools>" not in ro.payload["trajectories"][0].prompt.text  # a tool-less environment: no tool schemas
    for b, s in enumerate(ro.samples):
        answer = int(items[b // 2]["answer"])
        wrong = (answer + 1) % 10
        traj = ro.payload["trajectories"][b]
        assert [x.kind for x in traj.segments] == [GEN, OBS, GEN] and s["finished"] and s["num_turns"] == 2
        assert s["turns"][1]["guesses"] == [wrong, answer] and s["turns"][1]["reason"] == "right"
        hint = policy.tokenizer.decode(traj.segments[1].ids)
        assert f"Not {wrong}: the digit is {'higher' if answer > wrong else 'lower'}. Try again." in hint
        assert torch.equal(ro.mask[b, : traj.length], (traj.kinds() == GEN).float())
    with pytest.raises(ConfigError, match="agent.environment: give FILE.py:NAME"):
        load_config(["task=visual_search", "agent.environment=GuessEnv"])
