"""Token sampling for HF `generate` with per-sample seeds and behaviour log-probs.

:class:`SeededTokenSampler` is a logits processor used with greedy decoding: at every step it
applies temperature, token suppression and top-p, adds Gumbel noise drawn from each row's own seed
(Gumbel-max trick: ``argmax(z + G)`` is a sample of ``softmax(z)``), and records the behaviour log-prob
``log_softmax(z)`` of the token it picks, with ``z = logits/T`` and the suppressed ids at -inf — the
distribution it samples from and the same formula the trainer uses
(:func:`mmrl.policies.token_policy.token_logp_and_entropy` with the policy's ``suppress_ids``), so the
rollout-vs-trainer gap measures numerics only. Top-p truncation is a sampling device and, as in the
usual GRPO/PPO recipes, not part of the recorded log-prob. No per-step logits are kept, so memory
does not grow with vocabulary x length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmrl.rollout.noise import counter_gumbel


def top_p_mask(logits: Tensor, top_p: float) -> Tensor:
    """Boolean mask [N, V] of the tokens outside the nucleus (smallest set with mass >= top_p)."""
    if top_p >= 1.0:
        return torch.zeros_like(logits, dtype=torch.bool)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted)
    drop.scatter_(-1, order, drop_sorted)
    return drop


class SeededTokenSampler:
    """Logits processor that samples with per-row seeds; pair it with ``do_sample=False``."""

    def __init__(
        self,
        seeds: list[int] | Tensor,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        suppress_ids: list[int] | None = None,
        greedy: bool = False,
        max_steps: int | None = None,
    ) -> None:
        self.seeds = torch.as_tensor(seeds, dtype=torch.int64)
        self.max_steps = max_steps
        """Steps the generation can run at most (``max_new_tokens``): noise blocks stop there; None: no bound."""
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.suppress_ids = list(suppress_ids or [])
        self.greedy = greedy or self.temperature <= 0
        self.step = 0
        self.logps: list[Tensor] = []
        self._block: Tensor | None = None
        self._block_start = 0

    # noise for several steps is drawn in one vectorised call (same values as step by step)
    _BLOCK_ELEMENTS = 1 << 22

    def _noise(self, n: int, device) -> Tensor:
        block = self._block
        if block is None or not (self._block_start <= self.step < self._block_start + block.shape[1]):
            steps = max(1, min(64, self._BLOCK_ELEMENTS // max(1, len(self.seeds) * n)))
            if self.max_steps is not None:  # never draw noise for steps generation cannot reach
                steps = max(1, min(steps, self.max_steps - self.step))
            self._block_start = self.step
            self._block = block = counter_gumbel(
                self.seeds, torch.arange(self.step, self.step + steps), n, device=device
            )
        return block[:, self.step - self._block_start]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        temp = self.temperature if self.temperature > 0 else 1.0
        scaled = scores.float() / temp
        masked = suppressed = scaled
        if self.suppress_ids:
            masked = suppressed = scaled.index_fill(
                -1, torch.as_tensor(self.suppress_ids, device=scaled.device), float("-inf")
            )
        if not self.greedy:
            if self.top_p < 1.0:
                masked = masked.masked_fill(top_p_mask(masked, self.top_p), float("-inf"))
            masked = masked + self._noise(masked.shape[-1], masked.device)
        choice = masked.argmax(-1, keepdim=True)
        # behaviour log-prob of the choice under log_softmax of the suppressed, tempered logits (the trainer's formula)
        allowed = suppressed if self.suppress_ids else scaled
        self.logps.append((allowed.gather(-1, choice) - allowed.logsumexp(-1, keepdim=True))[:, 0])
        self.step += 1
        return masked  # its argmax is the sampled token; greedy decoding picks exactly that

    def behaviour_logp(self, length: int) -> Tensor:
        """[N, length] log-probs of the chosen tokens (steps beyond those run are 0)."""
        if not self.logps:
            return torch.zeros(len(self.seeds), length)
        lp = torch.stack(self.logps, dim=1)[:, :length]
        if lp.shape[1] < length:
            lp = torch.cat([lp, lp.new_zeros(lp.shape[0], length - lp.shape[1])], dim=1)
        return lp


@dataclass
class Completions:
    """Generated completions, right-padded."""

    ids: Tensor
    """[N, L] token ids (pad after the end)."""
    mask: Tensor
    """[N, L] float, 1 on generated tokens up to and including the first EOS."""
    logp: Tensor
    """[N, L] behaviour log-probs (0 on padding)."""
    truncated: Tensor
    """[N] bool, True where no EOS was produced within the limit."""


def completion_mask(ids: Tensor, eos_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row hit no EOS."""
    is_eos = torch.zeros_like(ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= ids == e
    before = is_eos.int().cumsum(1) - is_eos.int()  # EOS seen strictly before this position
    mask = (before == 0).float()
    truncated = ~is_eos.any(1)
    return mask, truncated


def shared_prefill_cache(model, input_ids: Tensor, attention_mask: Tensor, group_size: int):
    """A KV cache of every prompt but its last token, computed ONCE per group of ``group_size`` consecutive identical
    rows and repeated to all rows; None when it does not apply (``group_size`` 1, a one-token prompt, rows of a
    group that differ). ``generate`` given it (and the full ``input_ids``) runs only the last prompt token and the
    completion, with the same outputs as a prefill of every copy (tested: equal tokens, log-probs within 1e-6)."""
    from transformers import DynamicCache

    n = input_ids.shape[0]
    if group_size <= 1 or n % group_size or input_ids.shape[1] < 2 or int(attention_mask.sum(1).min()) < 2:
        return None
    ids = input_ids.view(n // group_size, group_size, -1)
    att = attention_mask.view(n // group_size, group_size, -1)
    if not (torch.equal(ids, ids[:, :1].expand_as(ids)) and torch.equal(att, att[:, :1].expand_as(att))):
        return None
    u_ids, u_att = ids[:, 0, :-1], att[:, 0, :-1]
    cache = DynamicCache(config=model.config)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(model) else {}
    with torch.no_grad():
        model(
            input_ids=u_ids,
            attention_mask=u_att,
            position_ids=(u_att.cumsum(1) - 1).clamp(min=0),
            **{cache_kwarg(model): cache},
            use_cache=True,
            **keep,
        )
    cache.batch_repeat_interleave(group_size)
    return cache


def _forward_params(model) -> set[str]:
    """The keyword parameters of the model's forward (under a PEFT wrapper, the wrapped model's)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(base.forward).parameters)


def cache_kwarg(model) -> str:
    """The keyword a transformers model takes its KV cache by: ``cache`` (newer 5.x releases, where
    ``past_key_values`` is deprecated) or ``past_key_values``."""
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def generate_completions(
    model,
    inputs: dict,
    *,
    seeds: list[int],
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    suppress_ids: list[int] | None = None,
    greedy: bool = False,
    prefill_group: int = 1,
) -> Completions:
    """Batched HF `generate` (KV cache, left-padded prompts) with seeded sampling.

    ``prefill_group=G`` (text prompts only: ``inputs`` holds just ``input_ids`` / ``attention_mask``, rows in groups
    of G identical prompts): the prompts are prefilled once per group (:func:`shared_prefill_cache`)."""
    from transformers import GenerationConfig, LogitsProcessorList

    if prefill_group > 1 and set(inputs) == {"input_ids", "attention_mask"}:
        cache = shared_prefill_cache(model, inputs["input_ids"], inputs["attention_mask"], prefill_group)
        if cache is not None:
            inputs = {**inputs, cache_kwarg(model): cache}

    sampler = SeededTokenSampler(
        seeds,
        temperature=temperature,
        top_p=top_p,
        suppress_ids=suppress_ids,
        greedy=greedy,
        max_steps=max_new_tokens,
    )
    gen_cfg = GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
        num_beams=1,
    )
    prompt_len = inputs["input_ids"].shape[1]
    with torch.no_grad():
        # synced_gpus=False: transformers turns it on for FSDP-managed modules and then all-reduces at every token, which
        # pairs up only if every rank generates as often (DAPO rounds, VLA episode steps differ); under
        # trainer.strategy=fsdp2 the weights are gathered for the whole rollout, so no rank needs the others
        out = model.generate(
            **inputs, generation_config=gen_cfg, logits_processor=LogitsProcessorList([sampler]), synced_gpus=False
        )
    ids = out[:, prompt_len:]
    mask, truncated = completion_mask(ids, eos_ids)
    logp = sampler.behaviour_logp(ids.shape[1]) * mask
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
    return Completions(ids=ids, mask=mask, logp=logp, truncated=truncated)
