"""A colocated vLLM rollout engine for the VLM policy (optional; needs vLLM and a CUDA GPU).

The engine samples the completions of :meth:`mmrl.policies.vlm.VLMPolicy.rollout` when
``model.rollout_engine=vllm``; everything else (log-probs, training, rewards) stays in the trainer.
One ``vllm.LLM`` lives in the training process (``distributed_executor_backend="external_launcher"``,
tensor parallel 1) and shares the GPU with the trainer. Written and reviewed against vLLM 0.33 (the
``vllm`` extra pins ``vllm>=0.33,<0.34``; docs/vllm.md):

1. **Same inputs.** Requests are built from the trainer's own :class:`~mmrl.policies.vlm.PromptInputs`
   (the templated ``text`` and the RGB images, ``multi_modal_data``), with ``mm_processor_kwargs``
   read from the trainer's processor (the same ``min/max_pixels`` budget), so both sides resize the
   images identically. The engine's tokenised prompt is compared with the trainer's: a different
   number of image tokens raises :class:`PromptMismatchError` naming the pixel settings (the
   "image features and image tokens do not match" complaints of R1-V #133 / EasyR1 #267). vLLM's
   ``limit_mm_per_prompt`` is ``model.vllm_max_images_per_prompt`` images and no video; a prompt with
   more images raises before it reaches vLLM.
2. **Same log-probs.** ``logprobs=0`` returns the sampled token's log-prob; with
   ``logprobs_mode="processed_logprobs"`` it is ``log_softmax(logits / T)`` at that token, the
   trainer's formula (up to the suppressed vision tokens, whose probability is removed from the
   normaliser, and the nucleus when ``top_p < 1``: keep ``top_p = 1`` with this engine). vLLM
   rejects temperatures above 2 and silently raises those in (0, 0.01) to 0.01, so both are refused
   here (and in the config) instead of training with a temperature the engine did not sample at.
3. **Fresh weights.** Before each generation the engine compares a version stamp of the trainer's
   parameters (in-place updates such as ``optimizer.step()`` bump every tensor's version counter)
   with the one it last loaded, and re-loads the full state dict (merged LoRA weights for a PEFT
   model) through the model's ``load_weights`` when they differ, or when sleep discarded them. The
   weights are streamed from a generator (:func:`iter_engine_weights`): at most one merged LoRA
   tensor exists at a time. ``load_weights`` returns the names it loaded; every parameter of the
   engine's model must be among them (after a level-2 sleep a parameter that was not re-sent holds
   garbage), else :class:`WeightSyncError`. With a trainable vision tower the engine's encoder cache
   (image embeddings keyed by the image alone) is reset after each sync.
4. **Sleep.** With ``model.vllm_sleep`` the engine sleeps at level 2 (weights and KV cache
   released) outside generation. It wakes the weights, loads the trainer's weights, resets the
   prefix cache, checks the sync, then wakes the KV cache and generates. It never calls vLLM's
   ``reload_weights`` after a sync without weights: that reloads the checkpoint from disk and silently
   trains against the base weights (TRL #5312, where the tell was an importance ratio of ~3e-7).
5. **Checks.** After each sync, and right before each generation, the post-sync hooks run; the
   default one (:func:`weight_canary_check`) compares the engine's copy of the tensors RL changes
   most visibly, the last language-model layer's ``o_proj`` / ``down_proj`` and the last vision
   block's ``attn.proj`` (and ``mlp.down_proj``) (merged with LoRA, never fused or sharded by vLLM at tensor parallel 1), with
   the trainer's value cast to the engine dtype: a correct copy is exactly equal, element by element.
   The trainer's ``rollout/logp_abs_diff`` and ``rollout/is_ratio_{min,max}`` metrics catch everything
   else on the next step (see docs/vllm.md).

Only the pure parts (request building, output mapping, LoRA merge, version stamps, the sync state
machine over an injected fake ``LLM``) run without vLLM; ``import vllm`` happens in the constructor.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from mmrl.rollout.token_sampler import Completions, completion_mask

__all__ = [
    "CANARY_SUFFIXES",
    "DEFAULT_MAX_IMAGES_PER_PROMPT",
    "ROLLOUT_ENGINES",
    "VLLM_MAX_TEMPERATURE",
    "VLLM_MIN_TEMPERATURE",
    "EngineRequest",
    "PromptMismatchError",
    "StaleWeightsError",
    "VLLMEngine",
    "VLLMEngineError",
    "VLLMUnavailableError",
    "WeightSyncError",
    "build_requests",
    "build_rollout_engine",
    "canary_keys",
    "check_prompt_tokens",
    "check_rollout_engine",
    "check_vllm_sampling",
    "check_weight_coverage",
    "checkpoint_name_map",
    "completions_from_outputs",
    "engine_state_dict",
    "free_port",
    "iter_engine_weights",
    "iter_merged_lora_weights",
    "merged_lora_state_dict",
    "normalise_param_name",
    "processor_mm_kwargs",
    "sampling_kwargs",
    "weight_canary_check",
    "weights_version",
]

log = logging.getLogger(__name__)

ROLLOUT_ENGINES: tuple[str, ...] = ("hf", "vllm")
"""Accepted values of ``model.rollout_engine``."""

SUPPRESS_BIAS = -100.0
"""Logit bias that removes a token from sampling (vision special tokens); vLLM clamps biases to [-100, 100]."""

VLLM_MIN_TEMPERATURE = 0.01
"""vLLM's ``SamplingParams`` raises a temperature in (0, 0.01) to 0.01 with a warning (``_MAX_TEMP`` in
vllm/sampling_params.py, 0.33): the trainer would then compute log-probs at another temperature than the sampler's."""

VLLM_MAX_TEMPERATURE = 2.0
"""vLLM's ``SamplingParams`` rejects temperatures above 2 (``temperature must be in [0, 2]``)."""

DEFAULT_MAX_IMAGES_PER_PROMPT = 1
"""``limit_mm_per_prompt`` images when the config does not say (every shipped image task has one image per prompt;
vLLM reserves encoder memory for this many, and its own default is 999)."""


class VLLMEngineError(RuntimeError):
    """Base class of the vLLM engine's errors."""


class VLLMUnavailableError(VLLMEngineError):
    """vLLM is not installed, or there is no CUDA device to run it on."""


class StaleWeightsError(VLLMEngineError):
    """A generation was asked of an engine whose weights are not the trainer's current ones."""


class WeightSyncError(VLLMEngineError):
    """The engine's weights differ from the trainer's after a sync (or the sync could not run)."""


class PromptMismatchError(VLLMEngineError):
    """The engine tokenised a prompt with another number of image tokens than the trainer."""


# ============================================================================ config


def check_rollout_engine(name: str) -> str:
    """Return ``name`` if it is a known ``model.rollout_engine``; raise ValueError otherwise."""
    if name not in ROLLOUT_ENGINES:
        raise ValueError(f"model.rollout_engine={name!r} is not valid; choose from {', '.join(ROLLOUT_ENGINES)}")
    return name


def check_vllm_sampling(temperature: float, top_p: float = 1.0) -> None:
    """Raise ValueError unless vLLM samples at exactly ``temperature`` and ``top_p``.

    vLLM 0.33's ``SamplingParams`` rejects a non-finite temperature, one below 0 or above
    :data:`VLLM_MAX_TEMPERATURE`, a ``top_p`` outside (0, 1], and silently raises a temperature in
    (0, :data:`VLLM_MIN_TEMPERATURE`) to that bound; 0 means greedy, which is not a training temperature.
    The trainer computes ``log_softmax(logits / T)`` with the configured value, so a value vLLM would
    change is refused here (and in the config, :func:`mmrl.config.validate_sampling`).
    """
    t = float(temperature)
    if not (math.isfinite(t) and VLLM_MIN_TEMPERATURE <= t <= VLLM_MAX_TEMPERATURE):
        raise ValueError(
            f"temperature {temperature} is outside [{VLLM_MIN_TEMPERATURE}, {VLLM_MAX_TEMPERATURE}], the range vLLM "
            f"samples at as given (it rejects T > {VLLM_MAX_TEMPERATURE} and raises 0 < T < {VLLM_MIN_TEMPERATURE} "
            f"to {VLLM_MIN_TEMPERATURE}, while the trainer's log-probs would keep the configured value)"
        )
    if not (math.isfinite(float(top_p)) and 0.0 < float(top_p) <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it), for a rendezvous such as
    ``MASTER_PORT``; two runs on one host get different ports instead of colliding on a fixed one."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def processor_mm_kwargs(processor: Any) -> dict[str, Any]:
    """The image-resizing settings of the trainer's processor, as ``mm_processor_kwargs`` for vLLM.

    transformers 5 keeps the pixel budget in ``image_processor.size = {shortest_edge, longest_edge}``
    (``min_pixels`` / ``max_pixels`` of older versions); whichever the processor has is passed on, so
    the engine's copy of the processor resizes exactly as the trainer's does.
    """
    ip = getattr(processor, "image_processor", None)
    if ip is None:
        raise VLLMEngineError(f"{type(processor).__name__} has no image_processor: not a Qwen-VL processor")
    size = getattr(ip, "size", None)
    size = dict(size) if size is not None else {}
    if size.get("shortest_edge") is not None and size.get("longest_edge") is not None:
        return {"size": {"shortest_edge": int(size["shortest_edge"]), "longest_edge": int(size["longest_edge"])}}
    lo, hi = getattr(ip, "min_pixels", None), getattr(ip, "max_pixels", None)
    if lo is not None and hi is not None:
        return {"min_pixels": int(lo), "max_pixels": int(hi)}
    raise VLLMEngineError(
        f"cannot read the pixel budget of {type(ip).__name__} (size={size}); set model.min_pixels and model.max_pixels"
    )


# ============================================================================ requests


@dataclass
class EngineRequest:
    """One vLLM request: a prompt sampled ``n`` times (consecutive samples of the same prompt)."""

    prompt: dict[str, Any]
    """The vLLM prompt dict: ``prompt`` (text), ``multi_modal_data``, ``mm_processor_kwargs``."""
    n: int
    """Samples of this prompt."""
    seed: int
    """Sampling seed of the request (the first sample's seed)."""
    first: int
    """Index of the first sample of this request in the rollout's sample order."""


def build_requests(
    prompts: Sequence[Any], seeds: Sequence[int], mm_kwargs: dict[str, Any], *, max_images: int | None = None
) -> list[EngineRequest]:
    """Group the rollout's per-sample prompts into vLLM requests.

    ``prompts[k]`` is the :class:`~mmrl.policies.vlm.PromptInputs` of sample ``k`` (the same object
    repeated for the ``G`` samples of a prompt); consecutive repeats become one request with ``n`` =
    the run length, so vLLM encodes the prompt (and its images) once. Videos are not supported. A
    prompt with more than ``max_images`` images (the engine's ``limit_mm_per_prompt``) raises
    :class:`VLLMEngineError` naming ``model.vllm_max_images_per_prompt`` instead of vLLM's rejection.
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"build_requests: {len(prompts)} prompts but {len(seeds)} seeds")
    out: list[EngineRequest] = []
    for k, (p, s) in enumerate(zip(prompts, seeds)):
        if out and prompts[out[-1].first] is p:
            out[-1].n += 1
            continue
        if getattr(p, "num_videos", 0):
            raise VLLMEngineError(
                "the vLLM rollout engine takes image and text prompts only; video prompts need model.rollout_engine=hf"
            )
        if not isinstance(getattr(p, "text", None), str):
            raise VLLMEngineError(f"sample {k}: the prompt has no templated text (not a PromptInputs?)")
        if max_images is not None and len(p.images) > max_images:
            raise VLLMEngineError(
                f"sample {k}: the prompt has {len(p.images)} images but the vLLM engine accepts at most {max_images} "
                f"per prompt (limit_mm_per_prompt); set model.vllm_max_images_per_prompt={len(p.images)} or more"
            )
        request: dict[str, Any] = {"prompt": p.text}
        if p.images:
            request["multi_modal_data"] = {"image": list(p.images) if len(p.images) > 1 else p.images[0]}
            request["mm_processor_kwargs"] = dict(mm_kwargs)
        out.append(EngineRequest(prompt=request, n=1, seed=int(s), first=k))
    return out


def sampling_kwargs(
    *,
    n: int,
    seed: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_ids: Sequence[int],
    suppress_ids: Sequence[int],
    greedy: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request.

    ``logprobs=0`` returns the sampled token's log-prob only; greedy decoding is temperature 0 (vLLM
    then reports untempered log-probs, which evaluation does not use) and one sample (vLLM refuses
    ``n > 1`` when greedy: :meth:`VLLMEngine.sample` asks for one and repeats it). Vision special tokens
    are suppressed with a large negative logit bias, as the HF path masks them. A temperature or
    ``top_p`` that vLLM would reject or change raises ValueError (:func:`check_vllm_sampling`).
    """
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"sampling_kwargs: n={n} and max_new_tokens={max_new_tokens} must be >= 1")
    if greedy and n != 1:
        raise ValueError(f"greedy sampling takes n=1 (vLLM refuses n={n} at temperature 0; greedy copies are equal)")
    if not greedy:
        if temperature <= 0:
            raise ValueError(
                f"sampling temperature must be > 0 (got {temperature}); use greedy=True for argmax decoding"
            )
        check_vllm_sampling(temperature, top_p)
    return {
        "n": int(n),
        "seed": int(seed) % (2**63),
        "max_tokens": int(max_new_tokens),
        "temperature": 0.0 if greedy else float(temperature),
        "top_p": 1.0 if greedy else float(top_p),
        "logprobs": 0,
        "stop_token_ids": [int(e) for e in eos_ids],
        "logit_bias": {int(i): SUPPRESS_BIAS for i in suppress_ids} or None,
        "detokenize": False,
    }


# ============================================================================ outputs


def _sampled_logprob(entry: Any, token: int) -> float:
    """The log-prob of ``token`` in one position's vLLM logprobs dict ({id: Logprob | float})."""
    if entry is None or token not in entry:
        raise VLLMEngineError(f"vLLM returned no log-prob for sampled token {token} (was logprobs=0 requested?)")
    v = entry[token]
    lp = float(getattr(v, "logprob", v))
    return lp if not math.isnan(lp) else 0.0


def completions_from_outputs(
    outputs: Sequence[Any],
    requests: Sequence[EngineRequest],
    *,
    eos_ids: Sequence[int],
    pad_id: int,
    max_new_tokens: int,
) -> Completions:
    """Map vLLM ``RequestOutput`` objects (one per request, ``n`` completions each) to mmrl's
    :class:`~mmrl.rollout.token_sampler.Completions` in the rollout's sample order.

    ids are right-padded with ``pad_id`` to the longest completion; the mask covers every token up to
    and including the first EOS, the log-probs are the sampled tokens' (0 on padding), and a
    completion without EOS is truncated. Exactly the layout of the HF path.
    """
    if len(outputs) != len(requests):
        raise VLLMEngineError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
    ids_rows: list[list[int]] = []
    lp_rows: list[list[float]] = []
    for req, out in zip(requests, outputs):
        comps = list(out.outputs)
        if len(comps) != req.n:
            raise VLLMEngineError(
                f"request of sample {req.first}: vLLM returned {len(comps)} completions, expected {req.n}"
            )
        for c in comps:
            toks = [int(t) for t in c.token_ids][:max_new_tokens]
            if c.logprobs is None:
                raise VLLMEngineError("vLLM returned no log-probs: the engine must request logprobs=0")
            ids_rows.append(toks)
            lp_rows.append([_sampled_logprob(e, t) for e, t in zip(c.logprobs, toks)])
    L = max([len(r) for r in ids_rows] + [1])
    ids = torch.full((len(ids_rows), L), int(pad_id), dtype=torch.long)
    logp = torch.zeros(len(ids_rows), L, dtype=torch.float32)
    for i, (r, lp) in enumerate(zip(ids_rows, lp_rows)):
        if r:
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            logp[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
    lengths = torch.tensor([len(r) for r in ids_rows])
    valid = torch.arange(L)[None, :] < lengths[:, None]
    mask, truncated = completion_mask(torch.where(valid, ids, torch.full_like(ids, -1)), list(eos_ids))
    mask = mask * valid.float()
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, int(pad_id)))
    return Completions(ids=ids, mask=mask, logp=logp * mask, truncated=truncated)


def check_prompt_tokens(
    prompts: Sequence[Any],
    requests: Sequence[EngineRequest],
    outputs: Sequence[Any],
    image_token_id: int | None,
    mm_kwargs: dict[str, Any],
) -> None:
    """Raise :class:`PromptMismatchError` when the engine's prompt of a request has another number of
    image tokens than the trainer's ``input_ids``.

    When the engine reports the prompt with one placeholder per image (not expanded), the count
    cannot be compared and the check passes.
    """
    if image_token_id is None:
        return
    for req, out in zip(requests, outputs):
        p = prompts[req.first]
        engine_ids = getattr(out, "prompt_token_ids", None)
        if engine_ids is None or not p.images:
            continue
        mine = int((p.input_ids == image_token_id).sum())
        theirs = sum(1 for t in engine_ids if int(t) == image_token_id)
        if theirs == mine or theirs == len(p.images):
            continue
        raise PromptMismatchError(
            f"sample {req.first}: the engine sees {theirs} image tokens, the trainer {mine} (image sizes "
            f"{[im.size for im in p.images]}, trainer pixel budget {mm_kwargs}); the engine must resize with the "
            "trainer's processor settings (model.min_pixels / model.max_pixels)"
        )


# ============================================================================ weights


def weights_version(module: torch.nn.Module) -> int:
    """A stamp that changes whenever any parameter is updated in place (``optimizer.step``,
    ``load_state_dict``) or replaced: a hash of (identity, version counter) of every parameter."""
    return hash(tuple((id(p), p._version) for p in module.parameters()))


def _full(t: Tensor) -> Tensor:
    """``t`` detached, gathered to the full tensor when it is a DTensor shard (FSDP2; a collective: every rank
    iterates the same names in the same order)."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _lora_delta_modules(peft_model) -> dict[str, Any]:
    """Qualified name (in the base model, PEFT's wrapper prefixes stripped) -> LoRA layer, for every
    layer that carries an active adapter."""
    base = peft_model.get_base_model()
    out = {}
    for name, mod in base.named_modules():
        if hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer") and getattr(mod, "active_adapters", None):
            out[name] = mod
    return out


def _is_adapter_key(key: str) -> bool:
    """A PEFT adapter tensor (``lora_A`` / ``lora_B`` / DoRA magnitude), which a plain checkpoint does not have."""
    return ".lora_" in key or key.endswith(".lora_magnitude_vector")


def iter_merged_lora_weights(peft_model, keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` of the base model with every active LoRA adapter merged in (``W + scale * B A``),
    under the base model's own parameter names, one at a time; the live model is not modified.

    Lazy: a merged tensor is computed when its pair is requested and dropped by the generator before the next
    one, so while the consumer copies each tensor away (vLLM's ``load_weights``) at most one merged copy
    exists: no second model on the GPU during a sync. Unadapted tensors are the live ones, detached.
    Adapter tensors are dropped and ``.base_layer.`` is removed from names, so the pairs load like a plain
    checkpoint of the base architecture. ``keep(name)`` selects names (None: all) without merging the others.
    """
    base = peft_model.get_base_model()
    layers = _lora_delta_modules(peft_model)
    for key, t in base.state_dict().items():
        if _is_adapter_key(key):
            continue
        name = key.replace(".base_layer.", ".")
        if keep is not None and not keep(name):
            continue
        owner, _, leaf = key.rpartition(".base_layer.")
        if not (owner and owner in layers and leaf == "weight"):
            yield name, _full(t)
            continue
        layer = layers[owner]
        with torch.no_grad():  # not around the yield: grad mode is global to the consumer while suspended
            merged = _full(t).clone()
            for adapter in layer.active_adapters:
                if adapter in getattr(layer, "lora_A", {}):
                    merged += _full(layer.get_delta_weight(adapter)).to(merged.dtype)
        yield name, merged
        del merged  # before the next merge: never two merged copies at once


def merged_lora_state_dict(peft_model) -> dict[str, Tensor]:
    """All of :func:`iter_merged_lora_weights` as a dict (every adapted weight cloned at once: for tests and
    small models; the engine streams)."""
    return dict(iter_merged_lora_weights(peft_model))


def checkpoint_name_map(base: torch.nn.Module, state: dict[str, Tensor]) -> dict[str, str] | None:
    """Live name -> checkpoint name for every entry of ``state`` (``base``'s state dict under live names), i.e.
    the names a checkpoint written by ``save_pretrained`` has (transformers' save-time conversion, e.g.
    ``model.language_model.layers.0...`` -> ``model.layers.0...`` for Qwen2.5-VL), which is what vLLM's
    loader maps to its own modules.

    Found by running transformers' ``revert_weight_conversion`` on the live tensors (nothing is copied) and
    following each tensor by identity. None when the conversion is more than a renaming (a converter that
    merges or splits tensors): then the names of a tensor cannot be known alone and the caller must convert
    the whole dict."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # older transformers: live names are the checkpoint names
        return {k: k for k in state}
    converted = revert_weight_conversion(base, dict(state))
    by_id = {id(t): k for k, t in state.items()}
    mapping: dict[str, str] = {}
    for new, t in converted.items():
        old = by_id.get(id(t))
        if old is None or old in mapping:
            return None
        mapping[old] = new
    return mapping if len(mapping) == len(state) else None


def iter_engine_weights(lm, keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, Tensor]]:
    """What the engine loads, as a stream of ``(checkpoint name, tensor)``: the full state dict (LoRA merged
    for a PEFT model, one merged tensor at a time, :func:`iter_merged_lora_weights`) under the names of
    :func:`checkpoint_name_map`. ``keep(checkpoint_name)`` selects tensors (None: all); unselected adapted
    weights are not merged. When the save-time conversion is not a pure renaming the whole state is
    converted at once (a warning says so: the memory of one more model copy)."""
    from mmrl.models.lora import is_peft

    peft = is_peft(lm)
    base = lm.get_base_model() if peft else lm
    live = {
        k.replace(".base_layer.", "."): t for k, t in base.state_dict().items() if not (peft and _is_adapter_key(k))
    }
    names = checkpoint_name_map(base, live)
    if names is None:
        log.warning(
            "%s: transformers' save-time weight conversion is not a pure renaming; the engine's weights "
            "are converted as one dict (one more model copy in memory during the sync)",
            type(base).__name__,
        )
        from transformers.core_model_loading import revert_weight_conversion

        state = dict(iter_merged_lora_weights(lm)) if peft else {k: _full(v) for k, v in live.items()}
        for name, t in revert_weight_conversion(base, state).items():
            if keep is None or keep(name):
                yield name, t
        return
    select = None if keep is None else (lambda live_name: keep(names[live_name]))
    if peft:
        for live_name, t in iter_merged_lora_weights(lm, keep=select):
            yield names[live_name], t
    else:
        for live_name, t in live.items():
            if select is None or select(live_name):
                yield names[live_name], _full(t)


def engine_state_dict(lm) -> dict[str, Tensor]:
    """All of :func:`iter_engine_weights` as a dict (tests and inspection; the engine streams)."""
    return dict(iter_engine_weights(lm))


_NAME_SKIP = {"model", "language_model", "base_model"}


def normalise_param_name(name: str) -> str:
    """A parameter name with the wrapper components (``model``, ``language_model``, ``base_model``)
    removed, so the trainer's and vLLM's names of the same unfused tensor compare equal
    (``model.language_model.layers.0.self_attn.o_proj.weight`` and
    ``language_model.model.layers.0.self_attn.o_proj.weight`` -> ``layers.0.self_attn.o_proj.weight``)."""
    return ".".join(part for part in name.split(".") if part not in _NAME_SKIP)


CANARY_SUFFIXES: tuple[str, ...] = ("self_attn.o_proj.weight", "mlp.down_proj.weight", "attn.proj.weight")
"""Tensors the post-sync check compares: the attention output and MLP down projections of the language model
(LoRA targets, updated by every RL step) and of the vision blocks (Qwen2.5-VL's ``mlp.down_proj``, every family's
``attn.proj``). vLLM keeps them as
they are at tensor parallel 1 (``q/k/v`` and ``gate/up`` are fused into ``qkv_proj`` / ``gate_up_proj``, these
are not), under the same name up to wrapper components (:func:`normalise_param_name`)."""

_LAYER = re.compile(r"^(?P<tower>(?:.*\.)?)(?:layers|blocks)\.(?P<index>\d+)\.")


def canary_keys(names: Iterable[str], suffixes: Sequence[str] = CANARY_SUFFIXES) -> list[str]:
    """The normalised names the post-sync check compares, from a model's parameter names: those ending in one
    of ``suffixes`` in the LAST layer of each tower (``layers.<i>`` of the language model, ``visual.blocks.<i>``
    of the vision encoder; the layers farthest from the inputs, whose every element each step moves)."""
    best: dict[str, tuple[int, list[str]]] = {}
    for name in names:
        key = normalise_param_name(name)
        if not any(("." + key).endswith("." + s) for s in suffixes):
            continue
        m = _LAYER.match(key)
        if m is None:
            continue
        tower, index = m.group("tower"), int(m.group("index"))
        have = best.get(tower)
        if have is None or index > have[0]:
            best[tower] = (index, [key])
        elif index == have[0]:
            have[1].append(key)
    return sorted(k for _, keys in best.values() for k in keys)


def weight_canary_check(
    trainer_weights: Iterable[tuple[str, Tensor]], engine_params: Iterable[tuple[str, Tensor]]
) -> dict[str, float]:
    """Compare the engine's copy of the canary tensors (:func:`canary_keys` of the engine's names) with the
    trainer's values (``trainer_weights``: what was sent, e.g. :func:`iter_engine_weights`, LoRA merged).

    Each trainer tensor is cast to the engine tensor's dtype, which is what the sync's copy does, so a correct
    copy is exactly equal element by element; the comparison is over whole matrices, so a stale copy is caught
    even when an RL-sized update moves few bf16 values (elements near 0 always move; an RMSNorm weight of ~1
    does not). Returns ``{"vllm/sync_checked": tensors, "vllm/sync_checked_elements": n,
    "vllm/sync_max_abs_diff": 0.0}``; raises :class:`WeightSyncError` naming the tensor, the number of
    differing elements and the largest difference, or when no canary tensor can be matched (the check would
    be blind).
    """
    engine = {normalise_param_name(n): t for n, t in engine_params}
    wanted = set(canary_keys(engine))
    pairs = []
    for n, t in trainer_weights:
        key = normalise_param_name(n)
        if key in wanted and tuple(engine[key].shape) == tuple(t.shape):
            pairs.append((key, t, engine[key]))
    if not pairs:
        raise WeightSyncError(
            f"none of the engine's canary tensors ({sorted(wanted) or 'none found: no ' + ', '.join(CANARY_SUFFIXES)}) "
            "matches a trainer tensor by name and shape: the post-sync check cannot run (pass post_sync_hooks=[] to "
            "turn it off)"
        )
    elements = 0
    for key, a, b in sorted(pairs, key=lambda x: x[0]):
        b = b.detach()
        sent = a.detach().to(device=b.device, dtype=b.dtype)
        differ = sent != b
        n_bad = int(differ.sum())
        elements += b.numel()
        if n_bad:
            d = float((sent.float() - b.float()).abs().max())
            raise WeightSyncError(
                f"after the weight sync the engine's {key} differs from the trainer's in {n_bad} of {b.numel()} "
                f"elements (max abs {d:.3g}, compared in the engine dtype {str(b.dtype).replace('torch.', '')}, where "
                "a correct copy is exact): the engine is not generating with the trained weights (see docs/vllm.md, "
                "TRL #5312)"
            )
    return {
        "vllm/sync_checked": float(len(pairs)),
        "vllm/sync_checked_elements": float(elements),
        "vllm/sync_max_abs_diff": 0.0,
    }


def check_weight_coverage(expected: Iterable[str], loaded: Iterable[str] | None) -> int:
    """Raise :class:`WeightSyncError` unless every name in ``expected`` (the engine model's parameters) is in
    ``loaded`` (what its ``load_weights`` returned); returns the number of parameters covered.

    After a level-2 sleep the engine's weights are garbage until re-sent, and vLLM's ``load_weights`` skips
    names silently in some paths (an unmapped, renamed or filtered tensor), so an incomplete sync would sample
    from uninitialised memory without this check."""
    want = set(expected)
    if loaded is None:
        raise WeightSyncError(
            "the engine model's load_weights returned no set of loaded names, so the sync's "
            "coverage cannot be checked (the pinned vLLM, 0.33, returns one for Qwen-VL models)"
        )
    missing = sorted(want - set(loaded))
    if missing:
        raise WeightSyncError(
            f"the weight sync loaded {len(want) - len(missing)} of the engine's {len(want)} parameters; not loaded: "
            f"{missing[:5]}{' ...' if len(missing) > 5 else ''}. They keep stale values (garbage after a level-2 "
            "sleep): the trainer's state dict has no tensor vLLM maps to them"
        )
    return len(want)


# ============================================================================ engine


def _driver_model(llm) -> torch.nn.Module | None:
    """The in-process vLLM model (external_launcher / V1 without multiprocessing), or None."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        return None


PostSyncHook = Callable[["VLLMEngine", torch.nn.Module], dict]
"""``hook(engine, trainer_lm) -> metrics``; raise to stop the run."""


def default_post_sync_check(engine: VLLMEngine, lm: torch.nn.Module) -> dict:
    """The canary of :func:`weight_canary_check` over the engine's model (skipped with a warning when that
    model is not in this process). Only the canary tensors of the trainer are computed (merged with LoRA)."""
    model = _driver_model(engine.llm)
    if model is None:
        if not engine._warned_no_check:
            log.warning(
                "vLLM model is not in this process: the post-sync weight check is skipped; watch "
                "rollout/logp_abs_diff and rollout/is_ratio_min instead"
            )
            engine._warned_no_check = True
        return {}
    engine_params = list(model.named_parameters())
    wanted = set(canary_keys(n for n, _ in engine_params))
    trainer = iter_engine_weights(lm, keep=lambda name: normalise_param_name(name) in wanted)
    return weight_canary_check(trainer, ((n, t) for n, t in engine_params if normalise_param_name(n) in wanted))


class VLLMEngine:
    """Colocated ``vllm.LLM`` with sleep mode, weight sync and post-sync checks (module docstring).

    ``llm`` and ``sampling_params`` may be injected (tests use fakes); otherwise the constructor
    imports vLLM, checks for CUDA and builds the LLM from ``model_path``. ``max_images_per_prompt`` is
    vLLM's ``limit_mm_per_prompt`` for images (videos: 0); ``vision_trainable`` makes every sync reset
    vLLM's encoder cache (embeddings of images seen before were computed with the old vision weights).
    """

    def __init__(
        self,
        model_path: str,
        processor: Any,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.3,
        sleep: bool = True,
        max_model_len: int | None = None,
        seed: int = 0,
        max_images_per_prompt: int = DEFAULT_MAX_IMAGES_PER_PROMPT,
        vision_trainable: bool = True,
        llm: Any = None,
        sampling_params: Callable[..., Any] | None = None,
        post_sync_hooks: Sequence[PostSyncHook] | None = None,
    ) -> None:
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"model.vllm_gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if int(max_images_per_prompt) < 1:
            raise ValueError(f"model.vllm_max_images_per_prompt must be >= 1, got {max_images_per_prompt}")
        self.processor = processor
        self.mm_kwargs = processor_mm_kwargs(processor)
        self.sleep_enabled = bool(sleep)
        self.max_images_per_prompt = int(max_images_per_prompt)
        self.vision_trainable = bool(vision_trainable)
        tok = getattr(processor, "tokenizer", processor)
        self.image_token_id = (
            tok.convert_tokens_to_ids("<|image_pad|>") if hasattr(tok, "convert_tokens_to_ids") else None
        )
        self.post_sync_hooks: list[PostSyncHook] = list(
            post_sync_hooks if post_sync_hooks is not None else [default_post_sync_check]
        )
        self._warned_no_check = False
        self._version: int | None = None
        """Stamp of the trainer weights last loaded (None: never synced)."""
        self._weights_resident = True
        """False while the engine's weights are discarded (level-2 sleep)."""
        self._asleep = False
        self.metrics: dict[str, float] = {}
        """Metrics of the last sync / generation (``vllm/...``)."""
        if llm is None:
            llm, sampling_params = self._build_llm(
                model_path,
                dtype=dtype,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                seed=seed,
            )
        self.llm = llm
        self._sampling_params = sampling_params or (lambda **kw: kw)
        if self.sleep_enabled:
            self._sleep()

    # ------------------------------------------------------------------ construction
    def _build_llm(self, model_path: str, **kw) -> tuple[Any, Callable[..., Any]]:
        try:
            import vllm
        except ImportError as exc:
            raise VLLMUnavailableError(
                "model.rollout_engine=vllm needs vLLM: pip install 'mmrl[vllm]' on a machine with a CUDA GPU, or set "
                f"model.rollout_engine=hf ({exc})"
            ) from exc
        if not torch.cuda.is_available():
            raise VLLMUnavailableError(
                "model.rollout_engine=vllm needs a CUDA GPU (none is visible); set "
                "model.rollout_engine=hf to sample with transformers"
            )
        # one engine inside the training process (TP 1), whose model the trainer can reach for load_weights;
        # a single process started without torchrun gets its own rendezvous port (a fixed one collides)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(k, v)
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(free_port(os.environ["MASTER_ADDR"]))
        llm = vllm.LLM(
            model=str(model_path),
            dtype=kw["dtype"],
            gpu_memory_utilization=kw["gpu_memory_utilization"],
            max_model_len=kw["max_model_len"],
            enable_sleep_mode=self.sleep_enabled,
            seed=kw["seed"],
            tensor_parallel_size=1,
            distributed_executor_backend="external_launcher",
            logprobs_mode="processed_logprobs",
            mm_processor_kwargs=self.mm_kwargs,
            limit_mm_per_prompt={"image": self.max_images_per_prompt, "video": 0},
        )
        return llm, vllm.SamplingParams

    @classmethod
    def from_policy(cls, policy, **overrides) -> VLLMEngine:
        """An engine for a :class:`~mmrl.policies.vlm.VLMPolicy`: its model folder, processor, the
        ``model.vllm_*`` settings and whether its vision tower trains."""
        from mmrl.models.lora import is_peft

        cfg = policy.cfg
        lm = policy.module.lm
        base = lm.get_base_model() if is_peft(lm) else lm
        path = getattr(base, "name_or_path", None) or getattr(base.config, "_name_or_path", None)
        if not path:
            raise VLLMEngineError("the policy's model has no name_or_path: vLLM needs a model folder or hub id")
        if cfg.top_p < 1.0:
            log.warning(
                "model.top_p=%s < 1 with the vLLM engine: its log-probs are renormalised over the nucleus "
                "while the trainer's are not; expect rollout/logp_abs_diff > 0",
                cfg.top_p,
            )
        max_len = None
        if cfg.max_prompt_tokens:
            max_len = int(cfg.max_prompt_tokens) + int(cfg.max_new_tokens)
        kw = dict(
            dtype=str(cfg.dtype),
            gpu_memory_utilization=float(cfg.vllm_gpu_memory_utilization),
            sleep=bool(cfg.vllm_sleep),
            max_model_len=max_len,
            max_images_per_prompt=int(cfg.vllm_max_images_per_prompt),
            vision_trainable=bool(policy.vision_trainable),
        )
        kw.update(overrides)
        return cls(path, policy.processor, **kw)

    # ------------------------------------------------------------------ sleep / wake
    def _sleep(self) -> None:
        self.llm.sleep(level=2)
        self._asleep = True
        self._weights_resident = False

    def _wake(self, tag: str) -> None:
        self.llm.wake_up(tags=[tag])

    # ------------------------------------------------------------------ weights
    @property
    def needs_sync(self) -> bool:
        """True when the engine's weights are absent or older than the last synced trainer state."""
        return self._version is None or not self._weights_resident

    def sync_weights(self, lm: torch.nn.Module) -> dict[str, float]:
        """Stream the trainer's weights (merged LoRA for PEFT) into the engine, check that every engine
        parameter was loaded, reset its prefix cache (and its encoder cache when the vision tower trains)
        and run the post-sync hooks. Wakes the weights first when asleep (never ``reload_weights``)."""
        import time

        t0 = time.perf_counter()
        if self._asleep and not self._weights_resident:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self._wake("weights")
            self._weights_resident = True
        sent = [0]

        def counted(weights: Iterator[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
            for pair in weights:
                sent[0] += 1
                yield pair

        covered = self._load_weights(counted(iter_engine_weights(lm)))
        self.llm.reset_prefix_cache()
        if self.vision_trainable:
            self._reset_encoder_cache()
        self._version = weights_version(lm)
        metrics = {
            "vllm/sync_time": time.perf_counter() - t0,
            "vllm/sync_tensors": float(sent[0]),
            "vllm/sync_params_covered": float(covered),
        }
        for hook in self.post_sync_hooks:
            metrics.update(hook(self, lm) or {})
        self.metrics.update(metrics)
        return metrics

    def _load_weights(self, weights: Iterator[tuple[str, Tensor]]) -> int:
        """Feed the stream to the engine model's ``load_weights`` (consumed lazily, one tensor at a time) and
        check its returned name set covers every parameter (:func:`check_weight_coverage`)."""
        model = _driver_model(self.llm)
        if model is not None:
            expected = [n for n, _ in model.named_parameters()]
            return check_weight_coverage(expected, model.load_weights(weights))
        if hasattr(self.llm, "apply_model"):  # in-process only: the generator cannot cross a process boundary
            results = self.llm.apply_model(lambda m: ([n for n, _ in m.named_parameters()], m.load_weights(weights)))
            if len(results) != 1:
                raise WeightSyncError(
                    f"the vLLM engine has {len(results)} workers; mmrl's engine runs tensor parallel 1"
                )
            return check_weight_coverage(*results[0])
        raise WeightSyncError(
            "cannot reach the vLLM model to load weights: run vLLM in this process "
            "(VLLM_ENABLE_V1_MULTIPROCESSING=0) with tensor_parallel_size=1"
        )

    def _reset_encoder_cache(self) -> None:
        """Drop vLLM's cached image embeddings (keyed by the image alone, computed with the old vision weights):
        ``LLM.llm_engine.reset_encoder_cache()`` in vLLM 0.33 (``LLM.reset_mm_cache`` clears the processor's
        input cache only)."""
        for owner in (self.llm, getattr(self.llm, "llm_engine", None)):
            reset = getattr(owner, "reset_encoder_cache", None)
            if callable(reset):
                reset()
                return
        raise VLLMEngineError(
            "this vLLM has no reset_encoder_cache (LLM.llm_engine.reset_encoder_cache, vLLM 0.33): with a trainable "
            "vision tower it would reuse image embeddings of the old weights after a sync; install the pinned vLLM "
            "(pip install 'mmrl[vllm]') or keep model.freeze_vision_tower=true"
        )

    def ensure_synced(self, lm: torch.nn.Module) -> bool:
        """Sync if the trainer's weights changed since the last sync or the engine dropped them.
        Returns True when a sync ran."""
        if self.needs_sync or self._version != weights_version(lm):
            self.sync_weights(lm)
            return True
        return False

    # ------------------------------------------------------------------ sampling
    def sample(
        self,
        prompts: Sequence[Any],
        seeds: Sequence[int],
        *,
        lm: torch.nn.Module,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        eos_ids: Sequence[int],
        pad_id: int,
        suppress_ids: Sequence[int] = (),
        greedy: bool = False,
    ) -> Completions:
        """Sample one completion per entry of ``prompts`` (PromptInputs, repeated per sample) with the
        trainer's current weights; returns ids, mask, behaviour log-probs and truncation flags. Greedy
        requests ask vLLM for one completion and repeat it (the copies would be equal)."""
        requests = build_requests(prompts, seeds, self.mm_kwargs, max_images=self.max_images_per_prompt)
        params = [
            self._sampling_params(
                **sampling_kwargs(
                    n=1 if greedy else r.n,
                    seed=r.seed,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    eos_ids=eos_ids,
                    suppress_ids=suppress_ids,
                    greedy=greedy,
                )
            )
            for r in requests
        ]
        self.ensure_synced(lm)
        if self._asleep:
            self._wake("kv_cache")
            self._asleep = False
        try:
            if self._version != weights_version(lm) or not self._weights_resident:
                raise StaleWeightsError("the trainer's weights changed during the sync: the engine's are not current")
            for hook in self.post_sync_hooks:  # the weights generation will use, checked right before it
                hook(self, lm)
            outputs = self.llm.generate([r.prompt for r in requests], sampling_params=params, use_tqdm=False)
        finally:
            if self.sleep_enabled:
                self._sleep()
        if greedy:
            outputs = [
                SimpleNamespace(outputs=list(o.outputs) * r.n, prompt_token_ids=getattr(o, "prompt_token_ids", None))
                for o, r in zip(outputs, requests)
            ]
        check_prompt_tokens(prompts, requests, outputs, self.image_token_id, self.mm_kwargs)
        return completions_from_outputs(
            outputs, requests, eos_ids=eos_ids, pad_id=pad_id, max_new_tokens=max_new_tokens
        )

    def sample_for_policy(
        self, policy, prompts: Sequence[Any], seeds: Sequence[int], *, greedy: bool = False
    ) -> Completions:
        """:meth:`sample` with a VLM policy's model, generation settings, EOS, padding and suppressed ids."""
        cfg = policy.cfg
        return self.sample(
            prompts,
            seeds,
            lm=policy.module.lm,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            eos_ids=policy.eos_ids,
            pad_id=policy.pad_id,
            suppress_ids=policy.suppress_ids,
            greedy=greedy,
        )


def build_rollout_engine(policy) -> VLLMEngine | None:
    """The engine ``policy.cfg.rollout_engine`` asks for: None for ``hf`` (transformers ``generate``),
    a :class:`VLLMEngine` for ``vllm`` (raises :class:`VLLMUnavailableError` without vLLM or CUDA)."""
    name = check_rollout_engine(policy.cfg.rollout_engine)
    if name == "hf":
        return None
    return VLLMEngine.from_policy(policy)
