"""The contract between the trainer and every modality adapter.

Every modality is RL over a sequence of *actions*, each with a behaviour log-prob:

=========  =====================================  ==========================================
adapter    one action                             log-prob of an action
=========  =====================================  ==========================================
text/VLM   a generated token                      ``log_softmax(logits / T)`` at that token
diffusion  one SDE denoising step                 Gaussian log-density of ``x_{t-1} | x_t``
VLA        an action token at an environment step ``log_softmax`` over the bin vocabulary
=========  =====================================  ==========================================

So the trainer only sees tensors shaped ``[B, T]`` (``B`` samples, ``T`` actions) plus per-sample
rewards and group ids. A policy samples (:meth:`Policy.rollout`) and recomputes log-probs under the
current parameters (:meth:`Policy.log_probs`); everything else is shared.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
from torch import Tensor


@dataclass
class PromptBatch:
    """The prompts of one step, before they are repeated ``group_size`` times.

    ``seeds[i]`` is a per-prompt random seed derived from (run seed, epoch, position of the prompt in the epoch's
    shuffled order) (:class:`mmrl.data.sampler.PromptSampler`). Policies that draw their sampling noise from it
    produce the same samples whatever the batch layout (data-parallel rank, micro-batching), which makes
    data-parallel runs equal to single-process runs and gives "same initial noise per group" for free. The way to
    do that: the noise of sample ``j`` of prompt ``i`` comes from ``mix_seed(seeds[i], j, ...)``
    (:func:`mmrl.rollout.noise.mix_seed`), token noise from :func:`mmrl.rollout.noise.counter_gumbel` /
    ``counter_uniform`` keyed by that seed and the position, never from a global generator.
    """

    items: list[dict]
    """Task records as :meth:`mmrl.tasks.base.Task.prepare_item` returned them (question, media, ground truth...).
    Keys every consumer reads: ``prompt`` (passed to reward functions as their ``prompts``) and, optionally, ``id``
    (logged in ``samples.jsonl`` / ``predictions.jsonl``)."""
    indices: list[int]
    """Dataset index of each item."""
    seeds: list[int]
    """Per-prompt sampling seed."""

    def __len__(self) -> int:
        return len(self.items)

    def group_ids(self, group_size: int) -> Tensor:
        """[len * group_size] group id of each sample (prompt-major). The prompt seed doubles as the
        id: unique within a step even when a prompt appears twice or groups come from resampling."""
        return torch.tensor(self.seeds, dtype=torch.long).repeat_interleave(group_size)


def _pad_right(t: Tensor, length: int) -> Tensor:
    if t.shape[1] == length:
        return t
    pad = t.new_zeros((t.shape[0], length - t.shape[1], *t.shape[2:]))
    return torch.cat([t, pad], dim=1)


def index_payload(payload: Any, idx: Tensor) -> Any:
    """Select samples ``idx`` from a payload: dicts of batch-first tensors / per-sample lists, or an
    object with its own ``index_select_samples(idx)`` method (and ``concat_samples`` classmethod)."""
    if payload is None:
        return None
    if isinstance(payload, Tensor):
        return payload[idx.to(payload.device)]
    if isinstance(payload, dict):
        return {k: index_payload(v, idx) for k, v in payload.items()}
    if isinstance(payload, list):
        return [payload[i] for i in idx.tolist()]
    if hasattr(payload, "index_select_samples"):
        return payload.index_select_samples(idx)
    return payload  # scalars and shared objects (e.g. a prompt-length constant) pass through


def concat_payloads(payloads: Sequence[Any]) -> Any:
    """Concatenate payloads of several rollouts along the batch dimension.

    Tensors must agree on every dimension but the first; variable-length data should be kept as
    per-sample lists (they concatenate trivially).
    """
    first = payloads[0]
    if first is None:
        return None
    if hasattr(type(first), "concat_samples"):
        return type(first).concat_samples(list(payloads))
    if isinstance(first, dict):
        return {k: concat_payloads([p[k] for p in payloads]) for k in first}
    if isinstance(first, Tensor):
        shapes = {tuple(p.shape[1:]) for p in payloads}
        if len(shapes) > 1:
            raise ValueError(
                f"cannot concatenate payload tensors of shapes {sorted(shapes)}; store variable-length "
                "payload entries as per-sample lists"
            )
        return torch.cat(list(payloads), dim=0)
    if isinstance(first, list):
        return [x for p in payloads for x in p]
    return first


@dataclass
class Rollout:
    """Samples of one step, as ``[B, T]`` action tensors plus what is needed to recompute them."""

    rollout_logp: Tensor
    """[B, T] behaviour log-prob of each action, as reported by the rollout engine."""
    mask: Tensor
    """[B, T] float, 1 where the action is trained (0 on padding, prompt, deterministic steps)."""
    group_id: Tensor
    """[B] int64; samples from the same prompt / initial state share an id."""
    samples: list
    """What rewards read, one per sample (the ``completions`` of reward functions): a dict per sample, or a
    plain string for text. Keys read outside the adapter: ``text`` (the completion text: user rewards in
    ``reward.completion_format=text``, TRL-style rewards, ``samples.jsonl``, ``predictions.jsonl``; leave it out
    when a sample has no text); any other key is a convention between the adapter's policy and its task's rewards,
    which the policy documents (e.g. VLM: ``orig_size``, ``input_size``, ``box_frame``; VLA: ``success``,
    ``frames``; diffusion: ``image``)."""
    payload: Any
    """What :meth:`Policy.log_probs` needs: token ids, latent chain, frames... It must be indexable along the batch
    (a tensor, a list, a dict of those, or an object with ``index`` / ``concat_samples``: :func:`index_payload`,
    :func:`concat_payloads`) with fixed shapes beyond the batch dimension for tensors (store variable-length entries
    as per-sample lists)."""
    prompt_index: Tensor | None = None
    """[B] int64 position of each sample's prompt in the step's :class:`PromptBatch`; None: exactly ``group_size``
    samples per prompt, in prompt-major order."""
    ref_logp: Tensor | None = None
    """[B, T] reference-policy log-probs (filled by the trainer when KL is used)."""
    values: Tensor | None = None
    """[B, T] critic values at rollout time (filled by the trainer for GAE)."""
    rewards: Tensor | None = None
    """[B] (or [B, T]) rewards, filled by the trainer."""
    token_rewards: Tensor | None = None
    """[B, T] per-action rewards, for policies whose environment rewards every step."""
    valid: Tensor | None = None
    """[B] bool; False for samples that must not train (failed episode, NaN latents...)."""
    probe: Tensor | None = None
    """[B] bool; True for samples drawn only to inform the algorithm, never trained nor scored in evaluation
    (T-GRPO's shuffled-frame probes, :mod:`mmrl.algos.tgrpo`). A policy that draws probes also marks them
    ``valid=False``. Default: no probes."""
    adv_bonus: Tensor | None = None
    """[B] added to each sample's advantage after group normalisation (T-GRPO's temporal bonus); filled by the
    trainer from :func:`mmrl.algos.tgrpo.rollout_temporal_bonus` after scoring."""
    staleness: Tensor | None = None
    """[B] float: learner versions between the weights that sampled each sample and the weights it trains (set by
    asynchronous rollouts, :mod:`mmrl.asynchronous`); None: sampled by the weights it trains (0)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Rollout-side metrics (engine time, skips, env steps/s...), logged as they are. Keys with a meaning:
    ``data/too_long``: prompts the policy left out (over its length limit; set ``prompt_index`` for the others),
    counted by the trainer and evaluation as skipped items; ``count/*``: counts, summed (not averaged) when
    rollouts are concatenated by :meth:`concat`."""

    def __post_init__(self) -> None:
        if self.rollout_logp.shape != self.mask.shape:
            raise ValueError(f"rollout_logp {tuple(self.rollout_logp.shape)} and mask {tuple(self.mask.shape)} differ")
        if self.group_id.shape[0] != self.mask.shape[0] or len(self.samples) != self.mask.shape[0]:
            raise ValueError("group_id, samples and the [B, T] tensors must have the same batch size")
        if self.valid is None:
            self.valid = torch.ones(self.mask.shape[0], dtype=torch.bool)
        if self.probe is None:
            self.probe = torch.zeros(self.mask.shape[0], dtype=torch.bool)

    def without_probes(self) -> Rollout:
        """The rollout without its probe samples (what training statistics and evaluation score)."""
        if not bool(self.probe.any()):
            return self
        return self.index(torch.nonzero(~self.probe).flatten())

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    def index(self, idx: Tensor) -> Rollout:
        """The sub-rollout of samples ``idx`` (a 1-D int64 tensor)."""
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "metrics":
                kw[f.name] = dict(v)
            elif f.name == "payload":
                kw[f.name] = index_payload(v, idx)
            elif f.name == "samples":
                kw[f.name] = [v[i] for i in idx.tolist()]
            elif isinstance(v, Tensor):
                kw[f.name] = v[idx.to(v.device)]
            else:
                kw[f.name] = v
        return Rollout(**kw)

    @staticmethod
    def concat(rollouts: Sequence[Rollout]) -> Rollout:
        """Concatenate rollouts along the batch; ``[B, T]`` tensors are right-padded to the longest T."""
        if len(rollouts) == 1:
            return rollouts[0]
        T = max(r.mask.shape[1] for r in rollouts)
        kw: dict[str, Any] = {}
        for f in fields(Rollout):
            vals = [getattr(r, f.name) for r in rollouts]
            if f.name == "metrics":
                merged: dict[str, float] = {}
                for m in vals:
                    for k, x in m.items():
                        merged[k] = merged.get(k, 0.0) + x if k.startswith("count/") else x
                kw[f.name] = merged
            elif f.name == "payload":
                kw[f.name] = concat_payloads(vals)
            elif f.name == "samples":
                kw[f.name] = [s for v in vals for s in v]
            elif all(v is None for v in vals):
                kw[f.name] = None
            elif any(v is None for v in vals):
                raise ValueError(f"cannot concatenate rollouts where only some have '{f.name}'")
            elif vals[0].dim() >= 2 and f.name not in ("prompt_index", "group_id", "valid"):
                kw[f.name] = torch.cat([_pad_right(v, T) for v in vals], dim=0)
            else:
                kw[f.name] = torch.cat(vals, dim=0)
        return Rollout(**kw)

    def with_(self, **changes) -> Rollout:
        return replace(self, **changes)


@dataclass
class LogProbOutput:
    """What :meth:`Policy.log_probs` returns for the selected samples."""

    logp: Tensor
    """[b, T] log-prob of each action under the current parameters (differentiable). ``T`` is the rollout's
    ``mask.shape[1]`` (the trainer pads only in its no-grad passes)."""
    entropy: Tensor | None = None
    """[b, T] entropy of the action distribution. The trainer always asks for it (a logged metric, and the loss
    term when ``algo.entropy_coef > 0``); None is an acceptable answer when the policy cannot compute it (the
    metric is then left out, and ``algo.entropy_coef`` has no effect)."""
    values: Tensor | None = None
    """[b, T] critic values, when asked for and the policy has a value head."""
    kl: Tensor | None = None
    """[b, T] a policy-specific KL to the reference (e.g. latent-mean KL for diffusion), if any."""


class PolicyCapabilityError(RuntimeError):
    """A trainer stage asked a policy for a capability it does not have (e.g. SFT without a supervised loss)."""


@dataclass
class PolicySpec:
    """What a policy builder may need from the task, given explicitly instead of probed from the task object.

    A task fills the fields its policies read (:meth:`mmrl.tasks.base.Task.policy_spec`); builders check the
    ones they need and raise a clear error naming the task when one is missing.
    """

    task_name: str = ""
    """The task's registered name (for error messages)."""
    vocabulary: str | None = None
    """Characters of a character-level task (``model.path=tiny`` text LMs build their tokenizer from them)."""
    env_spec: Any = None
    """VLA: the environment's :class:`~mmrl.adapters.vla.policy.VLAEnvSpec` (observation keys, action size, pool)."""
    action_stats: dict | None = None
    """VLA: per-dimension action statistics for the action tokenizer (``q01``/``q99``, or ``min``/``max``)."""
    prepare_model: Callable[[str, Any], str] | None = None
    """Diffusion: ``(base model path, model config) -> path to load``, applied before loading (e.g. t2i_color
    pre-trains the tiny pipeline on its synthetic images and returns the cached result)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """What a new modality's builder needs from its task that no field above holds (an audio sample rate, a clip
    length, an answer vocabulary), by name; the builder documents the keys it reads and raises naming the task when
    one is missing. Give a field of its own to what more than one adapter reads."""


class Policy(abc.ABC):
    """What a modality adapter implements; the trainer, SFT and evaluation use nothing else. See docs/architecture.md.

    Required: :meth:`rollout`, :meth:`log_probs`, :meth:`reference`, :meth:`trainable_parameters`,
    :meth:`save_pretrained`, :meth:`load_pretrained` and the ``model`` attribute. The other members are
    optional capabilities with working defaults; an adapter overrides the ones it has.
    """

    model: torch.nn.Module
    """The trainable module. Under data parallel the trainer REASSIGNS this attribute to the DDP / FSDP2 wrapper:
    code that saves, loads or inspects weights unwraps it (``getattr(self.model, "module", self.model)``)."""

    owns_kl: bool = False
    """True when :meth:`log_probs` returns the policy's own KL to the reference in ``LogProbOutput.kl`` (e.g. the
    latent-mean KL of diffusion). The trainer then skips its reference pass and puts that KL in the loss; with
    ``algo.kl_in_reward`` the trainer's token KL is used as usual."""

    keeps_ema: bool = False
    """True when the policy keeps an exponential moving average of its trainable parameters (diffusion's
    ``model.ema``): data parallel refuses to shard such a policy, whose EMA copy is not sharded."""

    # ------------------------------------------------------------------ required
    @abc.abstractmethod
    def rollout(self, batch: PromptBatch, group_size: int, *, greedy: bool = False) -> Rollout:
        """Sample ``group_size`` completions (episodes, images) per prompt; ``[B*G, T]`` tensors in prompt-major
        order. ``greedy`` (evaluation): argmax actions, or the deterministic sampler. ``Rollout.probe`` marks extra
        samples that only inform the algorithm (T-GRPO's shuffled-frame probes): they are never trained.

        Evaluation calls it under ``torch.no_grad()``; the trainer does not, so a policy disables gradients itself
        where it does not need them. Sampling noise comes from ``batch.seeds`` (:class:`PromptBatch`)."""

    @abc.abstractmethod
    def log_probs(self, rollout: Rollout, *, entropy: bool = False, values: bool = False) -> LogProbOutput:
        """Recompute the log-probs of ``rollout``'s actions under the current parameters (with grad), on the same
        distribution the rollout sampled from (suppressed tokens masked, same temperature): ``[b, T]`` with ``T``
        the rollout's ``mask.shape[1]``. ``values=True`` only when :attr:`has_value_head` (``algo.advantage=gae``)."""

    @abc.abstractmethod
    def reference(self) -> ContextManager:
        """A context in which :meth:`log_probs` evaluates the frozen reference policy."""

    @abc.abstractmethod
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters the optimizer updates."""

    @abc.abstractmethod
    def save_pretrained(self, path: str) -> None:
        """Write the model in its ecosystem's format. Checkpoints are validated before loading
        (:func:`mmrl.checkpoint_files.check_pretrained_folder`), which accepts ``model.safetensors``, a sharded
        safetensors index, a PEFT adapter or a diffusion pipeline folder (``mmrl_diffusion.json``): write one of
        those, or resume, ``checkpoint=`` and ``mmrl eval`` cannot read it."""

    @abc.abstractmethod
    def load_pretrained(self, path: str) -> None:
        """Load what :meth:`save_pretrained` wrote, exactly. Weights written for another model (other names or
        shapes) raise :class:`mmrl.checkpoint_files.CheckpointMismatchError` naming the first differing weight: the CLI
        reports it as one line."""

    # ------------------------------------------------------------------ optional, with defaults
    def to_device(self, device: torch.device) -> None:
        """Move the trainable module to ``device`` (the trainer calls it once, for an accelerator device)."""
        self.model.to(device)

    def on_train_step(self, step: int) -> None:
        """Called before each RL step's rollout with the step index (e.g. diffusion's sliding window of trained
        denoising steps). Default: nothing."""

    def sample_meta(self, items: Sequence[dict]) -> list[dict]:
        """What the policy knows of each item after its own preprocessing (e.g. a VLM's model-input image size and
        box frame), passed to :meth:`mmrl.tasks.base.Task.sft_target`. Default: empty dicts."""
        return [{} for _ in items]

    def sft_loss(self, batch: PromptBatch, targets: Sequence[str]) -> Tensor:
        """Supervised loss of ``targets`` given ``batch`` (the warm start, ``trainer.warm_start.steps``). Default: this
        policy has none (:attr:`supports_sft` is False)."""
        raise PolicyCapabilityError(
            f"the {type(self).__name__} policy has no supervised loss (sft_loss); set trainer.warm_start.steps=0"
        )

    @property
    def supports_sft(self) -> bool:
        """True when the policy overrides :meth:`sft_loss`."""
        return type(self).sft_loss is not Policy.sft_loss

    @property
    def has_value_head(self) -> bool:
        """True when :meth:`log_probs` can return critic values (``values=True``), which ``algo.advantage=gae``
        needs; the trainer refuses GAE with a policy without one before anything is trained. Default: False."""
        return False

    @contextlib.contextmanager
    def evaluation_outputs(self) -> Iterator[None]:
        """A context around evaluation rollouts in which the policy keeps what evaluation outputs need beyond the
        samples (VLA: every episode's frames, for the eval videos). Default: nothing to keep."""
        yield

    def close(self) -> None:
        """Release external resources (simulator workers, a rollout engine...). Called once when the policy is no
        longer used: by ``mmrl train`` after :meth:`~mmrl.trainer.Trainer.fit` and by ``mmrl eval``; code that
        builds a policy itself calls it. Default: nothing to release."""

    def prepare_for_evaluation(self, rollouts_per_call: int) -> None:
        """Called by ``mmrl eval`` before evaluating: at most ``rollouts_per_call`` samples are rolled out per
        :meth:`rollout` call, so a policy that sized resources for training batches can size them down (VLA: the
        env pool). Default: nothing to do."""

    _frozen_ref: FrozenCopyReference | None = None
    """A full fine-tune's frozen reference copy (None with LoRA: the reference is the model with adapters off).
    A policy that keeps a :class:`FrozenCopyReference` stores it here, so that :meth:`shardable_modules` hands it to
    fsdp2 with the trained model."""

    @property
    def frozen_reference(self) -> FrozenCopyReference | None:
        """The frozen copy the KL reference is computed with (a full fine-tune), or None (LoRA: the reference is the
        model with adapters off). The trainer resets it to the weights RL starts from (after a warm start, or the
        ``checkpoint=`` weights) and keeps it across a resume."""
        return self._frozen_ref

    def shardable_modules(self) -> list[torch.nn.Module]:
        """The modules a sharding strategy (``trainer.strategy=fsdp2``) wraps: the trained ``model`` and, when the
        policy keeps one, its frozen reference copy. Default: exactly those."""
        return [self.model] + ([self._frozen_ref.frozen] if self._frozen_ref is not None else [])


class FrozenCopyReference:
    """A reference policy held as a frozen deep copy of the initial model.

    Used when the policy is fully fine-tuned (no LoRA adapters to disable), or when disabling the adapters would not
    give the initial model back (LeRobot's policies under LoRA train their projections in full). ``swap`` temporarily
    puts the frozen copy in place of the policy's model.
    """

    def __init__(self, policy: Any) -> None:
        import copy

        self._policy = policy
        self._frozen = copy.deepcopy(_unwrap(policy.model)).eval()
        for p in self._frozen.parameters():
            p.requires_grad_(False)

    @property
    def frozen(self) -> torch.nn.Module:
        """The frozen copy itself (what :meth:`swap` puts in place of the policy's model)."""
        return self._frozen

    def reset(self) -> None:
        """Make the frozen copy equal to the live model's current weights (the reference becomes the model RL starts
        from, e.g. after the supervised warm start)."""
        with torch.no_grad():
            self._frozen.load_state_dict(_unwrap(self._policy.model).state_dict())

    @contextlib.contextmanager
    def swap(self):
        live = self._policy.model
        device = next(_unwrap(live).parameters()).device
        if next(self._frozen.parameters()).device != device:  # the live model was moved after init
            self._frozen.to(device)
        self._policy.model = self._frozen
        try:
            yield
        finally:
            self._policy.model = live


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    return getattr(module, "module", module)
