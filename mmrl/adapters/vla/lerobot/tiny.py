"""Tiny random SmolVLA, π0 and π0.5 models built from config, offline (``model=tiny_smolvla|tiny_pi0|tiny_pi05``
CPU runs and tests).

SmolVLA (``build_tiny_smolvla``): the architecture, preprocessing and checkpoint layout of a real SmolVLA
(``SmolVLAPipeline``), at widths of tens: a SigLIP-style encoder on 64 x 64 frames (4 tokens per camera), 4 VLM text
layers of width 64 alternating self-/cross-attention for the expert (width 48), a byte-level tokenizer (256 byte
tokens + SmolVLM's special tokens). ``save_smolvla`` writes it as a LeRobot folder with the VLM config, tokenizer and
processor bundled in ``vlm/`` (config.json's ``vlm_model_name`` is ``"vlm"``: LeRobot resolves it relative to the
working directory, mmrl also next to the checkpoint).

π0 / π0.5 (``build_tiny_pi0``, ``pi05=True``): a real ``PI0Pipeline`` (``PI0Model`` / ``PI05Model``, LeRobot's
processor files) at the sizes of the ``pi0_tiny`` fixture: SigLIP width 32 on 32 x 32 frames (16 tokens per
camera), a Gemma language model and expert of 2 layers (widths 64 / 32, 8 query heads of 8, one key/value head)
and a tiny Gemma-like byte tokenizer (``gemma_byte_tokenizer``: Gemma's four special tokens, 256 byte tokens,
``<bos>`` prepended), generated here. The pre-processor's ``tokenizer_name`` is ``./tokenizer``: ``save_policy``
writes the tokenizer into ``tokenizer/`` next to the checkpoint, where ``load_policy`` finds it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "TinyPI0Spec",
    "TinySmolVLASpec",
    "build_tiny_pi0",
    "build_tiny_smolvla",
    "byte_level_tokenizer",
    "gemma_byte_tokenizer",
]

SMOLVLM_SPECIAL_TOKENS = {
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}


@dataclass
class TinySmolVLASpec:
    """Inputs, outputs and sizes of a tiny SmolVLA."""

    cameras: Sequence[str] = ("observation.images.image", "observation.images.image2")
    """Camera feature keys (LeRobot's LIBERO names by default: agentview, wrist)."""
    image_shape: tuple[int, int, int] = (3, 128, 128)
    """Raw frame shape (C, H, W) recorded in the config's input features."""
    state_dim: int = 8
    action_dim: int = 7
    chunk_size: int = 8
    num_steps: int = 10
    max_state_dim: int = 32
    max_action_dim: int = 32
    image_size: int = 64
    """Frames are resized with padding to this square size; the encoder's patches are 16 px, 2x2 pixel-shuffled."""
    text_width: int = 64
    num_vlm_layers: int = 4
    expert_width_multiplier: float = 0.75
    tokenizer_max_length: int = 48
    stats: Mapping[str, Mapping[str, Sequence[float]]] = field(default_factory=dict)
    """Normalisation statistics (``{"observation.state": {"mean": [...], "std": [...]}, "action": {...}}``);
    default mean 0 and std 1 (no change but LeRobot's eps)."""
    seed: int = 0


def byte_level_tokenizer():
    """A byte-level BPE tokenizer without merges (256 byte tokens) plus SmolVLM's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        extra_special_tokens=dict(SMOLVLM_SPECIAL_TOKENS),
    )


def _vlm_config(spec: TinySmolVLASpec, tokenizer) -> dict[str, Any]:
    from transformers import SmolVLMConfig

    heads = max(1, spec.text_width // 16)
    config = SmolVLMConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": spec.image_size,
            "patch_size": 16,
        },
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": spec.text_width,
            "intermediate_size": 2 * spec.text_width,
            "num_hidden_layers": spec.num_vlm_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 2),
            "head_dim": 16,
            "rms_norm_eps": 1e-5,
            "pad_token_id": tokenizer.pad_token_id,
        },
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids(SMOLVLM_SPECIAL_TOKENS["image_token"]),
        tie_word_embeddings=False,
    )
    return config.to_dict()


def _expert_intermediate(width: int) -> int:
    """SmolVLA's expert MLP width: 4 · (2/3 · width), rounded up to a multiple of 256."""
    hidden = int(4 * int(2 * width / 3))
    return 256 * ((hidden + 255) // 256)


def _lerobot_config(spec: TinySmolVLASpec) -> dict[str, Any]:
    """config.json as LeRobot writes it for these sizes (the fields SmolVLA reads)."""
    features = {cam: {"type": "VISUAL", "shape": list(spec.image_shape)} for cam in spec.cameras}
    features["observation.state"] = {"type": "STATE", "shape": [spec.state_dim]}
    return {
        "type": "smolvla",
        "n_obs_steps": 1,
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [spec.action_dim]}},
        "device": "cpu",
        "chunk_size": spec.chunk_size,
        "n_action_steps": spec.chunk_size,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "max_state_dim": spec.max_state_dim,
        "max_action_dim": spec.max_action_dim,
        "resize_imgs_with_padding": [spec.image_size, spec.image_size],
        "empty_cameras": 0,
        "tokenizer_max_length": spec.tokenizer_max_length,
        "num_steps": spec.num_steps,
        "use_cache": True,
        "vlm_model_name": "vlm",
        "load_vlm_weights": False,
        "add_image_special_tokens": False,
        "attention_mode": "cross_attn",
        "prefix_length": -1,
        "pad_language_to": "longest",
        "num_expert_layers": -1,
        "num_vlm_layers": spec.num_vlm_layers,
        "self_attn_every_n_layers": 2,
        "expert_width_multiplier": spec.expert_width_multiplier,
        "min_period": 4e-3,
        "max_period": 4.0,
    }


def _processor_files(spec: TinySmolVLASpec) -> dict[str, Any]:
    """policy_preprocessor.json / policy_postprocessor.json as LeRobot writes them for SmolVLA."""
    cfg = _lerobot_config(spec)
    norm_map = cfg["normalization_mapping"]
    all_features = {**cfg["input_features"], **cfg["output_features"]}
    pre = {
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {"registry_name": "smolvla_new_line_processor", "config": {}},
            {
                "registry_name": "tokenizer_processor",
                "config": {
                    "max_length": spec.tokenizer_max_length,
                    "task_key": "task",
                    "padding_side": "right",
                    "padding": "longest",
                    "truncation": True,
                    "tokenizer_name": "vlm",
                },
            },
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
            {
                "registry_name": "normalizer_processor",
                "config": {"eps": 1e-8, "features": all_features, "norm_map": norm_map},
                "state_file": "policy_preprocessor_step_5_normalizer_processor.safetensors",
            },
        ],
    }
    post = {
        "name": "policy_postprocessor",
        "steps": [
            {
                "registry_name": "unnormalizer_processor",
                "config": {"eps": 1e-8, "features": cfg["output_features"], "norm_map": norm_map},
                "state_file": "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
            },
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        ],
    }
    return {"policy_preprocessor.json": pre, "policy_postprocessor.json": post}


def _init_weights(
    model: torch.nn.Module,
    std: float = 0.02,
    *,
    skip: tuple[str, ...] = ("vision_model.", "connector."),
    norm_value: float = 1.0,
) -> None:
    """Llama-style init of the text layers, expert and projections: N(0, std) weights, zero biases, norm weights
    ``norm_value`` (1 for Llama's RMSNorm; 0 for Gemma's, which scales by ``1 + w``). ``skip``: parameter-name
    prefixes left to transformers' own init (the vision tower)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith(skip):
                continue  # transformers' own init (post_init)
            if param.ndim >= 2:
                param.normal_(0.0, std)
            elif "norm" in name:
                param.fill_(norm_value)
            else:
                param.zero_()


def _normalizers(features: dict[str, str], norm_map: dict[str, str], state_dim: int, action_dim: int, given):
    """(normalizer, unnormalizer): ``given`` statistics over the defaults mean 0 / std 1 (no change but LeRobot's
    eps)."""
    from mmrl.adapters.vla.lerobot.processing import Normalizer

    stats = {
        "observation.state": {"mean": [0.0] * state_dim, "std": [1.0] * state_dim},
        "action": {"mean": [0.0] * action_dim, "std": [1.0] * action_dim},
    }
    stats.update({key: dict(sub) for key, sub in given.items()})
    tensors = {key: {n: torch.as_tensor(v, dtype=torch.float32) for n, v in sub.items()} for key, sub in stats.items()}
    normalizer = Normalizer(features, norm_map, tensors, eps=1e-8)
    unnormalizer = Normalizer({"action": "ACTION"}, norm_map, {"action": tensors["action"]}, eps=1e-8)
    return normalizer, unnormalizer


def build_tiny_smolvla(spec: TinySmolVLASpec | None = None, **overrides: Any):
    """A random tiny ``SmolVLAPipeline`` (float32, CPU) for ``spec`` (fields can also be given as keywords)."""
    from mmrl.adapters.vla.lerobot.checkpoint import _spec
    from mmrl.adapters.vla.lerobot.pipeline import SmolVLAPipeline
    from mmrl.adapters.vla.lerobot.processing import TokenizerSettings
    from mmrl.adapters.vla.lerobot.smolvla import SmolVLAConfig, SmolVLAModel

    spec = spec or TinySmolVLASpec()
    for key, value in overrides.items():
        setattr(spec, key, value)
    torch.manual_seed(spec.seed)
    tokenizer = byte_level_tokenizer()
    vlm = _vlm_config(spec, tokenizer)
    cfg = _lerobot_config(spec)
    expert_width = int(spec.text_width * spec.expert_width_multiplier)
    model_config = SmolVLAConfig(
        vlm_config=vlm,
        num_vlm_layers=spec.num_vlm_layers,
        expert_width=expert_width,
        expert_intermediate=_expert_intermediate(expert_width),
        num_expert_layers=spec.num_vlm_layers,
        chunk_size=spec.chunk_size,
        max_state_dim=spec.max_state_dim,
        max_action_dim=spec.max_action_dim,
        num_steps=spec.num_steps,
    )
    model = SmolVLAModel(model_config)
    _init_weights(model)
    features = {key: ft["type"] for key, ft in {**cfg["input_features"], **cfg["output_features"]}.items()}
    normalizer, unnormalizer = _normalizers(
        features, cfg["normalization_mapping"], spec.state_dim, spec.action_dim, spec.stats
    )
    pipeline = SmolVLAPipeline(
        model,
        _spec(cfg),
        normalizer,
        unnormalizer,
        tokenizer,
        TokenizerSettings("vlm", max_length=spec.tokenizer_max_length),
        lerobot_config=cfg,
        unused_tensors={  # LeRobot's checkpoints carry the VLM's LM head and final norm (no output reads them)
            "model.vlm_with_expert.vlm.lm_head.weight": 0.02 * torch.randn(len(tokenizer), spec.text_width),
            "model.vlm_with_expert.vlm.model.text_model.norm.weight": torch.ones(spec.text_width),
        },
        processor_files=_processor_files(spec),
    )
    pipeline.bundled_vlm = vlm
    return pipeline.eval()


# ---------------------------------------------------------------------------------------------- π0 / π0.5

GEMMA_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")
"""The tiny Gemma-like tokenizer's first ids, in Gemma's order (pad 0, eos 1, bos 2, unk 3)."""
PI0_TOKENIZER_DIR = "tokenizer"
"""Folder of the tiny π0 tokenizer next to a saved checkpoint (the pre-processor names it ``./tokenizer``)."""


def gemma_byte_tokenizer():
    """A tiny Gemma-like tokenizer: Gemma's four special tokens, 256 byte tokens (no merges), ``<bos>`` prepended
    (the ``pi0_tiny`` fixture's, built the same way by ``scripts/lerobot_fixtures.py``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(GEMMA_SPECIAL_TOKENS)}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


@dataclass
class TinyPI0Spec:
    """Inputs, outputs and sizes of a tiny π0 / π0.5."""

    pi05: bool = False
    """π0.5 (adaRMS time conditioning, the state in the prompt) instead of π0."""
    cameras: Sequence[str] = ("observation.images.image", "observation.images.image2")
    """Camera feature keys (LeRobot's LIBERO names by default: agentview, wrist)."""
    image_shape: tuple[int, int, int] = (3, 128, 128)
    """Raw frame shape (C, H, W) recorded in the config's input features."""
    state_dim: int = 8
    action_dim: int = 7
    chunk_size: int = 8
    num_steps: int = 10
    max_state_dim: int = 32
    max_action_dim: int = 32
    image_size: int = 32
    """SigLIP's square input side (LeRobot's ``image_resolution``); 8 px patches."""
    width: int = 64
    """The Gemma language model's width (the expert's is half)."""
    depth: int = 2
    """Layers of the language model and of the expert."""
    tokenizer_max_length: int = 48
    """Prompt tokens (π0.5's prompt holds the state too: raised to at least 4 per state dim + 48)."""
    stats: Mapping[str, Mapping[str, Sequence[float]]] = field(default_factory=dict)
    """Normalisation statistics, as for :class:`TinySmolVLASpec` (MEAN_STD for both π0 and π0.5 here)."""
    seed: int = 0


def _pi0_lerobot_config(spec: TinyPI0Spec) -> dict[str, Any]:
    """config.json as LeRobot writes it for a π0 / π0.5 (the fields mmrl reads and a LeRobot load needs)."""
    features = {cam: {"type": "VISUAL", "shape": list(spec.image_shape)} for cam in spec.cameras}
    features["observation.state"] = {"type": "STATE", "shape": [spec.state_dim]}
    return {
        "type": "pi05" if spec.pi05 else "pi0",
        "n_obs_steps": 1,
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [spec.action_dim]}},
        "device": "cpu",
        "paligemma_variant": "gemma_2b",  # LeRobot's names; the real sizes come from the tensors
        "action_expert_variant": "gemma_300m",
        "dtype": "float32",
        "chunk_size": spec.chunk_size,
        "n_action_steps": spec.chunk_size,
        "max_state_dim": spec.max_state_dim,
        "max_action_dim": spec.max_action_dim,
        "num_inference_steps": spec.num_steps,
        "time_sampling_beta_alpha": 1.5,
        "time_sampling_beta_beta": 1.0,
        "time_sampling_scale": 0.999,
        "time_sampling_offset": 0.001,
        "min_period": 4e-3,
        "max_period": 4.0,
        "use_relative_actions": False,
        "image_resolution": [spec.image_size, spec.image_size],
        "empty_cameras": 0,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
        "freeze_vision_encoder": False,
        "train_expert_only": False,
        "tokenizer_max_length": spec.tokenizer_max_length,
    }


def _pi0_processor_files(cfg: dict[str, Any], tokenizer_name: str) -> dict[str, Any]:
    """policy_preprocessor.json / policy_postprocessor.json in LeRobot's π0 / π0.5 step order."""
    norm_map = cfg["normalization_mapping"]
    all_features = {**cfg["input_features"], **cfg["output_features"]}
    tokenize = {
        "registry_name": "tokenizer_processor",
        "config": {
            "max_length": cfg["tokenizer_max_length"],
            "task_key": "task",
            "padding_side": "right",
            "padding": "max_length",
            "truncation": True,
            "tokenizer_name": tokenizer_name,
        },
    }
    device = {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}}
    relative = {"registry_name": "relative_actions_processor", "config": {"enabled": False}}

    def normalize(index: int) -> dict[str, Any]:
        return {
            "registry_name": "normalizer_processor",
            "config": {"eps": 1e-8, "features": all_features, "norm_map": norm_map},
            "state_file": f"policy_preprocessor_step_{index}_normalizer_processor.safetensors",
        }

    head = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
    ]
    if cfg["type"] == "pi05":  # normalise, then write the state into the prompt, then tokenise
        state_step = {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}}
        steps = [*head, relative, normalize(3), state_step, tokenize, device]
    else:
        steps = [*head, {"registry_name": "pi0_new_line_processor", "config": {}}, tokenize, device, relative]
        steps.append(normalize(len(steps)))
    post = [
        {
            "registry_name": "unnormalizer_processor",
            "config": {"eps": 1e-8, "features": cfg["output_features"], "norm_map": norm_map},
            "state_file": "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
        },
        device,
    ]
    return {
        "policy_preprocessor.json": {"name": "policy_preprocessor", "steps": steps},
        "policy_postprocessor.json": {"name": "policy_postprocessor", "steps": post},
    }


def build_tiny_pi0(spec: TinyPI0Spec | None = None, **overrides: Any):
    """A random tiny ``PI0Pipeline`` (π0, or π0.5 with ``pi05=True``; float32, CPU) for ``spec`` (fields can also
    be given as keywords)."""
    from mmrl.adapters.vla.lerobot.checkpoint import PI0_UNUSED_TENSORS, _spec
    from mmrl.adapters.vla.lerobot.pi0 import SIGLIP_HEADS, PI0Config, PI0Model
    from mmrl.adapters.vla.lerobot.pi05 import PI05Model
    from mmrl.adapters.vla.lerobot.pipeline import PI0Pipeline
    from mmrl.adapters.vla.lerobot.processing import TokenizerSettings

    spec = spec or TinyPI0Spec()
    for key, value in overrides.items():
        setattr(spec, key, value)
    if spec.pi05:  # "Task: ..., State: <bins>;\nAction: " must fit
        spec.tokenizer_max_length = max(spec.tokenizer_max_length, 48 + 4 * spec.state_dim)
    torch.manual_seed(spec.seed)
    tokenizer = gemma_byte_tokenizer()
    cfg = _pi0_lerobot_config(spec)
    head_dim, heads, expert_width = 8, 8, spec.width // 2
    patch = 8
    config = PI0Config(
        vision_config={  # what checkpoint._pi0_config reads back from the tensors
            "hidden_size": 2 * SIGLIP_HEADS,
            "intermediate_size": 4 * SIGLIP_HEADS,
            "num_hidden_layers": 2,
            "num_attention_heads": SIGLIP_HEADS,
            "num_channels": 3,
            "patch_size": patch,
            "image_size": spec.image_size,
            "layer_norm_eps": 1e-6,
            "hidden_act": "gelu_pytorch_tanh",
            "vision_use_head": False,
        },
        vocab_size=len(tokenizer),
        width=spec.width,
        depth=spec.depth,
        intermediate=2 * spec.width,
        num_heads=heads,
        num_kv_heads=1,
        head_dim=head_dim,
        expert_width=expert_width,
        expert_intermediate=2 * expert_width,
        chunk_size=spec.chunk_size,
        max_state_dim=spec.max_state_dim,
        max_action_dim=spec.max_action_dim,
        num_steps=spec.num_steps,
        image_size=spec.image_size,
    )
    model = (PI05Model if spec.pi05 else PI0Model)(config)
    _init_weights(model, skip=("vision_tower.",), norm_value=0.0)  # Gemma's RMSNorm scales by 1 + w
    features = {key: ft["type"] for key, ft in {**cfg["input_features"], **cfg["output_features"]}.items()}
    normalizer, unnormalizer = _normalizers(
        features, cfg["normalization_mapping"], spec.state_dim, spec.action_dim, spec.stats
    )
    tokenizer_name = f"./{PI0_TOKENIZER_DIR}"
    settings = TokenizerSettings(
        tokenizer_name,
        max_length=spec.tokenizer_max_length,
        padding="max_length",
        add_newline=not spec.pi05,
        state_in_prompt=spec.pi05,
    )
    pipe_spec = _spec(cfg)
    pipe_spec.centre_pad = True
    pipe_spec.image_size = (spec.image_size, spec.image_size)
    lm_head, lm_norm, expert_head = PI0_UNUSED_TENSORS  # LeRobot saves them; no output reads them
    pipeline = PI0Pipeline(
        model,
        pipe_spec,
        normalizer,
        unnormalizer,
        tokenizer,
        settings,
        lerobot_config=cfg,
        unused_tensors={
            lm_head: 0.02 * torch.randn(len(tokenizer), spec.width),
            lm_norm: torch.zeros(spec.width),
            expert_head: 0.02 * torch.randn(len(tokenizer), expert_width),
        },
        processor_files=_pi0_processor_files(cfg, tokenizer_name),
    )
    return pipeline.eval()
