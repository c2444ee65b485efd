"""Shared pieces of the agent tests: the tiny Qwen3-VL agent policy and an environment that plays scripted turns."""

from __future__ import annotations

import json

from PIL import Image

from mmrl.agents.config import AgentConfig, AgentVLMConfig
from mmrl.agents.environment import StepResult, ToolEnvironment
from mmrl.agents.policy import AgentVLMPolicy
from mmrl.agents.tools import load_tools
from mmrl.policies.base import PromptBatch


def zoom_call(box) -> str:
    return f"<tool_call>{json.dumps({'name': 'zoom', 'arguments': {'bbox_2d': list(box)}})}</tool_call>"


class ScriptedToolEnv(ToolEnvironment):
    """The default tool environment, except that turn ``k`` reads ``script[k]`` instead of the model's text while the
    script lasts (a random tiny model never writes a tool call; the token accounting is the same whoever wrote it)."""

    def __init__(self, tools, script, **kw) -> None:
        super().__init__(tools, timeout_s=5, **kw)
        self.script = list(script)
        self.turn = 0

    def step(self, completion: str) -> StepResult:
        text = self.script[self.turn] if self.turn < len(self.script) else completion
        self.turn += 1
        return super().step(text)


def make_policy(folder: str, script, *, max_turns: int = 4, max_tokens: int = 600, over_turn: str = "mask", **model_kw):
    from mmrl.models.tiny_vlm import load_vlm

    lm, proc = load_vlm(folder)
    tools = load_tools(["zoom"])
    cfg = AgentVLMConfig(path=folder, **{"max_new_tokens": 8, **model_kw})
    agent = AgentConfig(max_turns=max_turns, max_tokens=max_tokens, over_turn=over_turn)
    return AgentVLMPolicy(lm, proc, cfg, agent, tools=tools, make_env=lambda item, t: ScriptedToolEnv(t, script))


def scene(w: int, h: int, color=(200, 30, 30)) -> Image.Image:
    img = Image.new("RGB", (w, h), (235, 235, 235))
    img.paste(Image.new("RGB", (w // 5, h // 5), color), (w // 2, h // 3))
    return img


def batch() -> PromptBatch:
    items = [
        {"image": scene(160, 128), "prompt": "What is on the red tile?"},
        {"image": scene(128, 160, (20, 40, 200)), "prompt": "Read the blue tile."},
    ]
    return PromptBatch(items=items, indices=[0, 1], seeds=[5, 6])
