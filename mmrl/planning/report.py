"""``mmrl plan``: the run config + ``plan.*`` settings -> planner inputs -> a printed table (docs/scaling.md).

``plan.*`` keys are a namespace of their own: :func:`split_plan_overrides` takes them out of the command line before
the rest goes to :func:`mmrl.config.load_config`, exactly as ``mmrl train`` would read it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from mmrl.models.configs import VLMConfig
from mmrl.planning.advice import Suggestion, suggest
from mmrl.planning.architectures import (
    PLANNED_TYPES,
    Architecture,
    UnknownArchitectureError,
    image_tokens_for,
    resolve_architecture,
)
from mmrl.planning.memory import (
    GIB,
    LOGIT_BYTES_PER_ELEMENT,
    ContinuousHead,
    MemoryBreakdown,
    PlanInputs,
    dtype_bytes,
    plan_memory,
)

log = logging.getLogger(__name__)

__all__ = ["PlanSettings", "build_plan", "format_report", "plan_inputs", "report_json", "split_plan_overrides"]

# Processor defaults when model.max_pixels is null: Qwen2/2.5-VL's image processor max_pixels 12845056 and Qwen3-VL's
# longest_edge 16777216 (16384 vision tokens either way); the tiny builds' own budget is 256 tokens.
_DEFAULT_MAX_TOKENS_REAL = 16384
DEFAULT_TEXT_TOKENS = 128
"""Text tokens of a prompt when ``plan.text_tokens`` is not given (chat template + question)."""
DEFAULT_STATE_DIM = 8
"""Robot-state dims assumed for a continuous head's state projection when ``model.state_mean`` is not set (LIBERO's
8: end-effector position 3 + axis-angle 3 + gripper 2; the projection's S x D + D parameters are negligible)."""


@dataclass
class PlanSettings:
    """``plan.*`` keys of ``mmrl plan`` (not part of the run config)."""

    device_gb: float = 80.0
    """Memory of one device in GiB (an "80 GB" H100 / A100 has 79.6 GiB; leave some headroom)."""
    world_size: int = 1
    """Devices (processes) the run is spread over."""
    strategy: str = "ddp"
    """ddp (replicated parameters / gradients / optimizer state) or fsdp2 (sharded over world_size)."""
    offload: str = "none"
    """none, optimizer (AdamW state on CPU) or params (fsdp2: parameters, gradients and optimizer state on CPU)."""
    optim: str = "fp32"
    """AdamW state: fp32 (fp32 moments, + an fp32 master copy for 16-bit full fine-tuning; 12 B / parameter) or model
    (moments in the parameter dtype, no master copy: torch AdamW on a bf16 model, as the trainer builds it today)."""
    text_tokens: int | None = None
    """Text tokens of a prompt (chat template + question); default 128 (model.architecture=smolvla|pi0|pi05: the
    checkpoint's tokenizer_max_length, the prompt's padded length)."""
    images: int | None = None
    """Images per prompt; default 1 for vlm / vla models, 0 otherwise."""
    image_tokens: int | None = None
    """Vision tokens of one image; default model.max_pixels / (patch * merge)**2 (the processor's own budget when
    max_pixels is null)."""
    overhead_gb: float | None = None
    """Fixed per-device overhead in GiB (CUDA context, NCCL buffers, allocator slack); default 1.0, and 0 for a CPU run
    (trainer.device=cpu or a float32 model)."""
    json: bool = False
    """Print the breakdown as JSON (bytes) instead of the table."""

    def validate(self) -> None:
        from mmrl.errors import ConfigError, check_choice

        check_choice(self.strategy, ("ddp", "fsdp2"), "plan.strategy")
        check_choice(self.offload, ("none", "optimizer", "params"), "plan.offload")
        check_choice(self.optim, ("fp32", "model"), "plan.optim")
        if self.offload == "params" and self.strategy != "fsdp2":
            raise ConfigError("plan.offload=params needs plan.strategy=fsdp2 (FSDP2's CPUOffloadPolicy)")
        if not self.device_gb > 0 or self.world_size < 1 or (self.text_tokens or 0) < 0 or (self.overhead_gb or 0) < 0:
            raise ConfigError(
                "plan.device_gb must be > 0, plan.world_size >= 1, plan.text_tokens and plan.overhead_gb >= 0"
            )
        if (self.images is not None and self.images < 0) or (self.image_tokens is not None and self.image_tokens < 0):
            raise ConfigError("plan.images and plan.image_tokens must be >= 0")


def split_plan_overrides(overrides: list[str]) -> tuple[PlanSettings, list[str]]:
    """``plan.*`` overrides -> :class:`PlanSettings` (validated, unknown keys named); the rest unchanged."""
    from mmrl.config import from_dict, parse_override

    raw: dict[str, Any] = {}
    rest = []
    for ov in overrides:
        key = ov.lstrip("+").split("=", 1)[0]
        if key == "plan" or key.startswith("plan."):
            from mmrl.errors import ConfigError

            if "=" not in ov or key == "plan":
                raise ConfigError(f"override '{ov}' is not of the form plan.KEY=value")
            value = ov.split("=", 1)[1]
            raw[key[len("plan.") :]] = parse_override(ov)[1] if value else None  # read as `mmrl train` reads values
        else:
            rest.append(ov)
    return from_dict(PlanSettings, raw, "plan"), rest


# ============================================================================ config -> inputs


def _vocab_hint(cfg) -> int | None:
    """The tiny LM's vocabulary: the task's characters + <pad>, <bos>, <eos> (only toy tasks have one)."""
    try:
        from mmrl.tasks import get_task_class

        vocab = get_task_class(cfg.task.name)(cfg.task, cfg).policy_spec().vocabulary
    except Exception:  # noqa: BLE001 - a task without a vocabulary (or that cannot be built offline): no hint
        return None
    return len(set(vocab)) + 3 if vocab else None


def _trained_steps(m) -> int:
    if m.train_steps == "all_but_last":
        return m.num_steps - 1
    if m.train_steps == "random_fraction":
        return max(1, math.ceil(m.train_fraction * (m.num_steps - 1)))
    return m.window_size


def _overhead_gb(cfg, settings: PlanSettings) -> float:
    """The runtime overhead per device: ``plan.overhead_gb``, else the model type's ``runtime_overhead_gb`` hook
    (:func:`mmrl.models.registry.model_hook`) where it gives one, else 1 GB on an accelerator below float32."""
    from mmrl.models.registry import model_hook

    if settings.overhead_gb is not None:
        return settings.overhead_gb
    hook = model_hook(cfg.model.type, "runtime_overhead_gb")
    own = hook(cfg.model, cfg.trainer.device) if hook is not None else None
    if own is not None:
        return own
    return 0.0 if cfg.trainer.device == "cpu" or cfg.model.dtype == "float32" else 1.0


class _PlannedModel:
    """The config of a model type sized by its adapter's memory model, as the planner reads it: the config's own
    fields, and where it lacks one of the fields every core model config has (``path``, ``dtype``,
    ``gradient_checkpointing``, ``lora``, a token model's ``max_new_tokens``), the core default (float32, no
    checkpointing, no LoRA, 16 new tokens): an adapter's config need not mirror the core's to be planned."""

    def __init__(self, model_cfg: Any) -> None:
        self.config = model_cfg
        """The adapter's own config (what its memory model is given)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self.config, name)
        except AttributeError:
            from mmrl.models.configs import TokenModelConfig

            if name in ("path", "dtype", "gradient_checkpointing", "lora", "max_new_tokens"):
                return getattr(TokenModelConfig(), name)
            raise


def planned_config(cfg):
    """``cfg`` as the planner reads it: unchanged for the model types it sizes itself (:data:`PLANNED_TYPES`), else
    a copy whose model fills in the core defaults the adapter's config lacks (:class:`_PlannedModel`)."""
    import dataclasses

    if cfg.model.type in PLANNED_TYPES or isinstance(cfg.model, _PlannedModel):
        return cfg
    return dataclasses.replace(cfg, model=_PlannedModel(cfg.model))


def plan_inputs(cfg, settings: PlanSettings, arch: Architecture | None = None) -> tuple[PlanInputs, dict]:
    """:class:`PlanInputs` of a validated run config and the ``plan.*`` settings, plus the derived numbers the report
    prints (``info``)."""
    from mmrl.errors import ConfigError

    m, tr, algo = cfg.model, cfg.trainer, cfg.algo
    if arch is None:
        vocab = _vocab_hint(cfg) if m.type == "causal_lm" and m.path == "tiny" else None
        arch = resolve_architecture(m.config if isinstance(m, _PlannedModel) else m, vocab_hint=vocab)
    world = settings.world_size
    if tr.batch_size % world:
        raise ConfigError(f"trainer.batch_size={tr.batch_size} must be divisible by plan.world_size={world}")
    prompts = tr.batch_size // world
    group = algo.group_size
    samples = prompts * group  # trained samples per device per step
    minibatch = math.ceil(samples / algo.num_minibatches)
    micro = math.ceil(minibatch / tr.grad_accum)
    info: dict[str, Any] = {
        "prompts_per_device": prompts,
        "samples_per_device": samples,
        "minibatch": minibatch,
        "micro_batch": micro,
    }
    common = dict(
        arch=arch,
        dtype_bytes=dtype_bytes(m.dtype),
        lora=bool(m.lora.enabled),
        lora_r=int(m.lora.r),
        lora_targets=tuple(m.lora.target_modules),
        gradient_checkpointing=bool(m.gradient_checkpointing),
        eager_attention=isinstance(m, VLMConfig) and m.attn_implementation == "eager",
        strategy=settings.strategy,
        world_size=world,
        offload=settings.offload,
        optim_dtype=settings.optim,
        micro_batch=micro,
        kl_reference=algo.kl_coef > 0,
        device_bytes=int(settings.device_gb * GIB),
        overhead_bytes=int(_overhead_gb(cfg, settings) * GIB),
        value_head=algo.advantage == "gae",
        rollout_workers=tr.rollout_workers if tr.rollout == "async" else 0,
    )
    if arch.flow_vla is not None:
        return _flow_vla_inputs(cfg, settings, arch, common, samples, info)
    if arch.diffusion is not None:
        d = arch.diffusion
        res = m.resolution or (512 if d.unet else 1024)
        latent_side = res // d.vae_factor
        cfg_branches = 2 if (m.guidance_scale > 1.0 and not d.guidance_embeds) else 1
        steps = _trained_steps(m)
        inp = PlanInputs(
            **common,
            rollout_samples=samples,
            rollout_forward_batch=m.sample_batch_size or 0,  # 0: every rollout sample at once
            image_latent_tokens=(latent_side // d.patch) ** 2,
            latent_elements=d.latent_channels * latent_side * latent_side,
            num_steps=m.num_steps,
            rows_per_sample=steps * cfg_branches,
            cfg_branches=cfg_branches,
            new_tokens=0,
            text_tokens=d.text_tokens + (m.max_sequence_length if d.joint_t5 else 0),
        )
        info.update(resolution=res, trained_steps=steps, cfg_branches=cfg_branches)
        return inp, info
    images = settings.images if settings.images is not None else (1 if m.type in ("vlm", "vla") else 0)
    per_image = 0
    if arch.vision is not None and images:
        if settings.image_tokens is not None:
            per_image = settings.image_tokens
        else:
            tiny = str(m.path).startswith("tiny")
            default_tokens = 256 if tiny else _DEFAULT_MAX_TOKENS_REAL
            per_image = image_tokens_for(
                arch.vision,
                m.max_pixels if isinstance(m, VLMConfig) else None,
                default_tokens * arch.vision.pixels_per_token,
            )
    head = _continuous_head(cfg) if m.type == "vla" else None
    vla = _vla_episode(cfg, arch) if m.type == "vla" else {}
    if vla:  # every policy call is a training row; its image is the task's camera frame, not the processor's budget
        info.update(vla)
        if images and settings.image_tokens is None:
            per_image = vla["image_tokens"]
    probes = 0
    if algo.tgrpo is not None and algo.tgrpo.shuffled_group > 0:
        probes = prompts * algo.tgrpo.shuffled_group  # video prompts: shuffled-frame probes are rolled out too
    vlm = m if isinstance(m, VLMConfig) else VLMConfig()  # another type: the VLM defaults (frozen tower, hf)
    inp = PlanInputs(
        **common,
        freeze_vision=vlm.freeze_vision_tower,
        rollout_samples=samples + probes,
        text_tokens=settings.text_tokens if settings.text_tokens is not None else DEFAULT_TEXT_TOKENS,
        images=images,
        image_tokens=images * per_image,
        new_tokens=vla["tokens_per_call"] if vla else int(m.max_new_tokens),
        rows_per_sample=vla.get("policy_calls", 1),
        logit_vocab=int(m.n_bins) if vla and head is None else 0,
        head=head,
        engine=vlm.rollout_engine,
        vllm_fraction=float(vlm.vllm_gpu_memory_utilization),
        vllm_sleep=vlm.vllm_sleep,
    )
    info.update(per_image_tokens=per_image)
    return inp, info


def _vla_episode(cfg, arch: Architecture) -> dict[str, Any]:
    """A VLA run's training rows, from the task's settings (no env is built): policy calls per episode (the longest
    episode: max_steps / chunk), action tokens per call (chunk x action dims) and the vision tokens of one camera
    frame (each side rounded to the processor's patch x merge grid, as Qwen-VL's resize does)."""
    from mmrl.tasks import get_task_class

    task = get_task_class(cfg.task.name)(cfg.task, cfg)
    spec = task.env_spec()
    m = cfg.model
    chunk = int(m.chunk)
    continuous = _head_memory_kind(m) is not None
    executed = int(m.n_action_steps or chunk)  # env steps per policy call
    height, width = task.frame_size()
    side = arch.vision.patch * arch.vision.merge if arch.vision is not None else 1
    tokens = max(1, round(height / side)) * max(1, round(width / side))
    calls = math.ceil(spec.max_steps / executed)
    if m.max_policy_calls is not None:
        calls = min(calls, int(m.max_policy_calls))
    out = {
        "cameras": len(task.cameras),
        "policy_calls": calls,
        "tokens_per_call": 0 if continuous else chunk * spec.action_dim,
        "image_tokens": tokens,
        "frame": f"{height}x{width}",
        "action_dim": int(spec.action_dim),
    }
    if continuous:
        out["action_head"] = m.action_head
    return out


def _flow_vla_inputs(cfg, settings: PlanSettings, arch: Architecture, common: dict, samples: int, info: dict):
    """:class:`PlanInputs` of ``model.architecture=smolvla|pi0|pi05``: the prefix is the checkpoint's cameras (a
    folder's image features, else the task's cameras) x its tokens per image + the prompt padded to the tokenizer's
    max length; the expert's chunk, K and likelihood are the run's; ``inp.head`` carries them (its action dims are the
    checkpoint's padded max_action_dim, what the chain records). Full fine-tuning, or LoRA (``model.lora``) on the
    VLM's and the expert's blocks; ``model.gradient_checkpointing`` is not applied by these policies, so it is planned
    off."""
    m = cfg.model
    fv = arch.flow_vla
    vla = _vla_episode(cfg, arch)
    info.update(vla)
    images = settings.images if settings.images is not None else (fv.cameras or vla["cameras"])
    per_image = settings.image_tokens if settings.image_tokens is not None else fv.tokens_per_image
    text = settings.text_tokens if settings.text_tokens is not None else fv.tokenizer_max_length
    head = ContinuousHead(
        kind="flow",
        width=fv.expert_width,
        depth=fv.expert_layers,
        chunk=int(m.chunk),
        action_dim=fv.max_action_dim,
        num_steps=int(m.num_steps),
        likelihood=str(m.likelihood),
    )
    notes = []
    if int(m.chunk) != fv.chunk:
        notes.append(
            f"model.chunk={m.chunk} but the checkpoint's chunk_size is {fv.chunk} (a run refuses it); planned with "
            f"model.chunk={m.chunk}"
        )
    if m.gradient_checkpointing:
        notes.append(f"model.gradient_checkpointing is not applied by the {m.architecture} policy: planned without it")
    if m.dtype != "float32":
        notes.append(
            f"planned in model.dtype={m.dtype}; the {m.architecture} policy loads the checkpoint in float32 and does not "
            "cast it (plan model.dtype=float32 for what it holds today)"
        )
    info.update(
        image_tokens=images * per_image,
        per_image_tokens=per_image,
        prefix_tokens=fv.prefix_tokens(images, per_image, text),
        flow_vla_notes=notes,
    )
    common = {**common, "gradient_checkpointing": False}
    inp = PlanInputs(
        **common,
        freeze_vision=m.freeze_vision_tower,
        rollout_samples=samples,
        text_tokens=text,
        images=images,
        image_tokens=images * per_image,
        new_tokens=0,
        rows_per_sample=vla["policy_calls"],
        head=head,
    )
    return inp, info


def _head_memory_kind(model_cfg) -> str | None:
    """The memory model of the model's action head (:class:`ContinuousHead` ``kind``), asked of its adapter through
    the ``head_memory_kind`` hook (:func:`mmrl.models.registry.model_hook`); None: a head planned as generated action
    tokens, or a model type without the hook."""
    from mmrl.models.registry import model_hook

    hook = model_hook(model_cfg.type, "head_memory_kind")
    return hook(model_cfg) if hook is not None else None


def _continuous_head(cfg) -> ContinuousHead | None:
    """The planner's view of a continuous action head (``model.action_head=flow|gaussian``; None for the tokens head).
    The head's action dims are ``model.head_action_dim`` or the env's (read from the task's env spec, no env built);
    the state dims ``len(model.state_mean)`` or :data:`DEFAULT_STATE_DIM`."""
    from mmrl.errors import ConfigError

    m = cfg.model
    kind = _head_memory_kind(m)
    if kind is None:
        return None
    if m.architecture != "vlm":  # LeRobot's flow VLAs: _flow_vla_inputs
        raise ConfigError(f"model.architecture={m.architecture}: the head comes from the checkpoint")
    action_dim = m.head_action_dim
    if action_dim is None:
        from mmrl.tasks import get_task_class

        action_dim = get_task_class(cfg.task.name)(cfg.task, cfg).env_spec().action_dim
    state_dim = (len(m.state_mean) if m.state_mean else DEFAULT_STATE_DIM) if m.use_state else 0
    return ContinuousHead(
        kind=kind,
        width=int(m.expert_width),
        depth=int(m.expert_depth),
        chunk=int(m.chunk),
        action_dim=int(action_dim),
        num_steps=int(m.num_steps),
        likelihood=str(m.likelihood),
        state_dim=int(state_dim),
        log_std=str(m.log_std),
    )


def build_plan(overrides: list[str]) -> tuple[Any, PlanSettings, PlanInputs, dict, MemoryBreakdown, list[Suggestion]]:
    """Everything ``mmrl plan`` prints, from its command line. ConfigError (one line) when the model cannot be sized."""
    from mmrl.config import ConfigError, load_config

    settings, rest = split_plan_overrides(overrides)
    cfg = planned_config(load_config(rest))
    try:
        inp, info = plan_inputs(cfg, settings)
    except UnknownArchitectureError as e:
        raise ConfigError(str(e)) from None
    bd = plan_memory(inp)
    spp = info["micro_batch"] * cfg.trainer.grad_accum
    sugg = suggest(inp, grad_accum=cfg.trainer.grad_accum, samples_per_step=spp, batch_size=cfg.trainer.batch_size)
    return cfg, settings, inp, info, bd, sugg


# ============================================================================ formatting


_UNIT = [GIB, "GiB"]  # set per report: MiB when the whole total is under 1 GiB (tiny models)


def _g(x: int | float) -> str:
    return f"{x / _UNIT[0]:.2f}"


def _n(x: int) -> str:
    """A parameter count: 7.62e9 style for big ones, exact for small ones."""
    return f"{x:,}" if x < 10_000_000 else f"{x / 1e9:.3f}e9"


def _optim_formula(inp: PlanInputs, bd: MemoryBreakdown) -> str:
    c = bd.counts
    if inp.optim_dtype == "fp32":
        per = "8 B fp32 moments" + (" + 4 B fp32 master" if c.trainable_bytes < 4 else "")
    else:
        per = f"2 x {c.trainable_bytes} B moments"
    return f"{_n(c.trainable)} trainable x ({per})"


def format_report(
    cfg, settings: PlanSettings, inp: PlanInputs, info: dict, bd: MemoryBreakdown, suggestions: list[Suggestion]
) -> str:
    arch = inp.arch
    m = cfg.model
    c = bd.counts
    b = inp.dtype_bytes
    shard = inp.world_size if inp.strategy == "fsdp2" else 1
    sh = f" / {shard}" if shard > 1 else ""
    _UNIT[:] = [GIB, "GiB"] if bd.total >= GIB else [1024**2, "MiB"]
    unit = _UNIT[1]
    lines = [f"mmrl plan: task={cfg.task.name} model={arch.name} -- sizes from {arch.source}"]
    rows: list[tuple[str, int, str]] = []
    if arch.flow_vla is not None:
        lines += _flow_vla_lines(cfg, settings, inp, info, bd, rows, sh)
    else:
        if arch.diffusion is not None:
            d = arch.diffusion
            lines.append(
                f"  {_n(arch.total_params())} parameters (denoiser {_n(d.denoiser_params)}, text encoders + VAE "
                f"{_n(d.frozen_params)}); {m.dtype}"
            )
        else:
            vis = arch.vision.params() if arch.vision else 0
            lines.append(
                f"  {_n(arch.total_params())} parameters (LM {_n(arch.text.params())}"
                + (f", vision tower {_n(vis)}" if vis else "")
                + f"); {m.dtype}"
            )
        if inp.lora:
            mode = f"LoRA r={inp.lora_r} on {','.join(inp.lora_targets)} (adapters fp32, base frozen)"
        elif arch.diffusion is not None:
            mode = "full fine-tuning of the denoiser"
        else:
            mode = "full fine-tuning" + (", vision tower frozen" if inp.freeze_vision and arch.vision else "")
        lines.append(f"  {mode}; trainable {_n(c.trainable)}, frozen {_n(c.frozen)}")
        optim = (
            "AdamW fp32 moments"
            + (" + fp32 master weights" if inp.optim_dtype == "fp32" and c.trainable_bytes < 4 else "")
            if inp.optim_dtype == "fp32"
            else "AdamW moments in the parameter dtype"
        )
        lines.append(
            f"  {inp.world_size} x {settings.device_gb:g} GiB, {inp.strategy}, offload {inp.offload}; {optim}; "
            f"gradient checkpointing {'on' if inp.gradient_checkpointing else 'off'}"
        )
        if arch.diffusion is not None:
            lines.append(
                f"  {info['resolution']} px: {inp.image_latent_tokens} latent tokens + {inp.text_tokens} "
                f"text tokens per row; {info['trained_steps']} trained steps x {info['cfg_branches']} CFG "
                f"branch(es) = {inp.rows_per_sample} rows per sample"
            )
        else:
            lines.append(
                f"  sequence: {inp.image_tokens} image + {inp.text_tokens} text + {inp.new_tokens} new = "
                f"{inp.seq} tokens"
                + (f" ({inp.images} image(s) x {info.get('per_image_tokens', 0)} tokens)" if inp.images else "")
            )
        head = inp.head
        if "policy_calls" in info and head is None:
            lines.append(
                f"  VLA: {info['frame']} frames; every episode is {info['policy_calls']} training rows (one per "
                f"policy call, the longest episode) of {info['tokens_per_call']} action tokens; the loss head "
                f"is over the {inp.logit_vocab} action bins"
            )
        elif head is not None:
            what = (
                f"flow expert {head.width} wide x {head.depth} layers, K = {head.num_steps} steps, {head.likelihood}: "
                f"{head.grad_steps} expert pass(es) with gradients per row"
                if head.kind == "flow"
                else f"Gaussian head {head.width} wide x {head.depth} query layer(s), one pass per row"
            )
            lines.append(
                f"  VLA, action_head={head.kind}: {info['frame']} frames; every episode is {info['policy_calls']} training "
                f"rows (one per policy call, the longest episode), each a prefix of {inp.seq + head.state_tokens} tokens "
                f"(+ {head.state_tokens} state token) -> a chunk of {head.chunk} x {head.action_dim}; {what}; "
                f"{_n(bd.head_params)} fp32 parameters outside the backbone"
            )
        lines.append(
            f"  micro-batch {inp.micro_batch} samples = {cfg.trainer.batch_size} prompts x {cfg.algo.group_size} "
            f"/ {inp.world_size} devices / {cfg.algo.num_minibatches} minibatch(es) / {cfg.trainer.grad_accum} "
            f"grad_accum; rollout {inp.rollout_samples} samples at once"
        )
        lines.append("")
        ptxt = f"{_n(c.trainable)} x {c.trainable_bytes} B + {_n(c.frozen)} x {c.frozen_bytes} B{sh}"
        rows.append(("parameters", bd.params, "on CPU (offload=params)" if inp.offload == "params" else ptxt))
        rows.append(
            (
                "gradients",
                bd.grads,
                "on CPU (offload=params)"
                if inp.offload == "params"
                else f"{_n(c.trainable)} x {c.trainable_bytes} B{sh}",
            )
        )
        rows.append(
            ("optimizer state", bd.optimizer, "on CPU" if inp.offload != "none" else _optim_formula(inp, bd) + sh)
        )
        if head is not None:
            rows[0] = (rows[0][0], rows[0][1], rows[0][2] + f" + head {_n(bd.head_params)} x 4 B{sh}")
            rows[1] = (rows[1][0], rows[1][1], rows[1][2] + f" + head {_n(bd.head_params)} x 4 B{sh}")
            if inp.offload == "none":
                rows[2] = (rows[2][0], rows[2][1], rows[2][2] + f" + head {_n(bd.head_params)} x 8 B{sh}")
        if arch.diffusion is not None:
            d = arch.diffusion
            seq = inp.image_latent_tokens + inp.text_tokens
            how = (
                f"{inp.micro_batch * inp.rows_per_sample} rows x "
                + (
                    f"({d.layers} x {seq} x {d.hidden} x {b} B + one block {bd.per_layer:,} B)"
                    if inp.gradient_checkpointing
                    else f"{d.layers} blocks x {bd.per_layer:,} B"
                )
                + " (+ final norm)"
            )
            rows.append(("activations", bd.activations, how))
            rows.append(
                (
                    "rollout (latents + no-grad block)",
                    bd.rollout,
                    f"{inp.rollout_samples} x {inp.num_steps + 1} "
                    f"latents x {inp.latent_elements} x 4 B + {inp.cfg_branches} x "
                    f"{inp.rollout_forward_batch or inp.rollout_samples} rows "
                    "x one block",
                )
            )
        else:
            t = arch.text
            n = f"{inp.micro_batch * inp.rows_per_sample:,} rows" if inp.rows_per_sample > 1 else f"{inp.micro_batch}"
            if inp.gradient_checkpointing:
                how = (
                    f"{n} x ({t.layers} layers x {inp.seq} x {t.hidden} x {b} B + one layer "
                    f"{bd.per_layer:,} B) (+ final norm)"
                )
            else:
                how = f"{n} x {t.layers} layers x {bd.per_layer:,} B (+ final norm)"
            how += f"; one layer = {inp.seq} tokens x {bd.per_layer // max(inp.seq, 1):,} B"
            if head is not None:
                rows.append(("activations: backbone", bd.activations - bd.head_activations, how))
                steps = f"{head.grad_steps} pass(es)" if head.kind == "flow" else "1 pass"
                rows.append(
                    (
                        "activations: action head",
                        bd.head_activations,
                        f"{n} x (prefix cast/norm + k/v of {inp.seq + head.state_tokens} tokens + {steps} over "
                        f"{head.chunk} tokens x {head.width}), fp32",
                    )
                )
                rows.append(("logits (last position)", bd.logits, f"{n} x {t.vocab} x {b} B (logits_to_keep=1)"))
                rows.append(
                    (
                        "rollout: prefix hidden states",
                        bd.hidden_states,
                        f"{inp.rollout_samples} x {t.layers + 1} layers x {inp.seq} x {t.hidden} x {b} B",
                    )
                )
                rows.append(
                    (
                        "rollout: prefill",
                        bd.prefill,
                        f"{inp.rollout_samples} x {inp.prompt_tokens} x (3 x {t.intermediate} + 4 x {t.hidden}) x {b} B",
                    )
                )
                rows.append(
                    (
                        "rollout: action head",
                        bd.head_rollout,
                        f"{inp.rollout_samples} rows: prefix k/v (+ per-row copy), one step's working set"
                        + (f", the {head.num_steps}-step chain" if head.kind == "flow" else "")
                        + ", fp32, no grad",
                    )
                )
            else:
                rows.append(("activations", bd.activations, how))
                rows.append(
                    (
                        "logits (loss head)",
                        bd.logits,
                        f"{n} x {inp.new_tokens} x {inp.logit_vocab or t.vocab} x {LOGIT_BYTES_PER_ELEMENT} B",
                    )
                )
            if head is None and inp.engine == "vllm":
                rows.append(
                    (
                        "rollout: vLLM reservation",
                        bd.rollout + bd.vllm_persistent,
                        f"{inp.vllm_fraction} x {settings.device_gb:g} GiB"
                        + (" (sleep: released outside generation)" if inp.vllm_sleep else " (held: no sleep mode)"),
                    )
                )
            elif head is None:
                rows.append(
                    (
                        "rollout: KV cache",
                        bd.kv_cache,
                        f"2 x {t.layers} x {t.kv_heads} kv heads x {t.head_dim} x "
                        f"{inp.seq} tokens x {inp.rollout_samples} samples x {b} B",
                    )
                )
                rows.append(
                    (
                        "rollout: prefill",
                        bd.prefill,
                        f"{inp.rollout_samples} x {inp.prompt_tokens} x (3 x {t.intermediate} + 4 x {t.hidden}) x {b} B",
                    )
                )
    ref_how = (
        "algo.kl_coef=0: none"
        if not inp.kl_reference
        else "frozen full copy, adapters included (with LoRA too: the projections train)"
        if arch.flow_vla is not None
        else "LoRA: the adapter-disabled model, no copy"
        if inp.lora
        else "frozen full copy in the model dtype (replicated, even with fsdp2)"
    )
    rows.append(("reference model (KL)", bd.reference, ref_how))
    if inp.strategy == "fsdp2" and inp.world_size > 1:
        what = (
            "root unit (the VLM and expert layers: only vision blocks are units) + 2 vision blocks, unsharded"
            if arch.flow_vla is not None
            else "root unit (embeddings, lm_head, ...) + 2 layers, unsharded"
        )
        rows.append(("fsdp2 gathered units", bd.fsdp_buffers, what))
    rows.append(("runtime overhead", bd.overhead, "plan.overhead_gb"))
    rollout_name = (
        "max(prefix phase: k/v cache + prefix forward, expert phase: k/v cache + per-row gather + step + chain)"
        if arch.flow_vla is not None
        else "latents + no-grad block"
        if arch.diffusion is not None
        else "prefix hidden states + prefill + action head (no KV cache)"
        if head is not None
        else "vLLM"
        if inp.engine == "vllm"
        else "KV cache + prefill"
    )
    if bd.rollout_workers:
        rows += _worker_rows(inp, bd, rollout_name)
    w = max(len(r[0]) for r in rows) + 2
    lines.append(f"  {'term'.ljust(w)}{unit:>8}  how")
    for name, val, how in rows:
        lines.append(f"  {name.ljust(w)}{_g(val):>8}  {how}")
    lines.append("  " + "-" * (w + 8))
    lines.append(
        f"  {'persistent'.ljust(w)}{_g(bd.persistent):>8}  parameters + optimizer + reference"
        + (" + gathered units" if bd.fsdp_buffers else "")
        + " + overhead"
        + (" + vLLM" if bd.vllm_persistent else "")
    )
    lines.append(
        f"  {'training peak'.ljust(w)}{_g(bd.training):>8}  gradients + activations"
        + ("" if arch.flow_vla is not None else " + logits")
    )
    lines.append(f"  {'rollout peak'.ljust(w)}{_g(bd.rollout):>8}  {rollout_name}")
    device = inp.device_bytes
    verdict = "fits" if bd.fits(device) else f"does NOT fit ({_g(bd.total - device)} {unit} over)"
    sum_how = "persistent + max(training, rollout)"
    if bd.rollout_workers:
        n = bd.rollout_workers
        lines.append(f"  {'learner'.ljust(w)}{_g(bd.learner):>8}  {sum_how}")
        lines.append(
            f"  {'rollout workers'.ljust(w)}{_g(bd.workers):>8}  {n} x {_g(bd.worker)} {unit} (trainer.rollout=async, "
            f"trainer.rollout_workers={n}: each worker process holds its own policy copy, on rank 0's device)"
        )
        sum_how = "learner + rollout workers (rank 0's device)"
    lines.append(f"  {'total per device'.ljust(w)}{_g(bd.total):>8}  {sum_how}: {verdict} {settings.device_gb:g} GiB")
    if bd.rollout_workers:
        lines.append(
            f"  {'weight board (CPU RAM)'.ljust(w)}{_g(bd.weight_board):>8}  host memory of the learner: the "
            "shared-memory copy of the policy's weights the workers load from (not on the device)"
        )
    if bd.rollout_workers and not inp.overhead_bytes:  # a CPU run (the planner's convention: no device overhead)
        procs = inp.world_size
        lines.append(
            f"  {'RAM of a CPU run'.ljust(w)}{_g(bd.host_ram(procs)):>8}  learner x {procs} process(es) + rollout "
            "workers + weight board, on one machine (what `mmrl train` checks on a CPU)"
        )
    for note in list(arch.notes) + list(info.get("flow_vla_notes", ())) + bd.notes:
        lines.append(f"  note: {note}")
    if not bd.fits(device):
        lines.append("")
        if not suggestions:
            lines.append(
                "  no change the planner knows makes it fit: more devices (plan.world_size) or a smaller model"
            )
        else:
            lines.append("  to fit, cheapest first (cumulative):")
            for k, s in enumerate(suggestions, 1):
                mark = "fits" if s.fits else "still over"
                lines.append(
                    f"  {k}. {('+ ' if k > 1 else '') + s.override:<40} -> {_g(s.total):>7} {unit}  {mark}; {s.why}"
                )
            if not suggestions[-1].fits:
                lines.append("  even all of these do not fit: more devices (plan.world_size) or a smaller model")
    return "\n".join(lines)


def _worker_rows(inp: PlanInputs, bd: MemoryBreakdown, rollout_name: str) -> list[tuple[str, int, str]]:
    """The table rows of ONE asynchronous rollout worker's sampling copy (trainer.rollout=async)."""
    rows = [
        (
            "rollout worker: weights",
            bd.worker_weights,
            "the policy's parameters, unsharded, in their own dtypes: each worker builds the policy from the config",
        )
    ]
    rows.append(
        (
            "rollout worker: rollout peak",
            bd.worker_rollout,
            f"one round, at most a step's global batch: {inp.rollout_samples * inp.world_size} samples ({rollout_name})",
        )
    )
    rows.append(("rollout worker: overhead", bd.worker_overhead, "plan.overhead_gb: a process of its own"))
    return rows


def _flow_vla_lines(
    cfg, settings: PlanSettings, inp: PlanInputs, info: dict, bd: MemoryBreakdown, rows: list, sh: str
) -> list[str]:
    """The header lines of a LeRobot flow VLA's report; its rows (parameters to rollout) are appended to ``rows``."""
    fv, head, m, c = inp.arch.flow_vla, inp.head, cfg.model, bd.counts
    b, det = inp.dtype_bytes, bd.detail
    g = fv.param_groups()
    lm = g["embed_tokens"] + g["vlm_layers"]
    expert = g["expert_layers"] + g["expert_norm"] + g["suffix"]
    lines = [
        f"  {_n(fv.model_params())} parameters (vision encoder + projector {_n(fv.vision_params())}, language model "
        f"{_n(lm)}, action expert + projections {_n(expert)}); {m.dtype}; the checkpoint also holds "
        f"{_n(fv.unused)} unused (LM heads, final norm: kept on the CPU)",
        (
            f"  LoRA r={inp.lora_r} on {','.join(inp.lora_targets)} of the VLM's and the expert's blocks (adapters "
            f"{_n(bd.detail['head_params_lora'])} fp32, those blocks and the embeddings frozen; the projections train)"
            if inp.lora
            else "  full fine-tuning"
        )
        + (", vision encoder + projector frozen (model.freeze_vision_tower)" if inp.freeze_vision else "")
        + f"; trainable {_n(c.trainable)}, frozen {_n(c.frozen)}",
    ]
    optim = (
        "AdamW fp32 moments" + (" + fp32 master weights" if c.trainable_bytes < 4 else "")
        if inp.optim_dtype == "fp32"
        else "AdamW moments in the parameter dtype"
    )
    lines.append(
        f"  {inp.world_size} x {settings.device_gb:g} GiB, {inp.strategy}, offload {inp.offload}; {optim}; "
        "no gradient checkpointing (not applied by these policies)"
    )
    P = det["prefix_tokens"]
    state = " + 1 state token" if fv.state_tokens else ""
    lines.append(
        f"  prefix: {inp.images} camera(s) x {inp.image_tokens // max(inp.images, 1)} image tokens + "
        f"{inp.text_tokens} prompt tokens{state} = {P} tokens through {fv.layers} VLM layers ({fv.heads} heads / "
        f"{fv.kv_heads} kv x {fv.head_dim}); expert {fv.expert_layers} layers x {fv.expert_width} wide"
        + (f" ({fv.expert_cross} cross-attending)" if fv.expert_cross else "")
        + f" over {head.chunk}{' + 1 state' if fv.family == 'pi0' else ''} tokens"
    )
    lines.append(
        f"  VLA, {fv.family}: {info['frame']} frames; every episode is {info['policy_calls']} training rows (one per "
        f"policy call, the longest episode); K = {head.num_steps} steps, {head.likelihood}: {head.grad_steps} expert "
        f"pass(es) with gradients per row; {_n(bd.head_params)} fp32 parameters in mmrl's heads"
        + (" and the LoRA adapters" if inp.lora else "")
        + ""
    )
    lines.append(
        f"  micro-batch {inp.micro_batch} episodes = {cfg.trainer.batch_size} prompts x {cfg.algo.group_size} "
        f"/ {inp.world_size} devices / {cfg.algo.num_minibatches} minibatch(es) / {cfg.trainer.grad_accum} "
        f"grad_accum = {det['rows']:,} rows; rollout {inp.rollout_samples} rows at once"
    )
    lines.append("")
    n = f"{det['rows']:,} rows"
    hp = f" + heads {_n(bd.head_params)} x 4 B" if bd.head_params else ""
    rows.append(("parameters", bd.params, f"{_n(c.trainable)} x {b} B + {_n(c.frozen)} x {b} B{sh}{hp}"))
    rows.append(("gradients", bd.grads, f"{_n(c.trainable)} x {b} B{sh}{hp}"))
    rows.append(("optimizer state", bd.optimizer, "on CPU" if inp.offload != "none" else _optim_formula(inp, bd) + sh))
    if det["vision_activations"]:
        rows.append(
            (
                "activations: vision encoder",
                det["vision_activations"],
                f"{n} x {inp.images} x ({fv.vision.depth} layers over {fv.vision.patches} patches + projector input)",
            )
        )
    rows.append(
        (
            "activations: VLM prefix",
            det["prefix_activations"],
            f"{n} x ({fv.layers - 1} layers x {bd.per_layer:,} B + last norm"
            + (f" + LoRA {det['lora_prefix_per_row']:,} B" if inp.lora else "")
            + f"); one layer = {P} tokens x {bd.per_layer // max(P, 1):,} B (fp32 softmax {fv.heads} x {P} per token)",
        )
    )
    gathers = 2 if head.likelihood == "flow_sde_one" else 1
    rows.append(
        (
            "activations: prefix k/v",
            det["prefix_cache"],
            f"{n} x {1 + gathers} copies (cache + per-row gather) x 2 x {fv.layers} x {P} x {fv.kv_dim} x {b} B",
        )
    )
    rows.append(
        (
            "activations: expert",
            det["expert_activations"],
            f"{n} x {head.grad_steps} pass(es) x {det['expert_pass_per_row']:,} B (k/v of {P} prefix tokens "
            f"repeated to {fv.heads} heads per layer"
            + (f"; LoRA {det['lora_expert_pass_per_row']:,} B of it" if inp.lora else "")
            + ")",
        )
    )
    k = inp.rollout_samples
    rows.append(
        (
            "rollout: prefix k/v",
            det["rollout_cache"],
            f"{k} rows x 2 copies (cache + per-row gather) x {det['cache_per_observation']:,} B",
        )
    )
    rows.append(
        (
            "rollout: prefix forward",
            det["rollout_prefix_working"],
            f"{k} x one VLM layer's working set (+ 2 fp32 {fv.heads} x {P} x {P} score matrices), no grad",
        )
    )
    rows.append(
        (
            "rollout: expert step + chain",
            bd.head_rollout,
            f"{k} x (one step's working set + (2 x {head.num_steps} + 2) x {head.chunk} x {head.action_dim} x 4 B), "
            "no grad",
        )
    )
    return lines


def report_json(inp: PlanInputs, info: dict, bd: MemoryBreakdown, suggestions: list[Suggestion]) -> str:
    terms = {f.name: getattr(bd, f.name) for f in fields(bd) if f.name not in ("counts", "notes", "rollout_workers")}
    out = {
        "terms_bytes": terms,
        "persistent": bd.persistent,
        "training": bd.training,
        "total": bd.total,
        "learner": bd.learner,
        "workers": bd.workers,
        "rollout_workers": bd.rollout_workers,
        "fits": bd.fits(inp.device_bytes),
        "device_bytes": inp.device_bytes,
        "counts": asdict(bd.counts),
        "seq": inp.seq,
        "info": info,
        "suggestions": [{"override": s.override, "total": s.total, "fits": s.fits} for s in suggestions],
    }
    return json.dumps(out, indent=1)


# ============================================================================ at the start of `mmrl train`


def device_memory_gb(device: Any) -> float | None:
    """Total memory of a CUDA ``torch.device`` in GiB; None for a CPU (no device bound to check against)."""
    import torch

    if getattr(device, "type", "cpu") != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(device).total_memory / GIB


_TRAINER_OVERRIDE = {
    "plan.strategy=fsdp2": "trainer.strategy=fsdp2",
    "plan.offload=params": "trainer.fsdp.offload=true",
}
"""The training setting behind a ``plan.*`` suggestion (``plan.offload=optimizer`` alone has none: not offered)."""


def _run_plan(
    cfg, *, device_gb: float, world_size: int
) -> tuple[PlanSettings, PlanInputs, dict, MemoryBreakdown] | None:
    """The plan of ``cfg`` as the trainer will run it (its own strategy, offload, world size, AdamW moments in the
    parameter dtype) on a ``device_gb`` device; None when the task's settings cannot be read offline (e.g. a VLA
    task's simulator is not installed, or any other failure of the planner: it runs at the start of every run and
    must never stop one). UnknownArchitectureError (one line) when the model cannot be sized."""
    cfg = planned_config(cfg)
    tr = cfg.trainer
    settings = PlanSettings(
        device_gb=device_gb,
        world_size=world_size,
        strategy=tr.strategy,
        optim="model",
        offload="params" if tr.strategy == "fsdp2" and tr.fsdp.offload else "none",
    )
    try:
        inp, info = plan_inputs(cfg, settings)
        return settings, inp, info, plan_memory(inp)
    except UnknownArchitectureError:
        raise
    except Exception as e:  # noqa: BLE001 - e.g. a VLA task's simulator: a check at the start of every run never fails it
        log.debug("memory plan skipped: %s: %s", type(e).__name__, e)
        return None


def machine_ram_gb() -> float | None:
    """Physical memory of this machine in GiB (``os.sysconf``); None where the platform does not say."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_in_ram(cfg, *, world_size: int, ram_gb: float | None = None) -> str | None:
    """The CPU counterpart of :func:`start_of_run_warning`, called by the trainer before the first rollout: a CPU run
    that needs more memory than the machine has would otherwise run until the kernel kills it, so this refuses it
    with a ConfigError (one line). The planner's per-process estimate times the processes on this machine
    (``LOCAL_WORLD_SIZE``, else ``world_size``), plus with ``trainer.rollout=async`` the rollout workers' policy copies
    and the learner's weight board (:meth:`~mmrl.planning.memory.MemoryBreakdown.host_ram`), is compared with the
    physical RAM (``ram_gb``, default :func:`machine_ram_gb`). Returns one line when memory was not checked (a model the
    planner cannot size), else None."""
    import os

    from mmrl.errors import ConfigError

    ram = machine_ram_gb() if ram_gb is None else ram_gb
    if ram is None:
        return None
    try:
        plan = _run_plan(cfg, device_gb=ram, world_size=world_size)
    except UnknownArchitectureError as e:
        return f"mmrl plan: {e}; memory not checked against the machine's {ram:.1f} GiB of RAM"
    if plan is None:
        return None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    bd = plan[3]
    need = bd.host_ram(local) / GIB
    if need <= ram:
        return None
    tr = cfg.trainer
    who = [f"{local} processes"] if local > 1 else []
    if bd.rollout_workers:  # trainer.rollout=async: each worker holds a policy copy, the learner the weight board
        who.append(f"with {bd.rollout_workers} rollout worker(s) of {bd.worker / GIB:,.2f} GiB each")
    procs = f" ({', '.join(who)})" if who else ""
    fewer = ", or run fewer trainer.rollout_workers" if bd.rollout_workers else ""
    raise ConfigError(
        f"this CPU run needs about {need:,.1f} GiB of memory{procs} and the machine has {ram:.1f} GiB of RAM: "
        f"it cannot fit (trainer.batch_size={tr.batch_size} x algo.group_size={cfg.algo.group_size} samples per "
        f"step, trainer.grad_accum={tr.grad_accum}); lower the batch or raise trainer.grad_accum{fewer} "
        f"(`mmrl plan <the same overrides> plan.device_gb={ram:.0f}` prints the breakdown and the cheapest changes)"
    )


def run_memory_gb(cfg, *, device_gb: float | None, world_size: int) -> float | None:
    """The planner's per-device estimate (GiB) of ``cfg`` for the start banner; None on CPU or when not modelled."""
    if device_gb is None:
        return None
    try:
        plan = _run_plan(cfg, device_gb=device_gb, world_size=world_size)
    except UnknownArchitectureError:
        return None
    return plan[3].total / GIB if plan is not None else None


def start_of_run_warning(cfg, *, device_gb: float | None, world_size: int) -> str | None:
    """What ``mmrl train`` warns before loading a run that will not fit: the plan of ``cfg`` (its own strategy, offload,
    world size, AdamW as the trainer builds it: moments in the parameter dtype) against ``device_gb``, with the
    cheapest changes that fit. None when it fits, when there is no device bound (CPU), or when the run is not
    modelled because the task's settings cannot be read offline. A model the planner cannot size (a model type
    without a memory model, weights without a readable config.json) gives one line saying that memory was not
    checked, never an exception."""
    if device_gb is None:
        return None
    tr = cfg.trainer
    try:
        plan = _run_plan(cfg, device_gb=device_gb, world_size=world_size)
    except UnknownArchitectureError as e:
        return f"mmrl plan: {e}; memory not checked against the device's {device_gb:.1f} GiB"
    if plan is None:
        return None
    _, inp, info, bd = plan
    if bd.fits(inp.device_bytes):
        return None
    sugg = suggest(
        inp, grad_accum=tr.grad_accum, samples_per_step=info["micro_batch"] * tr.grad_accum, batch_size=tr.batch_size
    )
    sugg = [s for s in sugg if s.override in _TRAINER_OVERRIDE or not s.override.startswith("plan.")]
    lines = [
        f"mmrl plan: this run needs about {bd.total / GIB:.1f} GiB per device and the device has "
        f"{device_gb:.1f} GiB: it will likely run out of memory (strategy={tr.strategy}, {world_size} "
        "process(es)"
        + (f", {bd.rollout_workers} rollout worker(s) on this device" if bd.rollout_workers else "")
        + "). Cheapest changes, in order:"
    ]
    lines += [
        f"  {k}. {_TRAINER_OVERRIDE.get(s.override, s.override):<40s} -> {s.total / GIB:.1f} GiB ({'fits' if s.fits else 'still over'})"
        for k, s in enumerate(sugg, 1)
    ] or ["  (none of the known changes is enough)"]
    lines.append("  `mmrl plan <the same overrides>` prints the whole breakdown (docs/scaling.md)")
    return "\n".join(lines)
