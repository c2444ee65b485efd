"""Modality adapters: one folder per modality, holding what only that modality needs.

- ``grounding``: image grounding / VQA — box coordinate frames, box parsing, grounding datasets and
  converters, synthetic scenes, IoU rewards.
- ``video``: video understanding — decoding and frame sampling, the frame cache, synthetic clips,
  the VLM policy's video inputs, temporal-IoU and QA rewards.
- ``diffusion``: diffusion / flow-matching generation — the policy over diffusers pipelines, the SDE
  sampler, image rewards, the tiny offline pipelines.
- ``vla``: vision-language-action policies — the action tokenizer, the VLA policy, episodes and
  initial states, demonstrations, success tables.

The tasks that use an adapter live in the matching ``tasks/<adapter>/`` folder (``mmrl.tasks.<adapter>``).
Nothing under ``mmrl/`` outside this folder imports an adapter, with one declared exception: the
processor-driven VLM policy (``mmrl.policies.vlm``) hands video items to ``mmrl.adapters.video``.
"""
