"""A colocated vLLM rollout engine for the VLM policy (optional; needs vLLM and a CUDA GPU).

The engine samples the completions of :meth:`mmrl.policies.vlm.VLMPolicy.rollout` when
``model.rollout_engine=vllm``; everything else (log-probs, training, rewards) stays in the trainer.
One ``vllm.LLM`` lives in the training process (``distributed_executor_backend="external_launcher"``,
tensor parallel 1) and shares the GPU with the trainer:

1. **Same inputs.** Requests are built from the trainer's own :class:`~mmrl.policies.vlm.PromptInputs`
   (the templated ``text`` and the RGB images, ``multi_modal_data``), with ``mm_processor_kwargs``
   read from the trainer's processor (the same ``min/max_pixels`` budget), so both sides resize the
   images identically. The engine's tokenised prompt is compared with the trainer's: a different
   number of image tokens raises :class:`PromptMismatchError` naming the pixel settings (the
   "image features and image tokens do not match" complaints of R1-V #133 / EasyR1 #267).
2. **Same log-probs.** ``logprobs=0`` returns the sampled token's log-prob; with
   ``logprobs_mode="processed_logprobs"`` it is ``log_softmax(logits / T)`` at that token, the
   trainer's formula (up to the suppressed vision tokens, whose probability is removed from the
   normaliser, and the nucleus when ``top_p < 1``: keep ``top_p = 1`` with this engine).
3. **Fresh weights.** Before each generation the engine compares a version stamp of the trainer's
   parameters (in-place updates such as ``optimizer.step()`` bump every tensor's version counter)
   with the one it last loaded, and re-loads the full state dict (merged LoRA weights for a PEFT
   model) through the model's ``load_weights`` when they differ, or when sleep discarded them. So
   the weights are synced after every optimizer step that precedes a rollout.
4. **Sleep.** With ``model.vllm_sleep`` the engine sleeps at level 2 (weights and KV cache
   released) outside generation. It wakes the weights, loads the trainer's weights, resets the
   prefix cache, checks the sync, then wakes the KV cache and generates. It never calls vLLM's
   ``reload_weights`` after a sync: that reloads the checkpoint from disk and silently trains against
   the base weights (TRL #5312, where the tell was an importance ratio of ~3e-7).
5. **Checks.** After each sync, and right before each generation, the post-sync hooks run; the
   default one compares a few RMSNorm weights of the engine with the trainer's (cast to the engine
   dtype, they must be equal). The trainer's ``rollout/logp_abs_diff`` and
   ``rollout/is_ratio_{min,max}`` metrics catch everything else on the next step (see docs/vllm.md).

Only the pure parts (request building, output mapping, LoRA merge, version stamps, the sync state
machine over an injected fake ``LLM``) run without vLLM; ``import vllm`` happens in the constructor.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

from mmrl.rollout.token_sampler import Completions, completion_mask

__all__ = [
    "ROLLOUT_ENGINES",
    "EngineRequest",
    "PromptMismatchError",
    "StaleWeightsError",
    "VLLMEngine",
    "VLLMEngineError",
    "VLLMUnavailableError",
    "WeightSyncError",
    "build_requests",
    "build_rollout_engine",
    "check_prompt_tokens",
    "check_rollout_engine",
    "completions_from_outputs",
    "engine_state_dict",
    "merged_lora_state_dict",
    "norm_canary_check",
    "normalise_param_name",
    "processor_mm_kwargs",
    "sampling_kwargs",
    "weights_version",
]

log = logging.getLogger(__name__)

ROLLOUT_ENGINES: tuple[str, ...] = ("hf", "vllm")
"""Accepted values of ``model.rollout_engine``."""

SUPPRESS_BIAS = -100.0
"""Logit bias that removes a token from sampling (vision special tokens)."""


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
        f"cannot read the pixel budget of {type(ip).__name__} (size={size}); set model.min_pixels and model.max_pixels")


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


def build_requests(prompts: Sequence[Any], seeds: Sequence[int], mm_kwargs: dict[str, Any]) -> list[EngineRequest]:
    """Group the rollout's per-sample prompts into vLLM requests.

    ``prompts[k]`` is the :class:`~mmrl.policies.vlm.PromptInputs` of sample ``k`` (the same object
    repeated for the ``G`` samples of a prompt); consecutive repeats become one request with ``n`` =
    the run length, so vLLM encodes the prompt (and its images) once. Videos are not supported.
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"build_requests: {len(prompts)} prompts but {len(seeds)} seeds")
    out: list[EngineRequest] = []
    for k, (p, s) in enumerate(zip(prompts, seeds)):
        if out and prompts[out[-1].first] is p:
            out[-1].n += 1
            continue
        if getattr(p, "num_videos", 0):
            raise VLLMEngineError("the vLLM rollout engine takes image and text prompts only; video prompts need "
                                  "model.rollout_engine=hf")
        if not isinstance(getattr(p, "text", None), str):
            raise VLLMEngineError(f"sample {k}: the prompt has no templated text (not a PromptInputs?)")
        request: dict[str, Any] = {"prompt": p.text}
        if p.images:
            request["multi_modal_data"] = {"image": list(p.images) if len(p.images) > 1 else p.images[0]}
            request["mm_processor_kwargs"] = dict(mm_kwargs)
        out.append(EngineRequest(prompt=request, n=1, seed=int(s), first=k))
    return out


def sampling_kwargs(*, n: int, seed: int, max_new_tokens: int, temperature: float, top_p: float,
                    eos_ids: Sequence[int], suppress_ids: Sequence[int], greedy: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request.

    ``logprobs=0`` returns the sampled token's log-prob only; greedy decoding is temperature 0 (vLLM
    then reports untempered log-probs, which evaluation does not use). Vision special tokens are
    suppressed with a large negative logit bias, as the HF path masks them.
    """
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"sampling_kwargs: n={n} and max_new_tokens={max_new_tokens} must be >= 1")
    if not greedy and temperature <= 0:
        raise ValueError(f"sampling temperature must be > 0 (got {temperature}); use greedy=True for argmax decoding")
    return {
        "n": int(n),
        "seed": int(seed) % (2 ** 63),
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


def completions_from_outputs(outputs: Sequence[Any], requests: Sequence[EngineRequest], *, eos_ids: Sequence[int],
                             pad_id: int, max_new_tokens: int) -> Completions:
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
            raise VLLMEngineError(f"request of sample {req.first}: vLLM returned {len(comps)} completions, expected {req.n}")
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


def check_prompt_tokens(prompts: Sequence[Any], requests: Sequence[EngineRequest], outputs: Sequence[Any],
                        image_token_id: int | None, mm_kwargs: dict[str, Any]) -> None:
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
            "trainer's processor settings (model.min_pixels / model.max_pixels)")


# ============================================================================ weights


def weights_version(module: torch.nn.Module) -> int:
    """A stamp that changes whenever any parameter is updated in place (``optimizer.step``,
    ``load_state_dict``) or replaced: a hash of (identity, version counter) of every parameter."""
    return hash(tuple((id(p), p._version) for p in module.parameters()))


def _lora_delta_modules(peft_model) -> dict[str, Any]:
    """Qualified name (in the base model, PEFT's wrapper prefixes stripped) -> LoRA layer, for every
    layer that carries an active adapter."""
    base = peft_model.get_base_model()
    out = {}
    for name, mod in base.named_modules():
        if hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer") and getattr(mod, "active_adapters", None):
            out[name] = mod
    return out


def merged_lora_state_dict(peft_model) -> dict[str, Tensor]:
    """The base model's state dict with every active LoRA adapter merged in (``W + scale * B A``),
    under the base model's own parameter names; the live model is not modified.

    Adapter tensors (``lora_A``/``lora_B``/...) are dropped and ``.base_layer.`` is removed from names,
    so the result loads like a plain checkpoint of the base architecture.
    """
    base = peft_model.get_base_model()
    layers = _lora_delta_modules(peft_model)
    out: dict[str, Tensor] = {}
    with torch.no_grad():
        for key, t in base.state_dict().items():
            if ".lora_" in key or key.endswith(".lora_magnitude_vector"):
                continue
            name = key.replace(".base_layer.", ".")
            owner, _, leaf = key.rpartition(".base_layer.")
            if owner and owner in layers and leaf == "weight":
                layer = layers[owner]
                merged = t.detach().clone()
                for adapter in layer.active_adapters:
                    if adapter in getattr(layer, "lora_A", {}):
                        merged += layer.get_delta_weight(adapter).to(merged.dtype)
                out[name] = merged
            else:
                out[name] = t.detach()
    return out


def engine_state_dict(lm) -> dict[str, Tensor]:
    """What the engine loads: the full state dict (LoRA merged for a PEFT model) under the names a
    checkpoint written by ``save_pretrained`` has (transformers' save-time renaming), which is what
    vLLM's loader maps to its own modules."""
    from mmrl.models.lora import is_peft

    if is_peft(lm):
        base = lm.get_base_model()
        state = merged_lora_state_dict(lm)
    else:
        base = lm
        state = {k: v.detach() for k, v in lm.state_dict().items()}
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # older transformers: live names are the checkpoint names
        return state
    return dict(revert_weight_conversion(base, state))


_NAME_SKIP = {"model", "language_model", "base_model"}


def normalise_param_name(name: str) -> str:
    """A parameter name with the wrapper components (``model``, ``language_model``, ``base_model``)
    removed, so the trainer's and vLLM's names of the same unfused tensor compare equal
    (``model.language_model.layers.0.input_layernorm.weight`` and
    ``language_model.model.layers.0.input_layernorm.weight`` -> ``layers.0.input_layernorm.weight``)."""
    return ".".join(part for part in name.split(".") if part not in _NAME_SKIP)


def _layer_order(key: str) -> tuple[int, int, str]:
    """Sort key: names outside ``layers.<i>.`` first, then by layer index."""
    parts = key.split(".")
    if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit():
        return (1, int(parts[1]), key)
    return (0, 0, key)


def norm_canary_check(trainer_params: Iterable[tuple[str, Tensor]], engine_params: Iterable[tuple[str, Tensor]], *,
                      max_checks: int = 3) -> dict[str, float]:
    """Compare a few RMSNorm weights (never fused or sharded by vLLM) of the engine with the trainer's.

    The trainer tensor is cast to the engine's dtype, so a correct copy is exactly equal. Returns
    ``{"vllm/sync_checked": n, "vllm/sync_max_abs_diff": d}``; raises :class:`WeightSyncError` on a
    difference, or when no norm weight can be matched (the check would be blind).
    """
    mine = {normalise_param_name(n): t for n, t in trainer_params if n.endswith("norm.weight")}
    pairs = []
    for n, t in engine_params:
        key = normalise_param_name(n)
        if key in mine and tuple(mine[key].shape) == tuple(t.shape):
            pairs.append((key, mine[key], t))
    if not pairs:
        raise WeightSyncError("no RMSNorm weight of the trainer matches one of the engine by name and shape: the "
                              "post-sync check cannot run (pass post_sync_hooks=[] to turn it off)")
    # prefer the last language-model layers (farthest from the embedding; every step updates them)
    chosen = sorted(pairs, key=lambda x: _layer_order(x[0]))[-max_checks:]
    worst = 0.0
    for key, a, b in chosen:
        d = float((a.detach().to(device=b.device, dtype=b.dtype) - b.detach()).abs().max())
        worst = max(worst, d)
        if d > 0:
            raise WeightSyncError(
                f"after the weight sync the engine's {key} differs from the trainer's by {d:.3g} (max abs): the "
                "engine is not generating with the trained weights (see docs/vllm.md, TRL #5312)")
    return {"vllm/sync_checked": float(len(chosen)), "vllm/sync_max_abs_diff": worst}


# ============================================================================ engine


def _driver_model(llm) -> torch.nn.Module | None:
    """The in-process vLLM model (external_launcher / V1 without multiprocessing), or None."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        return None


PostSyncHook = Callable[["VLLMEngine", torch.nn.Module], dict]
"""``hook(engine, trainer_lm) -> metrics``; raise to stop the run."""


def default_post_sync_check(engine: "VLLMEngine", lm: torch.nn.Module) -> dict:
    """The norm-weight canary of :func:`norm_canary_check` (skipped with a warning when the engine's
    model is not in this process)."""
    model = _driver_model(engine.llm)
    if model is None:
        if not engine._warned_no_check:
            log.warning("vLLM model is not in this process: the post-sync weight check is skipped; watch "
                        "rollout/logp_abs_diff and rollout/is_ratio_min instead")
            engine._warned_no_check = True
        return {}
    # norm weights never carry LoRA adapters: the live parameters are what was sent (no merge needed)
    return norm_canary_check(lm.named_parameters(), model.named_parameters())


class VLLMEngine:
    """Colocated ``vllm.LLM`` with sleep mode, weight sync and post-sync checks (module docstring).

    ``llm`` and ``sampling_params`` may be injected (tests use fakes); otherwise the constructor
    imports vLLM, checks for CUDA and builds the LLM from ``model_path``.
    """

    def __init__(self, model_path: str, processor: Any, *, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.3, sleep: bool = True, max_model_len: int | None = None,
                 seed: int = 0, max_images_per_prompt: int = 4, llm: Any = None,
                 sampling_params: Callable[..., Any] | None = None,
                 post_sync_hooks: Sequence[PostSyncHook] | None = None) -> None:
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"model.vllm_gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        self.processor = processor
        self.mm_kwargs = processor_mm_kwargs(processor)
        self.sleep_enabled = bool(sleep)
        tok = getattr(processor, "tokenizer", processor)
        self.image_token_id = tok.convert_tokens_to_ids("<|image_pad|>") if hasattr(tok, "convert_tokens_to_ids") else None
        self.post_sync_hooks: list[PostSyncHook] = list(
            post_sync_hooks if post_sync_hooks is not None else [default_post_sync_check])
        self._warned_no_check = False
        self._version: int | None = None
        """Stamp of the trainer weights last loaded (None: never synced)."""
        self._weights_resident = True
        """False while the engine's weights are discarded (level-2 sleep)."""
        self._asleep = False
        self.metrics: dict[str, float] = {}
        """Metrics of the last sync / generation (``vllm/...``)."""
        if llm is None:
            llm, sampling_params = self._build_llm(model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                                                   max_model_len=max_model_len, seed=seed,
                                                   max_images_per_prompt=max_images_per_prompt)
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
                f"model.rollout_engine=hf ({exc})") from exc
        if not torch.cuda.is_available():
            raise VLLMUnavailableError("model.rollout_engine=vllm needs a CUDA GPU (none is visible); set "
                                       "model.rollout_engine=hf to sample with transformers")
        # one engine inside the training process (TP 1), whose model the trainer can reach for load_weights
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                     ("MASTER_PORT", "29533")):
            os.environ.setdefault(k, v)
        llm = vllm.LLM(
            model=str(model_path), dtype=kw["dtype"], gpu_memory_utilization=kw["gpu_memory_utilization"],
            max_model_len=kw["max_model_len"], enable_sleep_mode=self.sleep_enabled, seed=kw["seed"],
            tensor_parallel_size=1, distributed_executor_backend="external_launcher",
            logprobs_mode="processed_logprobs", mm_processor_kwargs=self.mm_kwargs,
            limit_mm_per_prompt={"image": kw["max_images_per_prompt"], "video": 0},
        )
        return llm, vllm.SamplingParams

    @classmethod
    def from_policy(cls, policy, **overrides) -> "VLLMEngine":
        """An engine for a :class:`~mmrl.policies.vlm.VLMPolicy`: its model folder, processor and the
        ``model.vllm_*`` settings."""
        from mmrl.models.lora import is_peft

        cfg = policy.cfg
        lm = policy.module.lm
        base = lm.get_base_model() if is_peft(lm) else lm
        path = getattr(base, "name_or_path", None) or getattr(base.config, "_name_or_path", None)
        if not path:
            raise VLLMEngineError("the policy's model has no name_or_path: vLLM needs a model folder or hub id")
        if getattr(cfg, "top_p", 1.0) < 1.0:
            log.warning("model.top_p=%s < 1 with the vLLM engine: its log-probs are renormalised over the nucleus "
                        "while the trainer's are not; expect rollout/logp_abs_diff > 0", cfg.top_p)
        max_len = None
        if getattr(cfg, "max_prompt_tokens", None):
            max_len = int(cfg.max_prompt_tokens) + int(cfg.max_new_tokens)
        kw = dict(dtype=str(getattr(cfg, "dtype", "bfloat16")),
                  gpu_memory_utilization=float(getattr(cfg, "vllm_gpu_memory_utilization", 0.3)),
                  sleep=bool(getattr(cfg, "vllm_sleep", True)), max_model_len=max_len)
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
        """Load the trainer's weights (merged LoRA for PEFT) into the engine, reset its prefix cache
        and run the post-sync hooks. Wakes the weights first when asleep (never ``reload_weights``)."""
        import time

        t0 = time.perf_counter()
        if self._asleep and not self._weights_resident:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self._wake("weights")
            self._weights_resident = True
        state = engine_state_dict(lm)
        self._load_weights(state.items())
        self.llm.reset_prefix_cache()
        self._version = weights_version(lm)
        metrics = {"vllm/sync_time": time.perf_counter() - t0, "vllm/sync_tensors": float(len(state))}
        for hook in self.post_sync_hooks:
            metrics.update(hook(self, lm) or {})
        self.metrics.update(metrics)
        return metrics

    def _load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        model = _driver_model(self.llm)
        if model is not None:
            model.load_weights(weights)
            return
        if hasattr(self.llm, "apply_model"):
            items = list(weights)
            self.llm.apply_model(lambda m: m.load_weights(items))
            return
        raise WeightSyncError("cannot reach the vLLM model to load weights: run vLLM in this process "
                              "(VLLM_ENABLE_V1_MULTIPROCESSING=0) with tensor_parallel_size=1")

    def ensure_synced(self, lm: torch.nn.Module) -> bool:
        """Sync if the trainer's weights changed since the last sync or the engine dropped them.
        Returns True when a sync ran."""
        if self.needs_sync or self._version != weights_version(lm):
            self.sync_weights(lm)
            return True
        return False

    # ------------------------------------------------------------------ sampling
    def sample(self, prompts: Sequence[Any], seeds: Sequence[int], *, lm: torch.nn.Module, max_new_tokens: int,
               temperature: float, top_p: float, eos_ids: Sequence[int], pad_id: int,
               suppress_ids: Sequence[int] = (), greedy: bool = False) -> Completions:
        """Sample one completion per entry of ``prompts`` (PromptInputs, repeated per sample) with the
        trainer's current weights; returns ids, mask, behaviour log-probs and truncation flags."""
        requests = build_requests(prompts, seeds, self.mm_kwargs)
        params = [self._sampling_params(**sampling_kwargs(
            n=r.n, seed=r.seed, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
            eos_ids=eos_ids, suppress_ids=suppress_ids, greedy=greedy)) for r in requests]
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
        check_prompt_tokens(prompts, requests, outputs, self.image_token_id, self.mm_kwargs)
        return completions_from_outputs(outputs, requests, eos_ids=eos_ids, pad_id=pad_id,
                                        max_new_tokens=max_new_tokens)

    def sample_for_policy(self, policy, prompts: Sequence[Any], seeds: Sequence[int], *,
                          greedy: bool = False) -> Completions:
        """:meth:`sample` with a VLM policy's model, generation settings, EOS, padding and suppressed ids."""
        cfg = policy.cfg
        return self.sample(prompts, seeds, lm=policy.module.lm, max_new_tokens=cfg.max_new_tokens,
                           temperature=cfg.temperature, top_p=cfg.top_p, eos_ids=policy.eos_ids,
                           pad_id=policy.pad_id, suppress_ids=policy.suppress_ids, greedy=greedy)


def build_rollout_engine(policy) -> VLLMEngine | None:
    """The engine ``policy.cfg.rollout_engine`` asks for: None for ``hf`` (transformers ``generate``),
    a :class:`VLLMEngine` for ``vllm`` (raises :class:`VLLMUnavailableError` without vLLM or CUDA)."""
    name = check_rollout_engine(getattr(policy.cfg, "rollout_engine", "hf"))
    if name == "hf":
        return None
    return VLLMEngine.from_policy(policy)
