"""Shared machinery of token policies (text LMs, VLMs, VLAs): log-probs, entropy, value head, LoRA.

A token policy's actions are completion tokens. Given logits over the completion positions,
``logp = log_softmax(mask(logits / T))[token]`` and ``entropy = -sum p log p`` of the same tempered distribution,
where ``mask`` sets the policy's suppressed token ids (e.g. vision special tokens) to -inf: the distribution the
rollout sampled from (the sampling temperature and the suppressed ids are part of the policy). Training on the
unmasked softmax would follow the gradient of another distribution, and the PPO ratio against an engine's
log-probs would be off by ``log(1 - p_suppressed)``.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from mmrl.models.lora import is_peft  # noqa: F401  (re-exported: the policies use it from here)
from mmrl.policies.base import Policy


def suppress_logits(logits: Tensor, suppress_ids: Sequence[int] | Tensor | None) -> Tensor:
    """``logits`` [..., V] with the ``suppress_ids`` columns set to -inf (the same mask the sampler applies)."""
    if suppress_ids is None or len(suppress_ids) == 0:
        return logits
    ids = torch.as_tensor(suppress_ids, dtype=torch.long, device=logits.device)
    return logits.index_fill(-1, ids, float("-inf"))


def token_logp_and_entropy(
    logits: Tensor, tokens: Tensor, *, temperature: float = 1.0, entropy: bool = False,
    suppress_ids: Sequence[int] | Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of ``tokens`` [B, T] under ``log_softmax(suppress(logits / T))`` [B, T, V]; optional entropy of the
    same distribution (suppressed ids have probability 0 and add nothing)."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logits = suppress_logits(logits, suppress_ids)
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, tokens[..., None]).squeeze(-1)
    ent = None
    if entropy:
        p = logp_all.exp()
        # suppressed ids have p = 0 and logp = -inf: their term is 0, and -inf must not enter the product (its
        # gradient would be 0 * -inf = NaN)
        finite_logp = torch.where(p > 0, logp_all, torch.zeros((), dtype=p.dtype, device=p.device))
        ent = -(p * finite_logp).sum(-1)
    return logp, ent


def left_pad(seqs: list[Tensor], pad_id: int) -> tuple[Tensor, Tensor]:
    """Stack 1-D id tensors left-padded; returns ids [B, L] and attention mask [B, L]."""
    if not seqs:
        return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.long)
    lens = torch.tensor([s.numel() for s in seqs])
    if bool((lens == lens[0]).all()):  # common case (same-length prompts): no padding needed
        ids = torch.stack(list(seqs))
        return ids, torch.ones_like(ids)
    ids = pad_sequence(seqs, batch_first=True, padding_value=pad_id, padding_side="left")
    att = (torch.arange(ids.shape[1]) >= (ids.shape[1] - lens)[:, None]).long()
    return ids, att


def right_pad(seqs: list[Tensor], pad_id: int, length: int | None = None) -> Tensor:
    """Stack 1-D id tensors right-padded to ``length`` (default: the longest)."""
    if not seqs:
        return torch.zeros(0, length or 0, dtype=torch.long)
    ids = pad_sequence(seqs, batch_first=True, padding_value=pad_id)
    L = ids.shape[1] if length is None else length
    if ids.shape[1] >= L:
        return ids[:, :L]
    return torch.nn.functional.pad(ids, (0, L - ids.shape[1]), value=pad_id)


class ValueHead(nn.Module):
    """A scalar value per position from the last hidden state (PPO critic)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.proj(hidden.float()).squeeze(-1)


class LMWithValueHead(nn.Module):
    """The trainable module of a token policy: the HF model plus an optional value head.

    Keeping both in one module lets accelerate wrap them together for data parallel.
    """

    def __init__(self, lm: nn.Module, value_head: ValueHead | None = None) -> None:
        super().__init__()
        self.lm = lm
        self.value_head = value_head

    def forward(self, *, want_values: bool = False, **inputs):
        out = self.lm(**inputs, output_hidden_states=want_values, use_cache=False)
        values = self.value_head(out.hidden_states[-1]) if want_values and self.value_head is not None else None
        return out.logits, values


def apply_lora(lm: nn.Module, lora_cfg, *, exclude_prefixes: tuple[str, ...] = ()) -> nn.Module:
    """Wrap ``lm`` with PEFT LoRA adapters on ``lora_cfg.target_modules``, skipping modules whose
    qualified name starts with one of ``exclude_prefixes`` (e.g. a vision tower)."""
    from peft import LoraConfig, get_peft_model

    targets = sorted(
        {
            name
            for name, mod in lm.named_modules()
            if isinstance(mod, nn.Linear)
            and name.split(".")[-1] in set(lora_cfg.target_modules)
            and not any(name.startswith(p) or f".{p}" in name for p in exclude_prefixes)
        }
    )
    if not targets:
        raise ValueError(f"LoRA found no modules named {lora_cfg.target_modules} outside {exclude_prefixes}")
    cfg = LoraConfig(r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout, target_modules=targets)
    return get_peft_model(lm, cfg)


@contextlib.contextmanager
def adapters_disabled(lm: nn.Module):
    """The LoRA-disabled base model as the frozen reference (same weights, no second copy)."""
    with lm.disable_adapter():
        yield


def save_value_head(module: LMWithValueHead, path: Path) -> None:
    if module.value_head is not None:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous() for k, v in module.value_head.state_dict().items()}, str(path / "value_head.safetensors"))


def load_value_head(module: LMWithValueHead, path: Path) -> None:
    f = path / "value_head.safetensors"
    if module.value_head is not None and f.exists():
        from safetensors.torch import load_file

        module.value_head.load_state_dict(load_file(str(f)))


class HFTokenPolicy(Policy):
    """What every token policy over an HF model shares: the trainable module (HF model + optional
    value head), the reference policy, parameters and HF-format saving/loading.

    Subclasses set ``self.model`` (an :class:`LMWithValueHead`), ``self.processing`` (the tokenizer
    or processor saved next to the weights) and ``self._frozen_ref`` (a FrozenCopyReference or None).
    """

    model: LMWithValueHead
    processing: object
    _frozen_ref: object | None = None
    suppress_ids: list[int] = []
    """Token ids the policy never samples (masked to -inf in sampling, training log-probs and entropy alike)."""

    @property
    def module(self) -> LMWithValueHead:
        """The unwrapped trainable module (accelerate may wrap ``model`` for data parallel)."""
        return getattr(self.model, "module", self.model)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def reference(self):
        """The LoRA-disabled model when LoRA is on, else the frozen copy of the initial model."""
        lm = self.module.lm
        if is_peft(lm):
            return adapters_disabled(lm)
        if self._frozen_ref is not None:
            return self._frozen_ref.swap()
        raise RuntimeError("no reference policy: build the policy with reference=True or enable LoRA")

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def save_pretrained(self, path) -> None:
        """HF folder (or PEFT adapter) + tokenizer/processor + value head."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.module.lm.save_pretrained(path)
        self.processing.save_pretrained(path)
        save_value_head(self.module, path)

    def load_pretrained(self, path) -> None:
        """Load exactly what :meth:`save_pretrained` wrote into the live model."""
        path = Path(path)
        lm = self.module.lm
        if is_peft(lm):
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(lm, load_file(str(path / "adapter_model.safetensors")))
        else:
            self._load_full_weights(lm, path)
        load_value_head(self.module, path)

    def _load_full_weights(self, lm: nn.Module, path: Path) -> None:
        """Load a full (non-PEFT) checkpoint; strict except for tied output embeddings."""
        from safetensors.torch import load_file

        missing, unexpected = lm.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
        tied = getattr(lm.config, "tie_word_embeddings", False)
        missing = [m for m in missing if not (tied and m.endswith("lm_head.weight"))]
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}")
