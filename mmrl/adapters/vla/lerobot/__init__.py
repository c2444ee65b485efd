"""LeRobot's flow-matching VLAs in mmrl: SmolVLA's and π0's architectures, checkpoint layouts and preprocessing.

mmrl's own implementation (LeRobot is not a dependency: it needs Python >= 3.12 and torch < 2.12), written from
the SmolVLA paper (arXiv 2506.01844) and the published checkpoint layout on transformers' SmolVLM and Llama
building blocks. Parity with LeRobot 0.6.1 on the same weights is checked by ``tests/adapters/vla/test_lerobot_smolvla.py``
against fixtures written by ``scripts/lerobot_fixtures.py`` in a separate reference environment.

Modules (imported lazily; this file imports nothing heavy):

- ``layers``: RoPE, block-causal masks, masked GQA attention, the Llama- and Gemma-style decoder block containers.
- ``smolvla``: ``SmolVLAConfig``, ``SmolVLAModel`` (VLM prefix cache + action expert, Euler sampling via
  ``sde_math.ode_step``, flow-matching loss) and ``FlowExpertView`` (the expert behind ``flow_chain``'s interface,
  for Flow-SDE / Flow-Noise RL).
- ``pi0``: ``PI0Config``, ``PI0Model`` (π0, arXiv 2410.24164: PaliGemma prefix cache + Gemma action expert with
  joint attention, the state token in the suffix; Euler sampling, flow-matching loss; ``FlowExpertView`` drives it
  too) and ``PI0PrefixCache``. Parity with LeRobot's ``pi0``: ``tests/adapters/vla/test_lerobot_pi0.py``.
- ``pi05``: ``PI05Model`` (π0.5: adaRMS time conditioning in the expert, the state discretised into the prompt by
  ``processing.state_prompts``); loaded by ``checkpoint.load_pi0`` too, same parity tests.
- ``processing``: image resize-with-padding, state/action (un)normalisation, prompt tokenisation, camera checks.
- ``pipeline``: ``SmolVLAPipeline``: raw observations -> action chunk (``predict_action_chunk``) and LeRobot's loss
  (``flow_loss``); ``PI0Pipeline`` the same for π0.
- ``checkpoint``: ``load_smolvla(folder)`` / ``save_smolvla(pipeline, folder)`` in LeRobot's ``save_pretrained``
  layout, ``load_pi0(folder)`` (π0 and π0.5), ``load_policy(folder)`` / ``save_policy`` by config.json's ``type``.
- ``tiny``: ``build_tiny_smolvla``: a random tiny SmolVLA from config, offline.
- ``roundtrip``: one training step on a fixture, saved for LeRobot to reload (``python -m ...roundtrip OUT``).
"""

from __future__ import annotations

from mmrl.errors import ConfigError

__all__ = ["LeRobotCheckpointError"]


class LeRobotCheckpointError(ConfigError):
    """A LeRobot checkpoint folder that mmrl cannot load or whose inputs do not match what is given (one line)."""
