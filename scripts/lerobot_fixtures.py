"""Write tiny LeRobot SmolVLA test fixtures with LeRobot's own code (run in the LeRobot reference venv).

This script must run with the reference environment's interpreter, never mmrl's (it does not import mmrl)::

    /work/lerobot-venv/bin/python scripts/lerobot_fixtures.py            # (re)write the fixture
    /work/lerobot-venv/bin/python scripts/lerobot_fixtures.py --check    # compare LeRobot with the committed outputs
    /work/lerobot-venv/bin/python scripts/lerobot_fixtures.py --roundtrip DIR
        # DIR written by `python -m mmrl.adapters.vla.lerobot.roundtrip DIR` (mmrl's venv): LeRobot loads it and
        # its actions on the fixture's inputs are compared with mmrl's (DIR/mmrl_outputs.safetensors)

See ../shared/lerobot-reference/README.md for how to build that environment (LeRobot 0.6.1, torch 2.11).

What it writes into ``tests/fixtures/lerobot/<variant>/`` for each variant of ``VARIANTS`` (``smolvla_tiny``: the
default design at tiny size; ``smolvla_tiny_skip``: the other code paths; ``pi0_tiny``: π0, see below):

- ``vlm/``: a tiny SmolVLM configuration, tokenizer (byte-level, no merges: 256 byte tokens plus SmolVLM's
  special tokens) and processor. SmolVLA reads its VLM config and processor from ``vlm_model_name`` even when it
  does not load VLM weights, so the policy's ``vlm_model_name`` points at this folder (a path relative to the
  repository root; the script changes directory there).
- ``config.json``, ``model.safetensors``: ``SmolVLAPolicy.save_pretrained`` of a policy built from that config with
  random weights (re-drawn at a scale that makes every weight matter to the output).
- ``policy_preprocessor.json``, ``policy_postprocessor.json`` and their ``*.safetensors`` state files (the
  normalisation statistics): ``make_smolvla_pre_post_processors(...).save_pretrained``.
- ``reference.safetensors`` + ``reference.json``: fixed raw inputs (two camera images in [0, 1] of a
  non-square size, robot state, task strings), a fixed initial noise, LeRobot's action chunk from
  ``predict_action_chunk(batch, noise=...)`` (model space and after the post-processor), and its
  flow-matching training loss on fixed (actions, noise, time), together with the pre-processed tensors
  (token ids, masks, normalised state and actions) for debugging.

``pi0_tiny`` (LeRobot's ``pi0`` policy: PaliGemma = SigLIP + Gemma prefix, a Gemma action expert sharing every
attention layer) holds the same files, with ``tokenizer/`` instead of ``vlm/``: a tiny Gemma-like tokenizer (``<pad>``,
``<eos>``, ``<bos>``, ``<unk>`` then 256 byte tokens, ``<bos>`` prepended) that the pre-processor's
``tokenizer_name`` points at (LeRobot hard-codes ``google/paligemma-3b-pt-224`` there). LeRobot's π0 also hard-codes
the Gemma sizes (only the names ``gemma_2b``/``gemma_300m``), the vocabulary (257152), the SigLIP width/depth and the
projector width (2048): ``_tiny_pi0_sizes`` patches those names in the reference interpreter while the policy is
built or loaded (site-packages stay untouched). It keeps 8 query heads and 1 key/value head per Gemma layer (the
joint-attention reshape in LeRobot assumes 8) and SigLIP's 16 heads. Its reference file also holds LeRobot's
pre-processed camera images (``image_preprocessed.<camera>``, in [-1, 1]). ``pi05_tiny`` is the same for LeRobot's
``pi05`` (adaRMS time conditioning in the expert, the discretised state in the prompt).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES_REL = Path("tests/fixtures/lerobot")
TASKS = ["pick up the black bowl and place it on the plate", "open the drawer"]
SEED = 1234

VARIANTS: dict[str, dict] = {
    # The default SmolVLA design at tiny size: LIBERO's two cameras (agentview + wrist, as LeRobot names them),
    # non-square frames (resize-with-padding pads), 4 VLM layers alternating self/cross attention, MEAN_STD.
    "smolvla_tiny": {
        "cameras": ("observation.images.image", "observation.images.image2"),
        "image_shape": (3, 24, 40),
        "state_dim": 8,
        "action_dim": 7,
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
        "text": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 6,  # SmolVLA keeps only the first num_vlm_layers of these
        },
        "policy": {
            "chunk_size": 5,
            "n_action_steps": 5,
            "max_state_dim": 16,
            "max_action_dim": 12,
            "resize_imgs_with_padding": (32, 32),
            "tokenizer_max_length": 48,
            "num_steps": 10,
            "num_vlm_layers": 4,
            "num_expert_layers": -1,
            "self_attn_every_n_layers": 2,
            "expert_width_multiplier": 0.75,
        },
        "norm": {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    },
    # The other code paths: fewer expert layers than VLM layers (the expert runs at VLM layers 0, 2, 4: self-,
    # cross- and self-attention; LeRobot's cached sampling fails when a self-attention layer has no expert layer,
    # so the layouts it can run are these), one real camera plus an empty one, small square frames (upscaled),
    # a fixed prefix length (padding), truncated prompts, MIN_MAX state and QUANTILES action statistics.
    "smolvla_tiny_skip": {
        "cameras": ("observation.images.image",),
        "image_shape": (3, 20, 20),
        "state_dim": 6,
        "action_dim": 4,
        "vision": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
        "text": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "num_hidden_layers": 8,
        },
        "policy": {
            "chunk_size": 4,
            "n_action_steps": 4,
            "max_state_dim": 10,
            "max_action_dim": 8,
            "resize_imgs_with_padding": (32, 32),
            "tokenizer_max_length": 16,
            "num_steps": 4,
            "num_vlm_layers": 6,
            "num_expert_layers": 3,
            "self_attn_every_n_layers": 4,
            "expert_width_multiplier": 0.5,
            "empty_cameras": 1,
            "prefix_length": 40,
        },
        "norm": {"STATE": "MIN_MAX", "ACTION": "QUANTILES"},
    },
}

# π0 at tiny size: LIBERO's two cameras, non-square frames (centred resize-with-padding), LeRobot's defaults otherwise
# (MEAN_STD, tokenizer_max_length 48 with "max_length" padding: the first task is truncated, the second padded).
# "paligemma"/"expert" replace LeRobot's gemma_2b/gemma_300m sizes; "vision" SigLIP So400m's (16 heads kept).
VARIANTS["pi0_tiny"] = {
    "policy_type": "pi0",
    "cameras": ("observation.images.image", "observation.images.image2"),
    "image_shape": (3, 24, 40),
    "state_dim": 8,
    "action_dim": 7,
    "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "patch_size": 8},
    "paligemma": {"width": 64, "depth": 3, "mlp_dim": 128, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
    "expert": {"width": 32, "depth": 3, "mlp_dim": 64, "num_heads": 8, "num_kv_heads": 1, "head_dim": 8},
    "policy": {
        "chunk_size": 6,
        "n_action_steps": 6,
        "max_state_dim": 16,
        "max_action_dim": 12,
        "image_resolution": (32, 32),
        "tokenizer_max_length": 48,
        "num_inference_steps": 10,
    },
    "norm": {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
}

# π0.5 at tiny size, same sizes as pi0_tiny: adaRMS time conditioning in the expert, the QUANTILES-normalised state
# discretised into the prompt ("Task: ..., State: ...;\nAction: "), portrait frames (padding left and right).
VARIANTS["pi05_tiny"] = {
    **VARIANTS["pi0_tiny"],
    "policy_type": "pi05",
    "image_shape": (3, 40, 24),
    "policy": {**VARIANTS["pi0_tiny"]["policy"], "tokenizer_max_length": 120},
    "norm": {"STATE": "QUANTILES", "ACTION": "QUANTILES"},
}

PI0_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")
"""The tiny π0 tokenizer's first ids, in Gemma's order (pad 0, eos 1, bos 2, unk 3)."""


def _policy_type(name: str) -> str:
    return VARIANTS[name].get("policy_type", "smolvla")


SPECIAL_TOKENS = {
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
    "end_of_utterance_token": "<end_of_utterance>",
}


def _byte_level_tokenizer():
    """A tiny byte-level BPE tokenizer (no merges) with SmolVLM's special tokens, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        extra_special_tokens=dict(SPECIAL_TOKENS),
    )
    return tokenizer


def build_tiny_vlm(folder: Path, variant: dict) -> None:
    """Write a tiny SmolVLM config, tokenizer and processor into ``folder`` (no weights)."""
    from transformers import SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    tokenizer = _byte_level_tokenizer()
    vocab_size = len(tokenizer)
    config = SmolVLMConfig(
        vision_config={
            **variant["vision"],
            "image_size": 32,
            "patch_size": 8,
            "num_channels": 3,
        },
        text_config={
            "model_type": "llama",
            "vocab_size": vocab_size,
            **variant["text"],
            "head_dim": 16,
            "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0,
            "max_position_embeddings": 512,
            "pad_token_id": tokenizer.pad_token_id,
        },
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS["image_token"]),
        tie_word_embeddings=False,
    )
    image_seq_len = (32 // 8) ** 2 // (2**2)
    image_processor = SmolVLMImageProcessor(
        size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False
    )
    video_processor = SmolVLMVideoProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32})
    processor = SmolVLMProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        image_seq_len=image_seq_len,
    )
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    processor.save_pretrained(folder)


def policy_config(name: str):
    """The tiny SmolVLA config of variant ``name`` (its VLM folder is ``tests/fixtures/lerobot/<name>/vlm``)."""
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

    variant = VARIANTS[name]
    inputs = {cam: PolicyFeature(type=FeatureType.VISUAL, shape=variant["image_shape"]) for cam in variant["cameras"]}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(variant["state_dim"],))
    norm = {"VISUAL": NormalizationMode.IDENTITY, **{k: NormalizationMode(v) for k, v in variant["norm"].items()}}
    return SmolVLAConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(variant["action_dim"],))},
        normalization_mapping=norm,
        vlm_model_name=str(FIXTURES_REL / name / "vlm"),
        load_vlm_weights=False,
        device="cpu",
        push_to_hub=False,
        **variant["policy"],
    )


def dataset_stats(name: str) -> dict[str, dict[str, torch.Tensor]]:
    """Fixed normalisation statistics for the state and the action (visual features are not normalised)."""
    variant = VARIANTS[name]
    state_dim, action_dim = variant["state_dim"], variant["action_dim"]
    gen = torch.Generator().manual_seed(SEED + 1)
    stats = {
        "observation.state": {
            "mean": torch.randn(state_dim, generator=gen),
            "std": torch.rand(state_dim, generator=gen) + 0.5,
            "min": -torch.ones(state_dim) * 3,
            "max": torch.ones(state_dim) * 3,
        },
        "action": {
            "mean": torch.randn(action_dim, generator=gen) * 0.3,
            "std": torch.rand(action_dim, generator=gen) + 0.5,
            "min": -torch.ones(action_dim) * 2,
            "max": torch.ones(action_dim) * 2,
        },
    }
    for key, dim in (("observation.state", state_dim), ("action", action_dim)):
        stats[key]["q01"] = -torch.rand(dim, generator=gen) - 1.0
        stats[key]["q99"] = torch.rand(dim, generator=gen) + 1.0
    stats["observation.state"]["max"][0] = -3.0  # a zero range: the eps substitute of the range modes
    return stats


def _redraw_weights(policy: torch.nn.Module) -> None:
    """Re-draw every parameter at a scale where each one changes the output (the default init is ~0.02)."""
    gen = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if ".dense." in name:  # π0.5's adaRMS modulation (scale, shift, gate): keep 1 + scale near 1
                fan_in = param.shape[-1] if param.ndim >= 2 else 1
                param.copy_((0.5 / fan_in**0.5) * torch.randn(param.shape, generator=gen))
            elif name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name:
                if name.endswith(".bias"):
                    param.copy_(0.1 * torch.randn(param.shape, generator=gen))
                else:
                    param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=gen))
            elif param.ndim >= 2:
                fan_in = param[0].numel() if "embed" not in name else 1
                scale = 1.0 / (fan_in**0.5)
                param.copy_(scale * torch.randn(param.shape, generator=gen))
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))


def fixed_inputs(name: str) -> dict[str, torch.Tensor]:
    """Raw inputs (images in [0, 1], state, actions) plus the fixed noise and time, all float32."""
    variant, policy = VARIANTS[name], VARIANTS[name]["policy"]
    gen = torch.Generator().manual_seed(SEED + 3)
    batch = len(TASKS)
    chunk, max_action = policy["chunk_size"], policy["max_action_dim"]
    inputs = {cam: torch.rand(batch, *variant["image_shape"], generator=gen) for cam in variant["cameras"]}
    inputs["observation.state"] = torch.randn(batch, variant["state_dim"], generator=gen)
    inputs["noise"] = torch.randn(batch, chunk, max_action, generator=gen)
    inputs["train_actions"] = torch.randn(batch, chunk, variant["action_dim"], generator=gen)
    inputs["train_noise"] = torch.randn(batch, chunk, max_action, generator=gen)
    inputs["train_time"] = torch.tensor([0.83, 0.27])
    return inputs


def run_reference(folder: Path, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Load ``folder`` with LeRobot (policy + processors) and compute the action chunk and the loss."""
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    policy = SmolVLAPolicy.from_pretrained(str(folder))
    policy.eval()
    pre = PolicyProcessorPipeline.from_pretrained(str(folder), config_filename="policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(
        str(folder),
        config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    cameras = [key for key in inputs if key.startswith("observation.images.")]
    obs = {key: inputs[key].clone() for key in (*cameras, "observation.state")}
    obs["task"] = list(TASKS)
    batch = pre(obs)
    with torch.no_grad():
        chunk = policy.predict_action_chunk(dict(batch), noise=inputs["noise"].clone())
        actions = post(chunk.clone())

    train = {key: inputs[key].clone() for key in (*cameras, "observation.state")}
    train["task"] = list(TASKS)
    train["action"] = inputs["train_actions"].clone()
    train_batch = pre(train)
    policy.train()
    with torch.no_grad():
        loss, _ = policy.forward(
            dict(train_batch), noise=inputs["train_noise"].clone(), time=inputs["train_time"].clone()
        )
        per_sample, _ = policy.forward(
            dict(train_batch),
            noise=inputs["train_noise"].clone(),
            time=inputs["train_time"].clone(),
            reduction="none",
        )
    policy.eval()
    return {
        "lang_tokens": batch["observation.language.tokens"],
        "lang_mask": batch["observation.language.attention_mask"].to(torch.int64),
        "state_normalized": batch["observation.state"],
        "train_actions_normalized": train_batch["action"],
        "action_chunk_normalized": chunk,
        "action_chunk": actions,
        "loss": loss.reshape(()),
        "loss_per_sample": per_sample,
    }


# ---------------------------------------------------------------------------------------------- π0


def _pi0_tokenizer():
    """A tiny Gemma-like tokenizer: Gemma's four special tokens, 256 byte tokens (no merges), ``<bos>`` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(PI0_SPECIAL_TOKENS)}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


class _tiny_pi0_sizes:  # noqa: N801 - used as a context manager
    """Patch LeRobot's hard-coded π0 / π0.5 sizes (Gemma variants, vocabulary, SigLIP, projector, tokenizer) for ``name``.

    Only names in ``lerobot.policies.pi0``'s (``pi05``'s) modules are replaced, for the duration of the ``with`` block: the Gemma
    variant table, the two model classes (their configs are resized before they are built) and the tokenizer step
    (pointed at the fixture's local tokenizer folder).
    """

    def __init__(self, name: str) -> None:
        self.variant = VARIANTS[name]
        self.tokenizer_path = str(FIXTURES_REL / name / "tokenizer")
        self.saved: list[tuple[object, str, object]] = []

    def _set(self, module, attr: str, value) -> None:
        self.saved.append((module, attr, getattr(module, attr)))
        setattr(module, attr, value)

    def __enter__(self):
        import importlib

        kind = self.variant["policy_type"]
        modeling_pi0 = importlib.import_module(f"lerobot.policies.{kind}.modeling_{kind}")
        processor_pi0 = importlib.import_module(f"lerobot.policies.{kind}.processor_{kind}")

        variant, tokenizer_path = self.variant, self.tokenizer_path
        vocab = len(PI0_SPECIAL_TOKENS) + 256
        sizes = {"gemma_2b": variant["paligemma"], "gemma_300m": variant["expert"]}
        paligemma_cls = modeling_pi0.PaliGemmaForConditionalGenerationWithPiGemma
        expert_cls = modeling_pi0.PiGemmaForCausalLM
        tokenizer_step = processor_pi0.TokenizerProcessorStep

        def gemma_config(name: str):
            return modeling_pi0.GemmaConfig(**sizes[name])

        def paligemma(config):
            vision = variant["vision"]
            config.vocab_size = config.text_config.vocab_size = vocab
            config.image_token_index = vocab - 1
            config.projection_dim = config.vision_config.projection_dim = config.text_config.hidden_size
            for key, value in vision.items():
                setattr(config.vision_config, key, value)
            return paligemma_cls(config=config)

        def expert(config):
            config.vocab_size = vocab
            return expert_cls(config=config)

        def tokenizer(**kwargs):
            return tokenizer_step(**{**kwargs, "tokenizer_name": tokenizer_path})

        self._set(modeling_pi0, "get_gemma_config", gemma_config)
        self._set(modeling_pi0, "PaliGemmaForConditionalGenerationWithPiGemma", paligemma)
        self._set(modeling_pi0, "PiGemmaForCausalLM", expert)
        self._set(processor_pi0, "TokenizerProcessorStep", tokenizer)
        return self

    def __exit__(self, *exc) -> None:
        for module, attr, value in reversed(self.saved):
            setattr(module, attr, value)
        self.saved.clear()


def pi0_policy_config(name: str):
    """The tiny π0 / π0.5 config of variant ``name`` (sizes beyond LeRobot's fields come from ``_tiny_pi0_sizes``)."""
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    from lerobot.policies.pi05.configuration_pi05 import PI05Config

    variant = VARIANTS[name]
    config_class = PI05Config if variant["policy_type"] == "pi05" else PI0Config
    inputs = {cam: PolicyFeature(type=FeatureType.VISUAL, shape=variant["image_shape"]) for cam in variant["cameras"]}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(variant["state_dim"],))
    norm = {"VISUAL": NormalizationMode.IDENTITY, **{k: NormalizationMode(v) for k, v in variant["norm"].items()}}
    return config_class(
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(variant["action_dim"],))},
        normalization_mapping=norm,
        device="cpu",
        push_to_hub=False,
        dtype="float32",
        **variant["policy"],
    )


def run_reference_pi0(folder: Path, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``run_reference`` for π0 and π0.5: LeRobot's ``forward`` draws its own noise and time, so the policy's samplers are
    replaced by the fixed ``train_noise`` / ``train_time`` for the loss."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    kind = json.loads((folder / "config.json").read_text()).get("type")
    policy = (PI05Policy if kind == "pi05" else PI0Policy).from_pretrained(str(folder))
    policy.eval()
    pre = PolicyProcessorPipeline.from_pretrained(str(folder), config_filename="policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(
        str(folder),
        config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    cameras = [key for key in inputs if key.startswith("observation.images.")]
    obs = {key: inputs[key].clone() for key in (*cameras, "observation.state")}
    obs["task"] = list(TASKS)
    batch = pre(obs)
    with torch.no_grad():
        images, _ = policy._preprocess_images(dict(batch))
        chunk = policy.predict_action_chunk(dict(batch), noise=inputs["noise"].clone())
        actions = post(chunk.clone())

    train = {key: inputs[key].clone() for key in (*cameras, "observation.state")}
    train["task"] = list(TASKS)
    train["action"] = inputs["train_actions"].clone()
    train_batch = pre(train)
    policy.model.sample_noise = lambda shape, device: inputs["train_noise"].clone().to(device)
    policy.model.sample_time = lambda bsize, device: inputs["train_time"].clone().to(device)
    policy.train()
    with torch.no_grad():
        loss, _ = policy.forward(dict(train_batch))
        per_sample, _ = policy.forward(dict(train_batch), reduction="none")
    policy.eval()
    out = {
        "lang_tokens": batch["observation.language.tokens"],
        "lang_mask": batch["observation.language.attention_mask"].to(torch.int64),
        "state_normalized": batch["observation.state"],
        "train_actions_normalized": train_batch["action"],
        "action_chunk_normalized": chunk,
        "action_chunk": actions,
        "loss": loss.reshape(()),
        "loss_per_sample": per_sample,
    }
    out.update({f"image_preprocessed.{cam}": img for cam, img in zip(cameras, images, strict=True)})
    return out


def write_pi0_fixture(name: str) -> None:
    """Build variant ``name``'s tokenizer folder and tiny π0 / π0.5 policy, save both with LeRobot, write the reference."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from lerobot.policies.pi0.processor_pi0 import make_pi0_pre_post_processors
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy
    from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors

    pi05 = VARIANTS[name]["policy_type"] == "pi05"
    policy_class = PI05Policy if pi05 else PI0Policy
    make_processors = make_pi05_pre_post_processors if pi05 else make_pi0_pre_post_processors
    folder = REPO_ROOT / FIXTURES_REL / name
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    _pi0_tokenizer().save_pretrained(str(folder / "tokenizer"))
    with _tiny_pi0_sizes(name):
        torch.manual_seed(SEED)
        config = pi0_policy_config(name)
        policy = policy_class(config)
        _redraw_weights(policy)
        policy.save_pretrained(str(folder))
        pre, post = make_processors(config, dataset_stats(name))
        pre.save_pretrained(str(folder))
        post.save_pretrained(str(folder))
        inputs = fixed_inputs(name)
        outputs = run_reference_pi0(folder, inputs)
    _write_reference(folder, name, inputs, outputs)


def _run_reference_any(folder: Path, name: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LeRobot's outputs for the policy in ``folder`` (its config.json's type), sizes patched for variant ``name``."""
    kind = json.loads((folder / "config.json").read_text()).get("type")
    if kind in ("pi0", "pi05"):
        with _tiny_pi0_sizes(name):
            return run_reference_pi0(folder, inputs)
    return run_reference(folder, inputs)


def _write_reference(folder: Path, name: str, inputs: dict, outputs: dict) -> None:
    from safetensors.torch import save_file

    tensors = {**inputs, **outputs}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "reference.safetensors"))
    meta = {
        "lerobot_version": _lerobot_version(),
        "torch_version": torch.__version__,
        "variant": name,
        "tasks": TASKS,
        "cameras": list(VARIANTS[name]["cameras"]),
        "loss": float(outputs["loss"]),
        "note": "written by scripts/lerobot_fixtures.py in the LeRobot reference environment",
    }
    (folder / "reference.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {folder} ({_folder_size(folder) / 1e6:.2f} MB), loss {float(outputs['loss']):.6f}")


def write_fixture(name: str) -> None:
    """Build variant ``name``'s tiny VLM folder and policy, save both with LeRobot, then write the reference outputs."""
    if _policy_type(name) in ("pi0", "pi05"):
        write_pi0_fixture(name)
        return
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    from lerobot.policies.smolvla.processor_smolvla import make_smolvla_pre_post_processors

    folder = REPO_ROOT / FIXTURES_REL / name
    build_tiny_vlm(folder / "vlm", VARIANTS[name])
    torch.manual_seed(SEED)
    config = policy_config(name)
    policy = SmolVLAPolicy(config)
    _redraw_weights(policy)
    policy.save_pretrained(str(folder))
    pre, post = make_smolvla_pre_post_processors(config, dataset_stats(name))
    pre.save_pretrained(str(folder))
    post.save_pretrained(str(folder))

    inputs = fixed_inputs(name)
    outputs = run_reference(folder, inputs)
    _write_reference(folder, name, inputs, outputs)


def check_fixture(folder: Path) -> float:
    """Recompute LeRobot's outputs for the committed fixture and print the max abs difference to the stored ones."""
    from safetensors.torch import load_file

    ref = load_file(str(folder / "reference.safetensors"))
    outputs = _run_reference_any(folder, folder.name, ref)
    print(f"--- {folder.name}")
    return _compare(outputs, ref, ("action_chunk_normalized", "action_chunk", "loss", "loss_per_sample"))


def check_roundtrip(saved: Path, fixture: Path) -> float:
    """Load ``saved`` (written by mmrl) with LeRobot; compare its actions on the fixture's inputs with mmrl's.

    mmrl's outputs are ``saved/mmrl_outputs.safetensors`` (``python -m mmrl.adapters.vla.lerobot.roundtrip``).
    """
    from safetensors.torch import load_file

    inputs = load_file(str(fixture / "reference.safetensors"))
    expected = load_file(str(saved / "mmrl_outputs.safetensors"))
    outputs = _run_reference_any(saved, fixture.name, inputs)
    moved = (outputs["action_chunk"] - inputs["action_chunk"]).abs().max().item()
    print(f"LeRobot's actions of the saved policy differ from the fixture's original ones by up to {moved:.4g}")
    return _compare(outputs, expected, ("action_chunk_normalized", "action_chunk"))


def _compare(outputs: dict, expected: dict, keys) -> float:
    worst = 0.0
    for key in keys:
        diff = (outputs[key] - expected[key]).abs().max().item()
        worst = max(worst, diff)
        print(f"{key}: max abs diff {diff:.3g}")
    return worst


def _lerobot_version() -> str:
    from importlib.metadata import version

    return version("lerobot")


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="recompute LeRobot's outputs for the committed fixtures")
    parser.add_argument("--roundtrip", type=Path, help="a folder saved by mmrl: load it with LeRobot and compare")
    one = "one fixture only (default: all of them; for --roundtrip: smolvla_tiny)"
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=one)
    args = parser.parse_args(argv)
    os.chdir(REPO_ROOT)  # the policies' vlm_model_name is relative to the repository root
    torch.set_num_threads(1)
    names = [args.variant] if args.variant else list(VARIANTS)
    if args.roundtrip is not None:
        fixture = REPO_ROOT / FIXTURES_REL / (args.variant or "smolvla_tiny")
        worst = check_roundtrip(args.roundtrip.resolve(), fixture)
        print(f"round trip: LeRobot on mmrl's saved folder vs mmrl, worst max abs diff {worst:.3g}")
        return 0 if worst < 1e-4 else 1
    if args.check:
        worst = max(check_fixture(REPO_ROOT / FIXTURES_REL / name) for name in names)
        return 0 if worst < 1e-6 else 1
    for name in names:
        write_fixture(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
