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
import functools
import inspect
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from mmrl.models.lora import is_peft  # noqa: F401  (re-exported: the policies use it from here)
from mmrl.policies import shared_prefix as sp
from mmrl.policies.base import FrozenCopyReference, Policy, Rollout


def suppress_logits(logits: Tensor, suppress_ids: Sequence[int] | Tensor | None) -> Tensor:
    """``logits`` [..., V] with the ``suppress_ids`` columns set to -inf (the same mask the sampler applies)."""
    if suppress_ids is None or len(suppress_ids) == 0:
        return logits
    ids = torch.as_tensor(suppress_ids, dtype=torch.long, device=logits.device)
    return logits.index_fill(-1, ids, float("-inf"))


def token_logp_and_entropy(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    entropy: bool = False,
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


@functools.cache
def _forward_takes_logits_to_keep(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def accepts_logits_to_keep(lm: nn.Module) -> bool:
    """True when the HF model's forward (under a PEFT wrapper, the base model's) takes ``logits_to_keep``."""
    base = lm.get_base_model() if is_peft(lm) else lm
    return _forward_takes_logits_to_keep(type(base))


def rows_head(n: int, k: int) -> list[int]:
    """The first ``min(n, k)`` row indices."""
    return list(range(min(n, k)))


CompletionForward = Callable[[list[int], bool], tuple[Tensor, Tensor | None]]
"""``forward(rows, shared) -> (logits [len(rows), T, V], values [len(rows), T] or None)`` of a policy's completion
forward over the samples ``rows`` of a micro-batch, shared-prefix or plain (see
:meth:`HFTokenPolicy._completion_logits`)."""


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

        save_file(
            {k: v.detach().contiguous() for k, v in module.value_head.state_dict().items()},
            str(path / "value_head.safetensors"),
        )


def load_value_head(module: LMWithValueHead, path: Path) -> None:
    """The value head from ``path/value_head.safetensors`` when both the module and the checkpoint have one (a
    damaged file or one of another shape is one line)."""
    from mmrl.checkpoint_files import load_state_checked, read_safetensors

    f = path / "value_head.safetensors"
    if module.value_head is not None and f.exists():
        load_state_checked(module.value_head, read_safetensors(f), f)


class HFTokenPolicy(Policy):
    """What every token policy over an HF model shares: the trainable module (HF model + optional
    value head), the reference policy, parameters and HF-format saving/loading.

    A subclass prepares its model (LoRA, gradient checkpointing, frozen parts, the value head) and calls
    ``HFTokenPolicy.__init__`` with the state below; its :meth:`rollout` returns
    ``self._first_rollout_check(rollout)``, which checks once that training log-probs reproduce the rollout's.
    """

    model: LMWithValueHead
    processing: object
    suppress_ids: list[int] = []
    """Token ids the policy never samples (masked to -inf in sampling, training log-probs and entropy alike)."""

    def __init__(
        self,
        cfg: Any,
        lm: nn.Module,
        processing: object,
        *,
        pad_id: int,
        eos_ids: Sequence[int],
        suppress_ids: Sequence[int] = (),
        value_head: ValueHead | None = None,
        reference: bool = False,
    ) -> None:
        """``cfg``: the model config (``lora``, ``temperature``, ``shared_prefix``...); ``lm``: the prepared HF model;
        ``processing``: the tokenizer or processor saved next to the weights; ``pad_id`` / ``eos_ids``: padding and
        the tokens that end a completion; ``suppress_ids``: tokens never sampled; ``value_head``: the critic or None;
        ``reference``: keep a frozen copy of the initial model as the KL reference (full fine-tuning only: with
        LoRA the reference is the model with its adapters off)."""
        self.cfg = cfg
        self.processing = processing
        self.model = LMWithValueHead(lm, value_head)
        self.pad_id = pad_id
        self.eos_ids = list(eos_ids)
        self.suppress_ids = list(suppress_ids)
        self._frozen_ref = FrozenCopyReference(self) if reference and not cfg.lora.enabled else None

    @property
    def shared_prefix(self) -> sp.SharedPrefixGuard:
        """The shared-prefix switch of this policy (``model.shared_prefix``) with its first-use self-check."""
        guard = self.__dict__.get("_shared_prefix_guard")
        if guard is None:
            guard = self._shared_prefix_guard = sp.SharedPrefixGuard(self.cfg.shared_prefix)
        return guard

    def _text_config(self):
        """The language model's config (the text sub-config of a VLM)."""
        cfg = self.module.lm.config
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    def _compute_dtype(self) -> torch.dtype:
        return self.module.lm.get_input_embeddings().weight.dtype

    def _can_share(self, keys: Sequence[Hashable], mask: Tensor) -> bool:
        """Sharing is on, some prompt has several rows, the completion mask is right-padded and the model's
        attention takes the mask (:func:`mmrl.policies.shared_prefix.unsupported_reason`)."""
        return (
            self.shared_prefix.enabled
            and len(set(keys)) < len(keys)
            and sp.right_padded_lengths(mask) is not None
            and sp.unsupported_reason(self._text_config()) is None
        )

    def _completion_logits(
        self, keys: Sequence[Hashable], mask: Tensor, forward: CompletionForward
    ) -> tuple[Tensor, Tensor | None]:
        """Logits ``[b, T, V]`` (and values) at the completion positions of a micro-batch whose sample ``i`` has the
        prompt ``keys[i]`` (equal keys: identical prompts): the shared-prefix forward when :meth:`_can_share`, else
        the plain one.

        The first shared forward of the policy is checked against the plain one on a few rows (:meth:`_self_check`);
        a failed check falls back for good. With several processes the check runs only where every process runs it
        (:meth:`_first_rollout_check`): each forward of a sharded or DDP model is a collective."""
        rows = list(range(len(keys)))
        guard = self.shared_prefix
        if guard.needs_check and (guard.check_requested or (not sp.is_distributed() and self._can_share(keys, mask))):
            if not self._self_check(keys, mask, forward):
                return forward(rows, False)
        if not self._can_share(keys, mask):
            return forward(rows, False)
        guard.shared_calls += 1
        return forward(rows, True)

    def _self_check(self, keys: Sequence[Hashable], mask: Tensor, forward: CompletionForward) -> bool:
        """Compare the shared-prefix and plain logits of a few rows (no gradient, eval mode; the largest
        total-variation gap over all processes) and record the result in :attr:`shared_prefix`."""
        guard = self.shared_prefix
        reason = sp.unsupported_reason(self._text_config())
        if reason is not None:  # decided from the config alone: the same on every process, no forward needed
            guard.disable(reason)
            return False
        groups = sp.group_rows(keys)
        sub = sp.check_rows(groups) if any(len(g) > 1 for g in groups) else rows_head(len(keys), 2)
        was_training = self.module.training
        self.module.eval()  # no dropout: both forwards must see the same network
        try:
            with torch.no_grad():
                shared = forward(sub, True)[0]
                plain = forward(sub, False)[0]
        finally:
            self.module.train(was_training)
        gap = sp.global_max(sp.distribution_gap(shared, plain, mask[sub]), self.device)
        return guard.record_check(gap, sp.check_tolerance(self._compute_dtype()), what=type(self).__name__)

    def _first_rollout_check(self, rollout: Rollout) -> Rollout:
        """Run the shared-prefix self-check on a few samples of ``rollout`` when it has not run yet (the first rollout,
        on every process at the same step), and add the ``shared_prefix/*`` counters to its metrics. Returns it.

        Every process must reach this with a non-empty rollout at the same step (as the trainer's update does)."""
        guard = self.shared_prefix
        if guard.needs_check and rollout.batch_size:
            groups = sp.group_rows(rollout.group_id.tolist())
            idx = sp.check_rows(groups) if any(len(g) > 1 for g in groups) else rows_head(rollout.batch_size, 2)
            guard.check_requested = True
            try:
                with torch.no_grad():
                    self.log_probs(rollout.index(torch.tensor(idx, dtype=torch.long)))
            finally:
                guard.check_requested = False
        rollout.metrics.update(guard.metrics())
        return rollout

    def _packed_forward(
        self, layout: sp.PackedLayout, T: int, *, want_values: bool, **inputs
    ) -> tuple[Tensor, Tensor | None]:
        """One forward of packed rows (``inputs``: ``input_ids`` / ``position_ids`` and model extras laid out by
        ``layout``) under the shared-prefix mask; logits ``[B, T, V]`` and values ``[B, T]`` per sample (past each
        completion's trained tokens: finite, untrained values, :func:`~mmrl.policies.shared_prefix.unpack`). Only
        the columns from the prompts' last token on go through the LM head."""
        dev = inputs["input_ids"].device
        mask = sp.model_attention_mask(self._text_config(), sp.segment_ids(layout).to(dev), self._compute_dtype())
        if accepts_logits_to_keep(self.module.lm):
            inputs["logits_to_keep"] = layout.width - layout.prefix_end + 1
        logits, vals = self.model(**inputs, attention_mask=mask, want_values=want_values)
        index = sp.prediction_index(layout, T)
        out = sp.unpack(logits, index, first_col=layout.width - logits.shape[1])
        return out, (sp.unpack(vals, index) if vals is not None else None)

    @property
    def module(self) -> LMWithValueHead:
        """The unwrapped trainable module (accelerate may wrap ``model`` for data parallel)."""
        return getattr(self.model, "module", self.model)

    @property
    def has_value_head(self) -> bool:
        """True when the model was built with a critic (``algo.advantage=gae``)."""
        return self.module.value_head is not None

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
        """Load exactly what :meth:`save_pretrained` wrote into the live model. A damaged file is a
        :class:`~mmrl.checkpoint_files.DamagedCheckpointError`, weights of another shape or name set a
        :class:`~mmrl.checkpoint_files.CheckpointMismatchError` (both one line, nothing half-loaded by a shape error)."""
        from mmrl.checkpoint_files import check_state_fits, read_safetensors

        path = Path(path)
        lm = self.module.lm
        if is_peft(lm):
            from peft import get_peft_model_state_dict, set_peft_model_state_dict

            f = path / "adapter_model.safetensors"
            saved = read_safetensors(f)
            check_state_fits(get_peft_model_state_dict(lm), saved, f)
            set_peft_model_state_dict(lm, saved)
        else:
            self._load_full_weights(lm, path)
        load_value_head(self.module, path)

    def _load_full_weights(self, lm: nn.Module, path: Path) -> None:
        """Load a full (non-PEFT) checkpoint; strict except for tied output embeddings."""
        from mmrl.checkpoint_files import load_state_checked, read_safetensors

        tied = getattr(lm.config, "tie_word_embeddings", False)
        f = path / "model.safetensors"
        load_state_checked(lm, read_safetensors(f), f, may_miss=lambda k: tied and k.endswith("lm_head.weight"))
