"""Per-device memory of an RL training run: pure functions of numbers (docs/scaling.md has every formula).

Nothing here imports torch or reads a config: :func:`plan_memory` takes a :class:`PlanInputs` (an
:class:`~mmrl.planning.architectures.Architecture` plus the run's numbers) and returns a :class:`MemoryBreakdown` in
bytes. ``mmrl plan`` (mmrl/cli.py) builds the inputs from a validated run config (:mod:`mmrl.planning.report`).

Conventions (docs/scaling.md, "Conventions"):

* AdamW keeps two moments per trainable parameter. ``optim_dtype="fp32"``: the moments are fp32 (8 B / parameter)
  and a 16-bit model being fully fine-tuned also has an fp32 master copy (+4 B): the usual mixed-precision recipe
  (FSDP2 / DeepSpeed), 12 B per trainable 16-bit parameter. ``optim_dtype="model"``: moments in the parameter's own
  dtype and no master copy: what ``torch.optim.AdamW`` does on a bf16 model as the trainer builds it today.
  LoRA adapters are fp32 whatever the model dtype (PEFT's ``autocast_adapter_dtype``), so they never need a master
  copy. AdamW's per-tensor ``step`` scalars (4 B per parameter tensor) are ignored.
* Gradients have the dtype of their parameter.
* ``fsdp2`` shards parameters, gradients and optimizer state (frozen parameters included) over the world size;
  ``ddp`` replicates them. FSDP2 also holds gathered (unsharded) units: the root unit (embeddings, lm_head, final
  norm, vision tower outside its blocks) for the whole pass, and two decoder layers (the current one and the
  prefetched next one).
* ``offload="optimizer"`` moves the optimizer state to CPU; ``offload="params"`` (fsdp2 only, FSDP2's
  ``CPUOffloadPolicy``) moves the sharded parameters, gradients and optimizer state; gathered units stay on device.
* The reference model of the KL term: with LoRA the adapter-disabled model (0 B); with full fine-tuning a frozen
  deep copy of the whole model in the model dtype, made before the model is wrapped, hence a full replica on every
  device even with fsdp2.
* total = persistent + max(training transient, rollout transient), where persistent = parameters + optimizer state +
  reference + FSDP2 gather buffers + runtime overhead (+ vLLM's reservation without sleep mode), training = gradients
  + activations + logits of one micro-batch, rollout = KV cache + prefill working set of the rollout batch (or vLLM's
  reservation with sleep mode). Gradients are freed after every optimizer step (``zero_grad(set_to_none=True)``), so
  they never coexist with the rollout; the optimizer state persists from the first step on.
* ``trainer.rollout=async`` (``PlanInputs.rollout_workers`` = N > 0): each rollout worker is a process with its own
  policy built from the config (:func:`sampling_copy_inputs`): the model's weights unsharded in their own dtypes (no
  KL reference: the learner computes it), plus the rollout peak of one round, a step's global batch, plus its own
  runtime overhead. The workers run on the device of rank 0 and sample while the learner trains, so rank 0's device
  holds total = learner (the synchronous total above: the learner still evaluates, with its own rollouts) + N x the
  worker. The learner keeps a CPU shared-memory copy of the policy model's ``state_dict`` (the weight board,
  mmrl/asynchronous/weights.py): host memory, counted by :meth:`MemoryBreakdown.host_ram`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from mmrl.planning.architectures import Architecture, TextArch, lora_params
from mmrl.planning.lerobot import FlowVLAArch

__all__ = [
    "EXPERT_LAYER_ELEMENTS",
    "GIB",
    "ContinuousHead",
    "LOGIT_BYTES_PER_ELEMENT",
    "MemoryBreakdown",
    "ParamCounts",
    "PlanInputs",
    "StateBytes",
    "activation_bytes",
    "continuous_head_params",
    "dtype_bytes",
    "flow_vla_cache_bytes",
    "flow_vla_chain_bytes",
    "flow_vla_expert_pass_bytes",
    "flow_vla_expert_step_bytes",
    "flow_vla_head_params",
    "flow_vla_lora_bytes",
    "flow_vla_prefix_bytes",
    "flow_vla_prefix_working_bytes",
    "flow_vla_vision_bytes",
    "flow_vla_vlm_layer_bytes",
    "head_rollout_bytes",
    "head_training_bytes",
    "kv_cache_bytes",
    "layer_activation_bytes",
    "logits_bytes",
    "model_state_bytes",
    "param_counts",
    "plan_memory",
    "prefill_bytes",
    "sampling_copy_inputs",
    "weight_board_bytes",
]

GIB = 1024**3

LOGIT_BYTES_PER_ELEMENT = 21
"""Bytes per (completion position x vocabulary entry) of one sample's loss head while the backward runs:
``token_logp_and_entropy`` keeps ``log_softmax`` (4 B, fp32), ``p = exp`` (4 B) and the masked log-probs (4 B) for
the entropy term, plus the ``p > 0`` mask (1 B); the backward through them holds two more fp32 tensors of that shape
(8 B) while every layer's activations are still alive."""


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of ``float32`` / ``bfloat16`` / ``float16``."""
    return {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}[dtype]


# ============================================================================ parameters, gradients, optimizer


@dataclass(frozen=True)
class ParamCounts:
    """Parameters split by whether they train, with their element sizes."""

    trainable: int
    frozen: int
    trainable_bytes: int  # bytes per trainable parameter (LoRA adapters: 4)
    frozen_bytes: int  # bytes per frozen parameter (the model dtype)

    @property
    def total(self) -> int:
        return self.trainable + self.frozen


def param_counts(
    arch: Architecture,
    *,
    dtype_bytes: int,
    lora: bool = False,
    lora_r: int = 16,
    lora_targets: tuple[str, ...] = (),
    freeze_vision: bool = True,
    value_head: bool = False,
) -> ParamCounts:
    """Trainable vs frozen parameters of a token model (VLM / causal LM) or a diffusion denoiser.

    LoRA: adapters (fp32) train, the whole base model is frozen. Full fine-tuning: every LM parameter trains; the
    vision tower too unless ``freeze_vision``. A critic (``value_head``, algo.advantage=gae) adds hidden + 1 fp32
    parameters that train. Diffusion: the denoiser (or its adapters) trains; text encoders and VAE are frozen."""
    if arch.diffusion is not None:
        d = arch.diffusion
        if lora:
            return ParamCounts(lora_r * d.lora_params_per_rank, d.denoiser_params + d.frozen_params, 4, dtype_bytes)
        return ParamCounts(d.denoiser_params, d.frozen_params, dtype_bytes, dtype_bytes)
    text, vision = arch.text, arch.vision
    lm = text.params()
    vis = vision.params() if vision is not None else 0
    head = text.hidden + 1 if value_head else 0
    if lora:
        # the value head is fp32 like the adapters
        return ParamCounts(lora_params(text, lora_targets, lora_r) + head, lm + vis, 4, dtype_bytes)
    trainable = lm + (0 if freeze_vision else vis)
    frozen = vis if freeze_vision else 0
    # an fp32 head next to 16-bit weights is counted at the model's width (hidden + 1 parameters: negligible)
    trainable += head
    return ParamCounts(trainable, frozen, dtype_bytes, dtype_bytes)


@dataclass(frozen=True)
class StateBytes:
    params: int
    grads: int
    optimizer: int


def model_state_bytes(
    counts: ParamCounts, *, strategy: str = "ddp", world_size: int = 1, offload: str = "none", optim_dtype: str = "fp32"
) -> StateBytes:
    """Parameters, gradients and AdamW state on one device (bytes).

    params = trainable * trainable_bytes + frozen * frozen_bytes; grads = trainable * trainable_bytes;
    optimizer = trainable * (2 * moment + master), moment = 4 (optim_dtype fp32) or trainable_bytes (model),
    master = 4 when optim_dtype is fp32 and the trainable parameters are 16-bit, else 0.
    fsdp2 divides each by world_size (rounded up); offload removes what it moves to CPU."""
    if strategy not in ("ddp", "fsdp2"):
        raise ValueError(f"strategy must be ddp or fsdp2, got {strategy!r}")
    if offload not in ("none", "optimizer", "params"):
        raise ValueError(f"offload must be none, optimizer or params, got {offload!r}")
    if offload == "params" and strategy != "fsdp2":
        raise ValueError("offload=params needs strategy=fsdp2 (FSDP2's CPUOffloadPolicy)")
    tb = counts.trainable_bytes
    params = counts.trainable * tb + counts.frozen * counts.frozen_bytes
    grads = counts.trainable * tb
    if optim_dtype == "fp32":
        per = 8 + (4 if tb < 4 else 0)
    elif optim_dtype == "model":
        per = 2 * tb
    else:
        raise ValueError(f"optim_dtype must be fp32 or model, got {optim_dtype!r}")
    optimizer = counts.trainable * per
    n = world_size if strategy == "fsdp2" else 1
    params, grads, optimizer = (math.ceil(x / n) for x in (params, grads, optimizer))
    if offload in ("optimizer", "params"):
        optimizer = 0
    if offload == "params":
        params = grads = 0
    return StateBytes(params, grads, optimizer)


# ============================================================================ activations


def layer_activation_bytes(
    seq: int,
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    dtype_bytes: int,
    eager_attention: bool = False,
    gated_mlp: bool = True,
    lora_inputs: int = 0,
    lora_rank_sum: int = 0,
) -> int:
    """Bytes one decoder layer keeps for the backward, for one sample of ``seq`` tokens (b = dtype_bytes).

    Per token (the Korthikanti et al. 2022 accounting -- 34 s h + 5 a s^2 bytes for a GPT layer in fp16 -- redone for
    a Qwen layer: RMSNorms computed in fp32, grouped-query attention, SwiGLU, no dropout):

    * each of the 2 RMSNorms: its fp32 input (4 h) + the normalised value before the weight (b h) + its output, the
      input of the next linears (b h): 2 h (4 + 2 b)
    * attention: q (b a d), k and v (b kv d each) and the output (b a d) kept by the fused kernel (sdpa / flash: no
      s x s matrix), plus the contiguous output that o_proj keeps (b a d): b (3 a d + 2 kv d)
    * MLP: gate output, its SiLU, up output and their product (the input of down_proj): 4 b f (GELU MLP: 2 b f)
    * eager attention adds the softmax (fp32) and its cast, a s^2 (4 + b) per sample
    * LoRA adds r (fp32) per adapted module, and with a 16-bit model the fp32 copy of each adapted module's input that
      PEFT casts for its fp32 adapters (``lora_inputs`` = the sum of the adapted modules' input widths, 0 in fp32)
    """
    b = dtype_bytes
    per_token = 2 * hidden * (4 + 2 * b) + b * (3 * heads * head_dim + 2 * kv_heads * head_dim)
    per_token += (4 if gated_mlp else 2) * b * intermediate
    per_token += 4 * lora_inputs + 4 * lora_rank_sum
    total = seq * per_token
    if eager_attention:
        total += heads * seq * seq * (4 + b)
    return total


def activation_bytes(
    *, layers: int, per_layer: int, seq: int, hidden: int, samples: int, dtype_bytes: int, checkpointing: bool
) -> int:
    """Activations of one micro-batch of ``samples`` sequences through ``layers`` decoder layers (bytes).

    Without checkpointing: samples * (layers * per_layer + final norm); with (non-reentrant) checkpointing each layer
    keeps only its input (s h b) and one layer is recomputed at a time: samples * (layers * s h b + per_layer + final
    norm). The final RMSNorm keeps s h (4 + b)."""
    final_norm = seq * hidden * (4 + dtype_bytes)
    if checkpointing:
        per_sample = layers * seq * hidden * dtype_bytes + per_layer + final_norm
    else:
        per_sample = layers * per_layer + final_norm
    return samples * per_sample


def logits_bytes(
    completion_tokens: int, vocab: int, samples: int, bytes_per_element: int = LOGIT_BYTES_PER_ELEMENT
) -> int:
    """The loss head of one micro-batch: samples * completion positions * vocab * bytes_per_element (fp32 log-softmax,
    probabilities and masked log-probs kept for the entropy, plus the backward's two fp32 tensors; see
    :data:`LOGIT_BYTES_PER_ELEMENT`)."""
    return samples * completion_tokens * vocab * bytes_per_element


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, tokens: int, samples: int, dtype_bytes: int) -> int:
    """HF generate's KV cache at the last step: 2 (k and v) * layers * kv_heads * head_dim * (prompt + new tokens) *
    samples * dtype bytes."""
    return 2 * layers * kv_heads * head_dim * tokens * samples * dtype_bytes


def prefill_bytes(*, prompt_tokens: int, samples: int, hidden: int, intermediate: int, dtype_bytes: int) -> int:
    """The no-grad prefill's largest working set: one layer's MLP (gate, up and their product: 3 f) and the hidden
    states in flight (residual, normalised input, attention output, layer output: 4 h), per prompt token of every
    sample generated at once."""
    return samples * prompt_tokens * (3 * intermediate + 4 * hidden) * dtype_bytes


# ============================================================================ continuous VLA action heads

EXPERT_LAYER_ELEMENTS = 22
"""Elements (x width W, fp32) one chunk token keeps for the backward in one layer of the flow expert or of the Gaussian
head's query stack: 3 LayerNorms (input + output each: 6), self-attention (the fused q/k/v projection 3, the sdpa
output 1, the merged copy the out-projection keeps 1: 5), cross-attention (q 1, sdpa output 1, merged copy 1: 3),
the MLP (4W before and after the GELU: 8). The prefix keys/values the cross-attention reads are counted apart."""
EXPERT_IO_ELEMENTS = 6
"""Flow expert, per chunk token and denoising step outside the layers: the action-time MLP (its concatenated input 2W,
the SiLU's input and output 2W) and the final LayerNorm (input and output 2W)."""
GAUSSIAN_IO_ELEMENTS = 2
"""Gaussian head, per query token outside the layers: the final LayerNorm (input and output)."""
STEP_WORKING_ELEMENTS = 12
"""No-grad working set of one expert step, per chunk token (x W, fp32): the residual stream, a LayerNorm output, the
q/k/v projection (3) or the MLP's hidden before and after its activation (2 x 4W), whichever is alive at once."""
NOISE_HEAD_HIDDEN = 64
"""Hidden width of Flow-Noise's noise head (``FlowNoiseHead(hidden=64)``)."""
CRITIC_HIDDEN = 256
"""Hidden width of the continuous VLA's critic (``ValueHead(prefix_dim, hidden=256)``)."""


@dataclass(frozen=True)
class ContinuousHead:
    """A VLA's continuous action head (``model.action_head=flow|gaussian``) as the planner sees it.

    The head, its noise head, the state projection and the critic are fp32 whatever the backbone's dtype (they are
    built in fp32 next to the backbone; the prefix is cast to fp32 before the head reads it), so their parameters,
    gradients and AdamW state are 4 + 4 + 8 B each and their activations 4 B per element.
    """

    kind: str  # flow | gaussian
    width: int  # W: model.expert_width
    depth: int  # model.expert_depth (gaussian: query layers)
    chunk: int  # H: model.chunk
    action_dim: int  # A: model.head_action_dim or the env's action dims
    num_steps: int = 10  # K: model.num_steps (flow)
    likelihood: str = "flow_sde"  # flow: flow_sde | flow_sde_one | flow_noise
    state_dim: int = 0  # S: dims of the robot state (0: model.use_state=false, no state token)
    log_std: str = "learned"  # gaussian: learned | state

    @property
    def grad_steps(self) -> int:
        """Expert passes recomputed WITH gradients per training row: the stochastic denoising steps of the chunk's
        log-prob (flow_sde: every step but the deterministic last one, K - 1; flow_sde_one: 1; flow_noise: K). The
        Gaussian head: its one pass."""
        if self.kind != "flow":
            return 1
        return {"flow_sde": self.num_steps - 1, "flow_sde_one": 1, "flow_noise": self.num_steps}[self.likelihood]

    @property
    def state_tokens(self) -> int:
        """Tokens the head's prefix has beyond the backbone's sequence: one projected state token (use_state)."""
        return 1 if self.state_dim else 0


def continuous_head_params(head: ContinuousHead, prefix_dim: int, *, value_head: bool = False) -> dict[str, int]:
    """Parameters of the trainable modules outside the backbone, by module (D = ``prefix_dim``, the backbone width).

    * flow expert (``FlowActionExpert``): prefix LayerNorm 2D, action_in A W + W, positions H W, action-time MLP
      3 W^2 + 2 W, final LayerNorm 2 W, action_out W A + A, and per layer 14 W^2 + 2 D W + 19 W (self q/k/v 3 W^2 +
      3 W and out W^2 + W, cross q W^2 + W, cross k/v from the prefix 2 D W + 2 W, cross out W^2 + W, MLP 8 W^2 +
      5 W, 3 LayerNorms 6 W): ``2D + 2AW + A + HW + 3W^2 + 5W + depth (14W^2 + 2DW + 19W)``;
    * Flow-Noise's noise head (flow_noise): ``64 (W + 1 + A) + A``;
    * Gaussian head (``GaussianChunkHead``): queries H W, per layer 14 W^2 + 2 D W + 2 D + 19 W (as the expert's, plus
      its own prefix LayerNorm 2 D), final LayerNorm 2 W, mean W A + A, log-std A (learned) or W A + A (state);
    * state projection (use_state): ``S D + D``;
    * critic (PPO, ``ValueHead``): LayerNorm 2 D, D x 256 + 256, 256 + 1: ``258 D + 513``.
    """
    D, W, H, A, L = prefix_dim, head.width, head.chunk, head.action_dim, head.depth
    out: dict[str, int] = {}
    if head.kind == "flow":
        out["expert"] = 2 * D + 2 * A * W + A + H * W + 3 * W * W + 5 * W + L * (14 * W * W + 2 * D * W + 19 * W)
        if head.likelihood == "flow_noise":
            out["noise_head"] = NOISE_HEAD_HIDDEN * (W + 1 + A) + A
    elif head.kind == "gaussian":
        log_std = A if head.log_std == "learned" else W * A + A
        out["gaussian_head"] = H * W + L * (14 * W * W + 2 * D * W + 2 * D + 19 * W) + 2 * W + W * A + A + log_std
    else:
        raise ValueError(f"unknown continuous head {head.kind!r} (flow, gaussian)")
    if head.state_dim:
        out["state_proj"] = head.state_dim * D + D
    if value_head:
        out["critic"] = (2 + CRITIC_HIDDEN) * D + 2 * CRITIC_HIDDEN + 1
    return out


def head_training_bytes(
    head: ContinuousHead, *, prefix_tokens: int, prefix_dim: int, rows: int, dtype_bytes: int
) -> int:
    """fp32 activations the head keeps for the backward over ``rows`` training rows (each its own observation: the
    upper bound; rows sharing an observation share its prefix terms). P = ``prefix_tokens`` (backbone sequence + the
    state token), D = ``prefix_dim``, W, H, L = depth, b = the backbone's ``dtype_bytes``.

    Per row, 4 B per element:

    * the prefix as the head reads it: the fp32 cast of the backbone's last hidden states (only when b < 4) and the
      prefix LayerNorm's output: ``P D (1 [b < 4] + 1)`` (gaussian: one LayerNorm output per layer);
    * flow: the cross-attention keys/values, computed once per observation and gathered per row
      (``PrefixKV.index_select``): ``L 2 P W``, twice for flow_sde_one (the per-step gather of the rows drawn at each
      step is a second copy alive until the log-prob returns); gaussian: ``L 2 P W``;
    * flow: every expert pass recomputed with gradients (``grad_steps``: K - 1 / 1 / K) keeps
      ``H W (22 L + 6)`` (+ ``H 2 x 64`` for the noise head); gaussian: one pass ``H W (22 L + 2)``.
    """
    P, D, W, H, L = prefix_tokens, prefix_dim, head.width, head.chunk, head.depth
    cast = P * D if dtype_bytes < 4 else 0
    if head.kind == "flow":
        kv_copies = 2 if head.likelihood == "flow_sde_one" else 1
        per_step = H * W * (EXPERT_LAYER_ELEMENTS * L + EXPERT_IO_ELEMENTS)
        if head.likelihood == "flow_noise":
            per_step += H * 2 * NOISE_HEAD_HIDDEN
        per_row = cast + P * D + kv_copies * L * 2 * P * W + head.grad_steps * per_step
    else:
        per_row = cast + L * (P * D + 2 * P * W) + H * W * (EXPERT_LAYER_ELEMENTS * L + GAUSSIAN_IO_ELEMENTS)
    return rows * per_row * 4


def head_rollout_bytes(head: ContinuousHead, *, prefix_tokens: int, prefix_dim: int, samples: int) -> int:
    """fp32 bytes of one no-grad head call for ``samples`` rows (each its own observation: the upper bound).

    Per row: the prefix cast and its LayerNorm output ``2 P D``; flow: the keys/values of the observation and their
    per-row gather ``2 x L 2 P W``, one step's working set ``12 H W`` and the recorded chain, step noise and initial
    noise ``(2K + 2) H A``; gaussian: one layer's keys/values ``2 P W`` and its working set ``12 H W``."""
    P, D, W, H, L, A, K = (
        prefix_tokens,
        prefix_dim,
        head.width,
        head.chunk,
        head.depth,
        head.action_dim,
        head.num_steps,
    )
    per_row = 2 * P * D + STEP_WORKING_ELEMENTS * H * W
    if head.kind == "flow":
        per_row += 2 * L * 2 * P * W + (2 * K + 2) * H * A
    else:
        per_row += 2 * P * W
    return samples * per_row * 4


# ============================================================================ LeRobot flow VLAs (smolvla / pi0 / pi05)
# mmrl's SmolVLA / π0 / π0.5 (mmrl/adapters/vla/lerobot/): the VLM encodes the prefix (cameras, prompt; SmolVLA's state
# token) once per observation into per-layer keys/values (``PrefixCache``); the checkpoint's own expert denoises the
# chunk against them in K steps. Every attention is ``layers.masked_attention``: an explicit fp32 score matrix and
# softmax (no fused kernel) over key/value heads repeated to the query heads. Notation: b the model's bytes per
# element; VLM width h, MLP f, L layers, a query heads, kv key/value heads, d head dim; expert width W, MLP f_e, L_e
# layers; P prefix tokens, S suffix tokens (the chunk H, + π0's state token), A = max_action_dim.

PREFIX_WORKING_SCORE_COPIES = 2
"""fp32 score matrices of ``masked_attention`` alive at once in a no-grad forward (the scores, then the masked copy
or the softmax of it)."""


def flow_vla_vlm_layer_bytes(arch: FlowVLAArch, prefix_tokens: int, dtype_bytes: int) -> int:
    """Bytes one language-model block keeps for the backward, for one observation of P prefix tokens.

    Per token: the 2 RMSNorms ``2 h (4 + 2 b)`` (as :func:`layer_activation_bytes`); the fp32 query the score matmul
    keeps ``4 a d``; the keys repeated to the a query heads in fp32 ``4 a d`` and the values repeated ``b a d``; the
    attention output the o_proj keeps ``b a d``; the softmax output (fp32) and its cast to b when b < 4,
    ``a P (4 + b [b < 4])``; the gated MLP ``4 b f``. The layer's own keys/values are the prefix cache (counted apart,
    :func:`flow_vla_cache_bytes`); RoPE's cos/sin (``P d`` per call) are left out."""
    b, a, d = dtype_bytes, arch.heads, arch.head_dim
    per_token = 2 * arch.width * (4 + 2 * b) + (8 + 2 * b) * a * d + 4 * b * arch.intermediate
    per_token += a * prefix_tokens * (4 + (b if b < 4 else 0))
    return prefix_tokens * per_token


def flow_vla_prefix_bytes(arch: FlowVLAArch, prefix_tokens: int, dtype_bytes: int) -> int:
    """The VLM's activations of one observation: L - 1 full blocks (:func:`flow_vla_vlm_layer_bytes`) and the last
    block's input norm ``P h (4 + 2 b)`` (``encode_prefix`` stops after the last keys/values)."""
    last_norm = prefix_tokens * arch.width * (4 + 2 * dtype_bytes)
    return (arch.layers - 1) * flow_vla_vlm_layer_bytes(arch, prefix_tokens, dtype_bytes) + last_norm


def flow_vla_cache_bytes(arch: FlowVLAArch, prefix_tokens: int, dtype_bytes: int) -> int:
    """The prefix cache of one observation: keys and values of every VLM layer, ``2 L P kv d b``."""
    return 2 * arch.layers * prefix_tokens * arch.kv_dim * dtype_bytes


def flow_vla_vision_bytes(arch: FlowVLAArch, images: int, dtype_bytes: int) -> int:
    """Activations of a trainable vision encoder for one observation of ``images`` cameras: per image the encoder's
    layers over its patches (:func:`activation_bytes` with :func:`layer_activation_bytes`' GELU-MLP rule: sdpa, no
    score matrix) and the projector's input ``tokens x connector_in x b``."""
    v, b = arch.vision, dtype_bytes
    per_layer = layer_activation_bytes(
        v.patches,
        hidden=v.width,
        heads=1,
        kv_heads=1,
        head_dim=v.width,
        intermediate=v.intermediate,
        dtype_bytes=b,
        gated_mlp=False,
    )
    tower = activation_bytes(
        layers=v.depth,
        per_layer=per_layer,
        seq=v.patches,
        hidden=v.width,
        samples=1,
        dtype_bytes=b,
        checkpointing=False,
    )
    return images * (tower + arch.tokens_per_image * arch.connector_in * b)


def flow_vla_expert_pass_bytes(
    arch: FlowVLAArch, prefix_tokens: int, dtype_bytes: int, *, chunk: int | None = None, noise_head: bool = False
) -> int:
    """Bytes one expert pass WITH gradients keeps per row (one chunk), summed over the L_e expert layers.

    Per layer, S suffix tokens: the 2 norms ``2 S W (4 + 2 b)`` (π0.5's adaRMS: ``(4 + 3 b)``, its gated residual
    keeps the branch); the fp32 query ``4 S a d``; the keys and values the queries read, repeated to a heads (keys in
    fp32): ``(P + S) a d (4 + b)`` for a joint layer (the prefix cache concatenated with the chunk's own), ``P a d
    (4 + b)`` for SmolVLA's cross layers (the expert's k/v projections of the cached prefix); the softmax
    ``S a (P + S) (4 + b [b < 4])`` (cross: ``S a P``); the o_proj input ``b S a d``; the gated MLP ``4 b S f_e``.
    Outside the layers: the action-time MLP of π0 / SmolVLA ``4 b H W`` (its input 2W, hidden, SiLU), the final norm
    ``S W (4 + 2 b)``, the fp32 copy of the chunk's features ``4 H W`` when b < 4, Flow-Noise's noise head
    ``H 2 x 64 x 4`` (``noise_head``)."""
    b, a, d, w = dtype_bytes, arch.heads, arch.head_dim, arch.expert_width
    h = chunk if chunk is not None else arch.chunk
    s = h + (1 if arch.family == "pi0" else 0)
    p = prefix_tokens
    cast = b if b < 4 else 0
    norm = (4 + 3 * b) if arch.family == "pi05" else (4 + 2 * b)
    common = 2 * s * w * norm + 4 * s * a * d + b * s * a * d + 4 * b * s * arch.expert_intermediate
    joint = common + (p + s) * a * d * (4 + b) + s * a * (p + s) * (4 + cast)
    cross = common + p * a * d * (4 + b) + s * a * p * (4 + cast)
    n_cross = arch.expert_cross
    layers = (arch.expert_layers - n_cross) * joint + n_cross * cross
    io = s * w * (4 + 2 * b) + (4 * h * w if b < 4 else 0)
    if arch.family != "pi05":
        io += 4 * b * h * w
    if noise_head:
        io += h * 2 * NOISE_HEAD_HIDDEN * 4
    return layers + io


def flow_vla_expert_step_bytes(
    arch: FlowVLAArch, prefix_tokens: int, dtype_bytes: int, chunk: int | None = None
) -> int:
    """No-grad working set of one denoising step per row (the rollout): the keys and values over P + S tokens at
    their kv heads (the concatenation, ``2 (P + S) kv d b``) and repeated to the a query heads (``2 (P + S) a d b``,
    + the keys' fp32 copy ``4 (P + S) a d`` when b < 4), two fp32 score matrices ``2 x 4 S a (P + S)``, and the
    hidden states and MLP of the suffix ``S (4 W + 3 f_e) b``."""
    b, a, d = dtype_bytes, arch.heads, arch.head_dim
    h = chunk if chunk is not None else arch.chunk
    s = h + (1 if arch.family == "pi0" else 0)
    t = prefix_tokens + s
    kv = 2 * t * arch.kv_dim * b + t * a * d * (2 * b + (4 if b < 4 else 0))
    scores = PREFIX_WORKING_SCORE_COPIES * 4 * s * a * t
    return kv + scores + s * (4 * arch.expert_width + 3 * arch.expert_intermediate) * b


def flow_vla_prefix_working_bytes(arch: FlowVLAArch, prefix_tokens: int, images: int, dtype_bytes: int) -> int:
    """No-grad working set of the prefix forward per observation (the rollout), the larger of: the vision encoder over
    one camera's patches ``N (4 w_v + 2 f_v) b`` (the cameras run one after another) and one VLM block, its hidden
    states and MLP ``P (4 h + 3 f) b`` (as :func:`prefill_bytes`) plus two fp32 score matrices ``2 x 4 a P^2``."""
    b, v, p = dtype_bytes, arch.vision, prefix_tokens
    vision = v.patches * (4 * v.width + 2 * v.intermediate) * b if images else 0
    vlm = p * (4 * arch.width + 3 * arch.intermediate) * b + PREFIX_WORKING_SCORE_COPIES * 4 * arch.heads * p * p
    return max(vision, vlm)


def flow_vla_chain_bytes(chunk: int, action_dim: int, num_steps: int) -> int:
    """The denoising record of one row (fp32): the chain ``(K + 1) H A``, the per-step noise ``K H A`` and the
    initial noise ``H A``: ``(2 K + 2) H A x 4``."""
    return (2 * num_steps + 2) * chunk * action_dim * 4


def flow_vla_lora_bytes(
    arch: FlowVLAArch, prefix_tokens: int, dtype_bytes: int, *, r: int, targets: tuple[str, ...]
) -> tuple[int, int]:
    """What LoRA's adapters keep for the backward, per row: (the VLM over the prefix, one expert pass). Per token and
    adapted linear: A's output ``4 r`` (fp32) and, in a 16-bit model, the input PEFT casts to fp32 ``4 in`` (as
    :func:`_lora_activation_terms`). The VLM's linears see the P prefix tokens; the expert's the S suffix tokens, but a
    cross block's k/v, which read the P cached ones."""
    wanted = set(targets)

    def per_token(i: int) -> int:
        return 4 * r + (4 * i if dtype_bytes != 4 else 0)

    prefix = expert = 0
    for stack, cross in arch.lora_blocks():
        for name, (i, _o) in arch.linear_shapes(stack, cross=cross).items():
            if name not in wanted:
                continue
            if stack == "vlm_layers":
                prefix += prefix_tokens * per_token(i)
            else:
                reads_prefix = cross and name in ("k_proj", "v_proj")
                expert += (prefix_tokens if reads_prefix else arch.suffix_tokens) * per_token(i)
    return prefix, expert


def flow_vla_head_params(arch: FlowVLAArch, *, likelihood: str, value_head: bool) -> dict[str, int]:
    """mmrl's fp32 modules next to the checkpoint: Flow-Noise's noise head on the expert's features
    ``64 (W + 1 + A) + A`` (flow_noise) and PPO's critic on the last layer's cached values (``ValueHead(kv d)``:
    ``258 kv d + 513``)."""
    out: dict[str, int] = {}
    if likelihood == "flow_noise":
        out["noise_head"] = NOISE_HEAD_HIDDEN * (arch.expert_width + 1 + arch.max_action_dim) + arch.max_action_dim
    if value_head:
        out["critic"] = (2 + CRITIC_HIDDEN) * arch.kv_dim + 2 * CRITIC_HIDDEN + 1
    return out


# ============================================================================ the whole plan


@dataclass(frozen=True)
class PlanInputs:
    """Everything the planner needs, as numbers (from a run config: :func:`mmrl.planning.report.plan_inputs`)."""

    arch: Architecture
    dtype_bytes: int = 2
    lora: bool = False
    lora_r: int = 16
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    freeze_vision: bool = True
    value_head: bool = False
    gradient_checkpointing: bool = False
    eager_attention: bool = False
    strategy: str = "ddp"
    world_size: int = 1
    offload: str = "none"
    optim_dtype: str = "fp32"
    micro_batch: int = 1  # samples in one training forward
    rollout_samples: int = 1  # samples generated at once on one device
    rollout_forward_batch: int = 0  # diffusion: samples per no-grad denoiser forward (0: all rollout samples)
    text_tokens: int = 0  # prompt text tokens (diffusion: text tokens in the joint attention)
    image_tokens: int = 0  # prompt vision tokens (all images of a prompt)
    images: int = 0  # images per prompt (image_tokens / images per image)
    new_tokens: int = 16  # completion length (model.max_new_tokens)
    kl_reference: bool = False  # algo.kl_coef > 0
    engine: str = "hf"  # hf | vllm
    vllm_fraction: float = 0.3
    vllm_sleep: bool = True
    device_bytes: int = 80 * GIB
    overhead_bytes: int = 0  # CUDA context, NCCL buffers, allocator slack
    rows_per_sample: int = 1  # training rows of one sample: VLA policy calls of an episode; diffusion trained
    # denoising steps x CFG branches
    logit_vocab: int = 0  # vocabulary of the loss head (0: the model's; VLA: the action bins, the head is restricted)
    # diffusion only
    image_latent_tokens: int = 0  # denoiser tokens of one image (latent / patch)
    latent_elements: int = 0  # elements of one latent (for the stored chain)
    num_steps: int = 0  # sampler steps (latents stored per sample: num_steps + 1)
    cfg_branches: int = 1
    # VLA continuous action head (model.action_head=flow|gaussian); None: the tokens head
    head: ContinuousHead | None = None
    # trainer.rollout=async: rollout worker processes on rank 0's device, each a sampling copy of the policy (0: sync)
    rollout_workers: int = 0

    def with_(self, **kw) -> PlanInputs:
        return replace(self, **kw)

    @property
    def prompt_tokens(self) -> int:
        return self.text_tokens + self.image_tokens

    @property
    def seq(self) -> int:
        """Tokens of one training sequence: prompt (image + text) + completion."""
        return self.prompt_tokens + self.new_tokens


@dataclass
class MemoryBreakdown:
    """Per-device bytes of each term, the total, and the numbers behind them."""

    params: int
    grads: int
    optimizer: int
    activations: int
    logits: int
    rollout: int  # KV cache + prefill working set (hf), or vLLM's reservation (vllm)
    reference: int
    fsdp_buffers: int
    overhead: int
    vllm_persistent: int
    counts: ParamCounts
    per_layer: int = 0  # activation bytes of one layer for one sample
    kv_cache: int = 0
    prefill: int = 0
    head_params: int = 0  # continuous VLA head: fp32 trainable parameters outside the backbone (expert, critic, ...)
    head_activations: int = 0  # part of ``activations``: the head's fp32 activations of one micro-batch
    head_rollout: int = 0  # part of ``rollout``: one no-grad head call over the rollout's rows
    hidden_states: int = 0  # part of ``rollout``: the backbone's hidden states of every layer (output_hidden_states)
    notes: list[str] = field(default_factory=list)
    detail: dict[str, int] = field(default_factory=dict)  # LeRobot flow VLAs: the named terms (``_plan_flow_vla``)
    # trainer.rollout=async (0 when synchronous): the worker processes on rank 0's device and ONE worker's terms
    rollout_workers: int = 0
    worker_weights: int = 0  # its policy's weights as it builds them from the config (unsharded, their own dtypes)
    worker_rollout: int = 0  # the rollout peak of one round (a step's global batch; vLLM: its reservation)
    worker_overhead: int = 0  # its own runtime overhead (a process: its own CUDA context)
    weight_board: int = 0  # host memory of the learner: the shared-memory CPU copy of the policy model's state_dict

    @property
    def persistent(self) -> int:
        return self.params + self.optimizer + self.reference + self.fsdp_buffers + self.overhead + self.vllm_persistent

    @property
    def training(self) -> int:
        return self.grads + self.activations + self.logits

    @property
    def learner(self) -> int:
        """The learner's part of a device: persistent + max(training, rollout) (the whole total when synchronous)."""
        return self.persistent + max(self.training, self.rollout)

    @property
    def worker(self) -> int:
        """One rollout worker's sampling copy: weights + rollout peak + overhead (0 when synchronous; no KL reference:
        a worker builds its policy without one, :func:`mmrl.asynchronous.worker.sampling_config`)."""
        return self.worker_weights + self.worker_rollout + self.worker_overhead

    @property
    def workers(self) -> int:
        return self.rollout_workers * self.worker

    @property
    def total(self) -> int:
        """The busiest device: the learner + every rollout worker (they run on rank 0's device)."""
        return self.learner + self.workers

    def host_ram(self, processes: int) -> int:
        """The RAM a CPU run needs on one machine with ``processes`` learner processes: each its learner part, plus
        the rollout workers (rank 0's) and the learner's weight board."""
        return self.learner * processes + self.workers + self.weight_board

    def fits(self, device_bytes: int) -> bool:
        return self.total <= device_bytes


def _lora_activation_terms(text: TextArch, inp: PlanInputs) -> tuple[int, int]:
    """(sum of adapted modules' input widths if PEFT casts them to fp32, sum of ranks) for one layer."""
    if not inp.lora:
        return 0, 0
    shapes = text.linear_shapes()
    targets = [n for n in shapes if n in set(inp.lora_targets)]
    inputs = sum(shapes[n][0] for n in targets) if inp.dtype_bytes != 4 else 0
    return inputs, inp.lora_r * len(targets)


def _fsdp_buffers(arch: Architecture, inp: PlanInputs) -> int:
    """FSDP2's unsharded units: the root (everything outside the decoder layers and vision blocks) for the whole pass
    plus two decoder layers (current + prefetched), in the model dtype."""
    if inp.strategy != "fsdp2" or inp.world_size <= 1:
        return 0
    b = inp.dtype_bytes
    if arch.text is not None:
        t = arch.text
        root = t.params() - t.layers * t.layer_params()
        if arch.vision is not None:  # patch embedding, mergers, position embeddings: the tower minus its blocks
            v = arch.vision
            root += 0 if v.depth == 0 else _vision_root(arch)
        return (root + 2 * t.layer_params()) * b
    return 2 * arch.decoder_layer_params() * b


def _vision_root(arch: Architecture) -> int:
    from mmrl.planning.architectures import vision_params

    v = arch.vision
    one_block = vision_params(replace(v, depth=2)) - vision_params(replace(v, depth=1))
    return v.params() - v.depth * one_block


def sampling_copy_inputs(inp: PlanInputs) -> PlanInputs:
    """The inputs of one asynchronous rollout worker's policy copy: the run's model as the worker builds it from the
    config, in its own process (unsharded, nothing offloaded, no KL reference: the worker builds with
    ``algo.kl_coef`` 0, :func:`mmrl.asynchronous.worker.sampling_config`), rolling out one round: at most a step's
    global batch, since rank 0 samples every rank's groups (the per-device rollout x world size)."""
    return inp.with_(
        rollout_workers=0,
        strategy="ddp",
        world_size=1,
        offload="none",
        kl_reference=False,
        rollout_samples=inp.rollout_samples * inp.world_size,
    )


def weight_board_bytes(inp: PlanInputs, copy: MemoryBreakdown) -> int:
    """The learner's weight board (mmrl/asynchronous/weights.py): a CPU copy of every ``state_dict`` entry of the
    policy's model, each in its own dtype, from the unsharded parameters of a sampling copy (``copy``). The model is
    the policy's trained module: a diffusion pipeline's text encoders and VAE are not in it. Tied embeddings are two
    ``state_dict`` entries sharing one tensor, copied one by one: the board holds the embedding twice."""
    board = copy.params
    if inp.arch.diffusion is not None:
        board -= inp.arch.diffusion.frozen_params * inp.dtype_bytes
    elif inp.arch.text is not None and inp.arch.text.tie_embeddings:
        board += inp.arch.text.vocab * inp.arch.text.hidden * inp.dtype_bytes
    return board


def _with_rollout_workers(inp: PlanInputs) -> MemoryBreakdown:
    """The learner's plan (as synchronous) with the rollout workers' sampling copies and the weight board added."""
    bd = plan_memory(inp.with_(rollout_workers=0))
    copy = plan_memory(sampling_copy_inputs(inp))
    bd.rollout_workers = inp.rollout_workers
    bd.worker_weights = copy.params
    bd.worker_rollout = copy.rollout + copy.vllm_persistent
    bd.worker_overhead = inp.overhead_bytes
    bd.weight_board = weight_board_bytes(inp, copy)
    return bd


def plan_memory(inp: PlanInputs) -> MemoryBreakdown:
    """The per-device memory of one training run (bytes per term; see the module docstring for the conventions)."""
    if inp.rollout_workers:
        return _with_rollout_workers(inp)
    arch = inp.arch
    head = inp.head
    if arch.flow_vla is not None:
        return _plan_flow_vla(inp)
    counts = param_counts(
        arch,
        dtype_bytes=inp.dtype_bytes,
        lora=inp.lora,
        lora_r=inp.lora_r,
        lora_targets=inp.lora_targets,
        freeze_vision=inp.freeze_vision,
        value_head=inp.value_head and head is None,  # a continuous head's critic is counted with the head
    )
    state = model_state_bytes(
        counts, strategy=inp.strategy, world_size=inp.world_size, offload=inp.offload, optim_dtype=inp.optim_dtype
    )
    head_params = 0
    if head is not None:  # fp32 modules next to the backbone: 4 B parameters and gradients, 8 B AdamW moments
        head_params = sum(continuous_head_params(head, arch.text.hidden, value_head=inp.value_head).values())
        hs = model_state_bytes(
            ParamCounts(head_params, 0, 4, 4),
            strategy=inp.strategy,
            world_size=inp.world_size,
            offload=inp.offload,
            optim_dtype=inp.optim_dtype,
        )
        state = StateBytes(state.params + hs.params, state.grads + hs.grads, state.optimizer + hs.optimizer)
    b = inp.dtype_bytes
    notes: list[str] = []
    reference = 0
    if inp.kl_reference and not inp.lora:  # a frozen deep copy of the (unsharded) trainable module
        if arch.diffusion is not None:
            reference = arch.diffusion.denoiser_params * b
        else:
            reference = (
                counts.trainable * counts.trainable_bytes + counts.frozen * counts.frozen_bytes + head_params * 4
            )
    if head is not None and inp.kl_reference and inp.lora:
        notes.append("a continuous head with LoRA has no KL reference (the policy refuses it): set algo.kl_coef=0")
    if arch.diffusion is not None:
        return _plan_diffusion(inp, counts, state, reference, notes)

    t = arch.text
    rows = inp.micro_batch * inp.rows_per_sample  # VLA: one row per (episode, policy call)
    lora_in, lora_r = _lora_activation_terms(t, inp)
    per_layer = layer_activation_bytes(
        inp.seq,
        hidden=t.hidden,
        heads=t.heads,
        kv_heads=t.kv_heads,
        head_dim=t.head_dim,
        intermediate=t.intermediate,
        dtype_bytes=b,
        eager_attention=inp.eager_attention,
        lora_inputs=lora_in,
        lora_rank_sum=lora_r,
    )
    acts = activation_bytes(
        layers=t.layers,
        per_layer=per_layer,
        seq=inp.seq,
        hidden=t.hidden,
        samples=rows,
        dtype_bytes=b,
        checkpointing=inp.gradient_checkpointing,
    )
    if arch.vision is not None and not inp.freeze_vision and inp.image_tokens:
        v = arch.vision
        patches = inp.image_tokens * v.merge**2
        v_layer = layer_activation_bytes(
            patches,
            hidden=v.hidden,
            heads=v.heads,
            kv_heads=v.heads,
            head_dim=v.hidden // v.heads,
            intermediate=v.intermediate,
            dtype_bytes=b,
            eager_attention=inp.eager_attention,
            gated_mlp=v.family == "qwen2_5_vl",
        )
        acts += activation_bytes(
            layers=v.depth,
            per_layer=v_layer,
            seq=patches,
            hidden=v.hidden,
            samples=rows,
            dtype_bytes=b,
            checkpointing=inp.gradient_checkpointing,
        )
        notes.append("vision tower trains: its activations are included")
    logits = logits_bytes(inp.new_tokens, inp.logit_vocab or t.vocab, rows)
    kv = prefill = 0
    vllm_persistent = 0
    if inp.engine == "vllm":
        reservation = int(inp.vllm_fraction * inp.device_bytes)
        if inp.vllm_sleep:
            rollout = reservation
        else:
            rollout, vllm_persistent = 0, reservation
    else:
        kv = kv_cache_bytes(
            layers=t.layers,
            kv_heads=t.kv_heads,
            head_dim=t.head_dim,
            tokens=inp.seq,
            samples=inp.rollout_samples,
            dtype_bytes=b,
        )
        prefill = prefill_bytes(
            prompt_tokens=inp.prompt_tokens,
            samples=inp.rollout_samples,
            hidden=t.hidden,
            intermediate=t.intermediate,
            dtype_bytes=b,
        )
        rollout = kv + prefill
    head_acts = head_roll = hidden_states = 0
    fsdp = _fsdp_buffers(arch, inp)
    if head is not None:
        # the backbone runs the prefix only (no action tokens, no KV cache: use_cache=False), keeps the logits of its
        # last position (logits_to_keep=1) and hands every layer's hidden states back (output_hidden_states)
        prefix = inp.seq + head.state_tokens
        logits = rows * t.vocab * b
        head_acts = head_training_bytes(head, prefix_tokens=prefix, prefix_dim=t.hidden, rows=rows, dtype_bytes=b)
        acts += head_acts
        hidden_states = inp.rollout_samples * (t.layers + 1) * inp.seq * t.hidden * b
        head_roll = head_rollout_bytes(head, prefix_tokens=prefix, prefix_dim=t.hidden, samples=inp.rollout_samples)
        kv = vllm_persistent = 0  # the continuous policy samples with its own forwards, never through vLLM
        rollout = prefill + hidden_states + head_roll
        if fsdp:
            fsdp += head_params * 4  # the heads live in the root unit, gathered for the whole pass
    return MemoryBreakdown(
        params=state.params,
        grads=state.grads,
        optimizer=state.optimizer,
        activations=acts,
        logits=logits,
        rollout=rollout,
        reference=reference,
        fsdp_buffers=fsdp,
        overhead=inp.overhead_bytes,
        vllm_persistent=vllm_persistent,
        counts=counts,
        per_layer=per_layer,
        kv_cache=kv,
        prefill=prefill,
        head_params=head_params,
        head_activations=head_acts,
        head_rollout=head_roll,
        hidden_states=hidden_states,
        notes=notes,
    )


def _plan_diffusion(
    inp: PlanInputs, counts: ParamCounts, state: StateBytes, reference: int, notes: list[str]
) -> MemoryBreakdown:
    """Diffusion: every trained (sample, step) row of a micro-batch keeps its denoiser activations until the backward
    (``log_probs`` returns all trained steps at once); a row is image latent tokens (+ joint text tokens) through the
    transformer blocks with a GELU MLP of 4 h. The rollout keeps the latent chain (fp32) of every sample plus a
    no-grad block's working set. The SD1.5 UNet is approximated with the same rule over its 16 attention blocks at
    width 640 (rough: docs/scaling.md)."""
    d = inp.arch.diffusion
    b = inp.dtype_bytes
    seq = inp.image_latent_tokens + inp.text_tokens
    per_layer = layer_activation_bytes(
        seq,
        hidden=d.hidden,
        heads=d.heads,
        kv_heads=d.heads,
        head_dim=d.head_dim,
        intermediate=4 * d.hidden,
        dtype_bytes=b,
        eager_attention=inp.eager_attention,
        gated_mlp=False,
    )
    rows = inp.micro_batch * inp.rows_per_sample
    acts = activation_bytes(
        layers=d.layers,
        per_layer=per_layer,
        seq=seq,
        hidden=d.hidden,
        samples=rows,
        dtype_bytes=b,
        checkpointing=inp.gradient_checkpointing,
    )
    if d.unet:
        notes.append("SD1.5 UNet activations use the transformer rule at width 640 (rough)")
    chain = inp.rollout_samples * (inp.num_steps + 1) * inp.latent_elements * 4
    working = (inp.rollout_forward_batch or inp.rollout_samples) * inp.cfg_branches * per_layer
    return MemoryBreakdown(
        params=state.params,
        grads=state.grads,
        optimizer=state.optimizer,
        activations=acts,
        logits=0,
        rollout=chain + working,
        reference=reference,
        fsdp_buffers=_fsdp_buffers(inp.arch, inp),
        overhead=inp.overhead_bytes,
        vllm_persistent=0,
        counts=counts,
        per_layer=per_layer,
        kv_cache=0,
        prefill=chain + working,
        notes=notes,
    )


def _plan_flow_vla(inp: PlanInputs) -> MemoryBreakdown:
    """LeRobot's SmolVLA / π0 / π0.5 (``inp.arch.flow_vla``; ``inp.head`` carries the chunk H, A = max_action_dim, K
    and the likelihood). Full fine-tuning of the model (the vision encoder and its projector frozen with
    ``freeze_vision``), or with ``inp.lora`` fp32 adapters on the VLM's and the expert's blocks, which are frozen with
    the embeddings (:meth:`FlowVLAArch.lora_frozen_params`; their activations: :func:`flow_vla_lora_bytes`); mmrl's fp32
    critic / noise head next to it. Training rows = episodes x policy calls, each its own
    observation (the upper bound): per row the vision encoder (when it trains), the VLM over the prefix, the prefix
    cache plus its per-row gather (two with flow_sde_one), and ``grad_steps`` expert passes. The rollout runs one policy
    call for every env slot at once, without gradients: the larger of the prefix phase (cache + the prefix forward's
    working set) and the expert phase (cache + its per-row gather + one step's working set + the K-step record)."""
    fv, head, b = inp.arch.flow_vla, inp.head, inp.dtype_bytes
    model = fv.model_params()
    frozen = (fv.vision_params() if inp.freeze_vision else 0) + (fv.lora_frozen_params() if inp.lora else 0)
    counts = ParamCounts(model - frozen, frozen, b, b)
    kw = dict(strategy=inp.strategy, world_size=inp.world_size, offload=inp.offload, optim_dtype=inp.optim_dtype)
    state = model_state_bytes(counts, **kw)
    heads = flow_vla_head_params(fv, likelihood=head.likelihood, value_head=inp.value_head)
    if inp.lora:  # the adapters are fp32, like mmrl's heads
        heads["lora"] = fv.lora_params(inp.lora_targets, inp.lora_r)
    head_params = sum(heads.values())
    if head_params:
        hs = model_state_bytes(ParamCounts(head_params, 0, 4, 4), **kw)
        state = StateBytes(state.params + hs.params, state.grads + hs.grads, state.optimizer + hs.optimizer)
    # a frozen copy of everything, adapters included (with LoRA too: the projections train)
    reference = model * b + head_params * 4 if inp.kl_reference else 0

    prefix_tokens = fv.prefix_tokens(1, inp.image_tokens, inp.text_tokens)
    lora_prefix, lora_pass = (
        flow_vla_lora_bytes(fv, prefix_tokens, b, r=inp.lora_r, targets=inp.lora_targets) if inp.lora else (0, 0)
    )
    rows = inp.micro_batch * inp.rows_per_sample
    cache = flow_vla_cache_bytes(fv, prefix_tokens, b)
    gathers = 2 if head.likelihood == "flow_sde_one" else 1
    vision = 0 if inp.freeze_vision else flow_vla_vision_bytes(fv, inp.images, b)
    prefix = flow_vla_prefix_bytes(fv, prefix_tokens, b) + lora_prefix
    per_pass = lora_pass + flow_vla_expert_pass_bytes(
        fv, prefix_tokens, b, chunk=head.chunk, noise_head=head.likelihood == "flow_noise"
    )
    expert = head.grad_steps * per_pass
    acts = rows * (vision + prefix + (1 + gathers) * cache + expert)

    n = inp.rollout_samples
    working = flow_vla_prefix_working_bytes(fv, prefix_tokens, inp.images, b)
    step = flow_vla_expert_step_bytes(fv, prefix_tokens, b, chunk=head.chunk)
    chain = flow_vla_chain_bytes(head.chunk, head.action_dim, head.num_steps)
    prefix_phase, expert_phase = n * (cache + working), n * (2 * cache + step + chain)
    fsdp = 0
    if inp.strategy == "fsdp2" and inp.world_size > 1:
        # only the vision encoder's blocks are FSDP units (``_no_split_modules``); the VLM and expert layers sit in the
        # root unit, gathered for the whole pass
        fsdp = (model - fv.vision.params() + 2 * fv.vision.layer_params()) * b + head_params * 4
    detail = {
        "prefix_tokens": prefix_tokens,
        "rows": rows,
        "vision_activations": rows * vision,
        "prefix_activations": rows * prefix,
        "prefix_cache": rows * (1 + gathers) * cache,
        "expert_activations": rows * expert,
        "expert_pass_per_row": per_pass,
        "lora_prefix_per_row": lora_prefix,
        "lora_expert_pass_per_row": lora_pass,
        "cache_per_observation": cache,
        "rollout_prefix_phase": prefix_phase,
        "rollout_expert_phase": expert_phase,
        "rollout_cache": n * 2 * cache,
        "rollout_prefix_working": n * working,
        "rollout_expert_step": n * step,
        "rollout_chain": n * chain,
        **{f"head_params_{k}": v for k, v in heads.items()},
    }
    return MemoryBreakdown(
        params=state.params,
        grads=state.grads,
        optimizer=state.optimizer,
        activations=acts,
        logits=0,
        rollout=max(prefix_phase, expert_phase),
        reference=reference,
        fsdp_buffers=fsdp,
        overhead=inp.overhead_bytes,
        vllm_persistent=0,
        counts=counts,
        per_layer=flow_vla_vlm_layer_bytes(fv, prefix_tokens, b),
        kv_cache=n * 2 * cache,
        prefill=n * working,
        head_params=head_params,
        head_activations=rows * expert,
        head_rollout=n * (step + chain),
        detail=detail,
    )
