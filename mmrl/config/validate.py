"""Checks of a built run config against the registries (algorithm names) and across fields (sampling settings and
the rollout engine's limits): each raises :class:`ConfigError` with one line naming the key."""

from __future__ import annotations

from typing import Any

from mmrl.config.schema import AlgoConfig, TrainerConfig
from mmrl.errors import ConfigError, check_choice


def validate_algo(algo: AlgoConfig) -> None:
    """Cross-check algorithm names against the registries."""
    from mmrl.algos import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, advantage_choices

    check_choice(algo.advantage, advantage_choices(), "algo.advantage")
    check_choice(algo.policy_loss, POLICY_LOSSES.names(), "algo.policy_loss")
    check_choice(algo.loss_agg, AGGREGATIONS.names(), "algo.loss_agg")
    check_choice(algo.kl_estimator, KL_ESTIMATORS.names(), "algo.kl_estimator")
    check_choice(algo.adv_scale, ("group", "batch", "none"), "algo.adv_scale")
    check_choice(algo.old_logp, ("auto", "recompute", "rollout", "interpolate"), "algo.old_logp")
    from mmrl.algos.importance import IS_MODES

    check_choice(algo.is_mode, IS_MODES, "algo.is_mode")
    if not algo.is_cap > 0:
        raise ConfigError(f"algo.is_cap must be > 0 (the cap of the importance weights), got {algo.is_cap}")
    if not algo.adv_eps >= 0:
        raise ConfigError(
            f"algo.adv_eps must be >= 0 (an all-equal group gets advantage 0 even with 0), got {algo.adv_eps}"
        )
    if algo.group_size < 1 or algo.ppo_epochs < 1 or algo.num_minibatches < 1:
        raise ConfigError("algo.group_size, algo.ppo_epochs and algo.num_minibatches must be >= 1")
    if algo.max_staleness < 0:
        raise ConfigError(f"algo.max_staleness must be >= 0 (0: on-policy), got {algo.max_staleness}")


def validate_trainer(tr: TrainerConfig) -> None:
    check_choice(tr.optim.lr_schedule, ("constant", "linear", "cosine"), "trainer.optim.lr_schedule")
    check_choice(tr.device, ("auto", "cpu", "cuda"), "trainer.device")
    check_choice(tr.strategy, ("ddp", "fsdp2"), "trainer.strategy")
    if tr.fsdp.param_dtype is not None:
        check_choice(tr.fsdp.param_dtype, ("float32", "bfloat16", "float16"), "trainer.fsdp.param_dtype")
    if tr.batch_size < 1 or tr.grad_accum < 1 or tr.max_steps < 0:
        raise ConfigError("trainer.batch_size and trainer.grad_accum must be >= 1, trainer.max_steps >= 0")
    if tr.eval.samples < 1 or (tr.eval.samples > 1 and tr.eval.greedy):
        raise ConfigError(
            f"trainer.eval.samples={tr.eval.samples}: must be >= 1, and > 1 only with "
            "trainer.eval.greedy=false (greedy copies are identical)"
        )
    if tr.warm_start.max_items is not None and tr.warm_start.max_items < 1:
        raise ConfigError(
            f"trainer.warm_start.max_items must be >= 1 (or null for all items), got {tr.warm_start.max_items}"
        )
    check_choice(tr.rollout, ("sync", "async"), "trainer.rollout")
    if tr.rollout_workers < 1:
        raise ConfigError(f"trainer.rollout_workers must be >= 1, got {tr.rollout_workers}")
    if not 0 <= tr.learner_nice <= 19:
        raise ConfigError(f"trainer.learner_nice must be in [0, 19] (a niceness increase), got {tr.learner_nice}")


def validate_sampling(model: Any) -> None:
    """Sampling settings of a token model (``model.temperature`` / ``top_p``) and, with
    ``model.rollout_engine=vllm``, the values vLLM would reject or silently change (it raises temperatures in
    (0, 0.01) to 0.01 and refuses ones above 2), so the trainer's log-probs never use another temperature than the
    sampler's; plus the engine's own numeric settings."""
    import math

    if not hasattr(model, "temperature"):
        return
    t, top_p = model.temperature, getattr(model, "top_p", 1.0)
    if not (math.isfinite(t) and t > 0):
        raise ConfigError(
            f"model.temperature must be a finite number > 0 (rollouts sample, and log-probs are "
            f"computed, at logits / temperature), got {t}"
        )
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise ConfigError(f"model.top_p must be in (0, 1], got {top_p}")
    if getattr(model, "rollout_engine", "hf") != "vllm":
        return
    from mmrl.rollout.vllm_engine import check_vllm_sampling

    try:
        check_vllm_sampling(t, top_p)
    except ValueError as e:
        raise ConfigError(f"model.temperature with model.rollout_engine=vllm: {e}") from None
    if not 0 < model.vllm_gpu_memory_utilization <= 1:
        raise ConfigError(
            f"model.vllm_gpu_memory_utilization must be in (0, 1], got {model.vllm_gpu_memory_utilization}"
        )
    if model.vllm_max_images_per_prompt < 1:
        raise ConfigError(f"model.vllm_max_images_per_prompt must be >= 1, got {model.vllm_max_images_per_prompt}")


def check_algo_against_task(algo: AlgoConfig, reward_names: list[str], task_name: str) -> None:
    """ConfigError for algorithm settings that name something the task does not have (T-GRPO's correctness reward)."""
    if algo.tgrpo_enabled and algo.tgrpo.correct_reward not in reward_names:
        raise ConfigError(
            f"algo.tgrpo.correct_reward={algo.tgrpo.correct_reward!r} is not a reward of task={task_name}; "
            f"choose from {', '.join(reward_names)}"
        )
