"""Text-only token policy over any HF causal LM (the text RLVR adapter, and the toy task's policy).

Rollout: each prompt is tokenised once, repeated ``G`` times and sampled in one batched, left-padded
`generate` call with per-sample seeds (:mod:`mmrl.rollout.token_sampler`). Log-probs: one forward of
prompt + completion with explicit position ids (left padding shifts them otherwise), or with
``model.shared_prefix`` (the default) one packed row per distinct prompt holding its completions
(:mod:`mmrl.policies.shared_prefix`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from mmrl.policies import shared_prefix as sp
from mmrl.policies.base import LogProbOutput, PolicySpec, PromptBatch, Rollout
from mmrl.policies.token_policy import (
    HFTokenPolicy,
    ValueHead,
    apply_lora,
    left_pad,
    right_pad,
    token_logp_and_entropy,
)
from mmrl.rollout.noise import mix_seed
from mmrl.rollout.token_sampler import generate_completions


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class CausalLMPolicy(HFTokenPolicy):
    """A :class:`~mmrl.policies.base.Policy` whose actions are completion tokens of a causal LM."""

    def __init__(self, lm, tokenizer, cfg, *, value_head: bool = False, reference: bool = False) -> None:
        self.tokenizer = tokenizer
        if cfg.lora.enabled:
            lm = apply_lora(lm, cfg.lora)
        if cfg.gradient_checkpointing:
            lm.gradient_checkpointing_enable()
        head = ValueHead(lm.config.hidden_size) if value_head else None
        self._prompt_cache: dict[str, Tensor] = {}
        super().__init__(
            cfg,
            lm,
            tokenizer,
            pad_id=tokenizer.pad_token_id,
            eos_ids=[tokenizer.eos_token_id],
            value_head=head,
            reference=reference,
        )

    def _decode(self, ids: Tensor) -> list[str]:
        """Batch decode through the Rust backend when there is one (the Python wrapper is ~3x slower)."""
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if backend is not None and hasattr(backend, "decode_batch"):
            return backend.decode_batch(ids.tolist(), skip_special_tokens=True)
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def encode_prompts(self, prompts: list[str]) -> list[Tensor]:
        """Token ids of each prompt (memoised: datasets repeat their prompts every epoch)."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self._prompt_cache]
        if missing:
            if len(self._prompt_cache) > 100_000:
                self._prompt_cache.clear()
            ids = self.tokenizer(missing, add_special_tokens=False)["input_ids"]
            self._prompt_cache.update({p: torch.tensor(x, dtype=torch.long) for p, x in zip(missing, ids)})
        return [self._prompt_cache[p] for p in prompts]

    # ------------------------------------------------------------------ Policy API
    def rollout(self, batch: PromptBatch, group_size: int, *, greedy: bool = False) -> Rollout:
        prompt_ids = self.encode_prompts([it["prompt"] for it in batch.items])
        rep_ids = [p for p in prompt_ids for _ in range(group_size)]
        seeds = [mix_seed(s, j) for s in batch.seeds for j in range(group_size)]
        ids, att = left_pad(rep_ids, self.pad_id)
        lm = self.module.lm
        was_training = lm.training
        lm.eval()
        comp = generate_completions(
            lm,
            {"input_ids": ids.to(self.device), "attention_mask": att.to(self.device)},
            seeds=seeds,
            max_new_tokens=self.cfg.max_new_tokens,
            eos_ids=self.eos_ids,
            pad_id=self.pad_id,
            temperature=self.cfg.temperature,
            top_p=self.cfg.top_p,
            suppress_ids=self.suppress_ids,
            greedy=greedy,
            prefill_group=group_size if self.shared_prefix.enabled else 1,  # each prompt prefilled once
        )
        lm.train(was_training)
        texts = self._decode(comp.ids.cpu())
        lengths = comp.mask.sum(1).long().tolist()
        n = len(rep_ids)
        comp_lists = [comp.ids[i, : lengths[i]].cpu() for i in range(n)]
        samples = [  # completion_ids: the sampled token ids, what TRL passes its reward functions as completion_ids
            {"text": t, "length": k, "truncated": bool(tr), "completion_ids": ids.tolist()}
            for t, k, tr, ids in zip(texts, lengths, comp.truncated.tolist(), comp_lists)
        ]
        return self._first_rollout_check(
            Rollout(
                rollout_logp=comp.logp.cpu(),
                mask=comp.mask.cpu(),
                group_id=batch.group_ids(group_size),
                prompt_index=torch.arange(len(batch)).repeat_interleave(group_size),
                samples=samples,
                payload={"prompt_ids": rep_ids, "completion_ids": comp_lists},
                metrics={"rollout/truncated_frac": float(comp.truncated.float().mean())},
            )
        )

    def log_probs(self, rollout: Rollout, *, entropy: bool = False, values: bool = False) -> LogProbOutput:
        logp, ent, v = self._forward_logp(rollout, temperature=self.cfg.temperature, entropy=entropy, values=values)
        return LogProbOutput(logp=logp, entropy=ent, values=v)

    def _forward_logp(self, rollout: Rollout, *, temperature: float, entropy: bool = False, values: bool = False):
        """Log-probs (entropy, values) at the completion tokens: one forward of prompt + completion per sample, or,
        with ``model.shared_prefix``, one packed row per distinct prompt (:mod:`mmrl.policies.shared_prefix`)."""
        T = rollout.mask.shape[1]
        prompts = rollout.payload["prompt_ids"]
        c_ids = right_pad(rollout.payload["completion_ids"], self.pad_id, T)
        mask = rollout.mask

        def forward(rows: list[int], shared: bool):
            run = self._shared_forward if shared else self._plain_forward
            return run([prompts[i] for i in rows], c_ids[rows], mask[rows], values)

        keys = [p.numpy().tobytes() for p in prompts]  # identical token ids: one shared prefix
        logits, v = self._completion_logits(keys, mask, forward)
        logp, ent = token_logp_and_entropy(
            logits, c_ids.to(logits.device), temperature=temperature, entropy=entropy, suppress_ids=self.suppress_ids
        )
        return logp, ent, v

    def _plain_forward(self, prompts: list[Tensor], c_ids: Tensor, mask: Tensor, values: bool):
        """Left-padded prompt + right-padded completion per sample, with explicit position ids (left padding shifts
        them otherwise); logits [b, T, V] and values at the positions that predict the completion tokens."""
        T = mask.shape[1]
        p_ids, p_att = left_pad(prompts, self.pad_id)
        ids = torch.cat([p_ids, c_ids], 1).to(self.device)
        att = torch.cat([p_att, mask.long()], 1).to(self.device)
        pos = (att.cumsum(1) - 1).clamp(min=0)
        logits, vals = self.model(input_ids=ids, attention_mask=att, position_ids=pos, want_values=values)
        P = p_ids.shape[1]
        # logits at position t predict token t+1: completion token j sits at P + j, predicted by P + j - 1
        v = vals[:, P - 1 : P - 1 + T] if vals is not None else None
        return logits[:, P - 1 : P - 1 + T], v

    def _shared_forward(self, prompts: list[Tensor], c_ids: Tensor, mask: Tensor, values: bool):
        """One packed row per distinct prompt (its completions after it, 1-D positions continuing from it)."""
        groups = sp.group_rows([p.numpy().tobytes() for p in prompts])
        lengths = sp.right_padded_lengths(mask)
        if lengths is None:
            raise ValueError("the shared-prefix forward needs a right-padded completion mask (ones, then zeros)")
        reps = [prompts[g[0]] for g in groups]
        layout = sp.plan_layout(groups, [p.numel() for p in reps], lengths)
        ids = sp.pack_rows(layout, reps, c_ids, self.pad_id)
        pos = sp.pack_positions(layout, *sp.text_prefix_positions(layout))[0]
        return self._packed_forward(
            layout, mask.shape[1], want_values=values, input_ids=ids.to(self.device), position_ids=pos.to(self.device)
        )

    def sft_loss(self, batch: PromptBatch, targets: list[str]) -> torch.Tensor:
        """Mean token cross-entropy of ``targets`` (+ EOS) given the prompts (supervised warm start)."""
        prompts = self.encode_prompts([it["prompt"] for it in batch.items])
        comps = [
            torch.tensor(self.tokenizer(t, add_special_tokens=False)["input_ids"] + self.eos_ids[:1]) for t in targets
        ]
        T = max(c.numel() for c in comps)
        mask = torch.zeros(len(comps), T)
        for i, c in enumerate(comps):
            mask[i, : c.numel()] = 1.0
        ro = Rollout(
            rollout_logp=torch.zeros_like(mask),
            mask=mask,
            group_id=torch.arange(len(comps)),
            samples=[None] * len(comps),
            payload={"prompt_ids": prompts, "completion_ids": comps},
        )
        logp = self._forward_logp(ro, temperature=1.0)[0]  # cross-entropy of the untempered model
        m = mask.to(logp.device)
        return -(logp * m).sum() / m.sum()


def load_causal_lm(path: str, dtype: str = "float32"):
    """Load an HF causal LM and its tokenizer (offline when ``path`` is a folder)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from mmrl.models.availability import check_model_folder, model_load_errors

    check_model_folder(path, "config.json")
    local = Path(path).exists()
    with model_load_errors(path):  # weights not downloaded / hub offline: one ModelNotAvailableError line
        tok = AutoTokenizer.from_pretrained(path, local_files_only=local, padding_side="left")
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype), local_files_only=local)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return lm, tok


def build_causal_lm_policy(run_cfg, spec: PolicySpec) -> CausalLMPolicy:
    """Policy builder registered for ``model.type=causal_lm``; ``model.path=tiny`` reads ``spec.vocabulary``."""
    cfg = run_cfg.model
    path = cfg.path
    if path == "tiny":
        from mmrl.models.tiny_lm import build_tiny_causal_lm

        chars = spec.vocabulary
        if not chars:
            raise ValueError(
                f"model.path=tiny needs a task with a character vocabulary; task {spec.task_name} has none"
            )
        path = str(
            build_tiny_causal_lm(
                chars, hidden=cfg.tiny_hidden, layers=cfg.tiny_layers, heads=cfg.tiny_heads, seed=run_cfg.trainer.seed
            )
        )
    lm, tok = load_causal_lm(path, cfg.dtype)
    needs_ref = run_cfg.algo.kl_coef > 0
    return CausalLMPolicy(lm, tok, cfg, value_head=run_cfg.algo.advantage == "gae", reference=needs_ref)
