"""Sampling primitives the policies call: counter-based noise (``noise``), seeded token sampling with behaviour
log-probs (``token_sampler``), the stochastic diffusion sampling maths (``sde_math``) and the optional vLLM engine
(``vllm_engine``). The trainer's side of a step's rollouts (prompts drawn, scored, filtered) is :mod:`mmrl.collector`.
"""
