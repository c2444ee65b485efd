"""Write tiny LeRobot SmolVLA test fixtures with LeRobot's own code (run in the LeRobot reference venv).

This script must run with the reference environment's interpreter, never mmrl's (it does not import mmrl)::

    /work/lerobot-venv/bin/python scripts/lerobot_fixtures.py            # (re)write the fixture
    /work/lerobot-venv/bin/python scripts/lerobot_fixtures.py --check    # compare LeRobot with the committed outputs
    /work/lerobot-venv/bin/python scripts/lerobot_fixtures.py --roundtrip DIR
        # DIR written by `python -m mmrl.adapters.vla.lerobot.roundtrip DIR` (mmrl's venv): LeRobot loads it and
        # its actions on the fixture's inputs are compared with mmrl's (DIR/mmrl_outputs.safetensors)

See ../shared/lerobot-reference/README.md for how to build that environment (LeRobot 0.6.1, torch 2.11).

What it writes into ``tests/fixtures/lerobot/<variant>/`` for each variant of ``VARIANTS`` (``smolvla_tiny``: the
default design at tiny size; ``smolvla_tiny_skip``: the other code paths):

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
            if name.endswith("norm.weight") or "layernorm" in name or "layer_norm" in name:
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


def write_fixture(name: str) -> None:
    """Build variant ``name``'s tiny VLM folder and policy, save both with LeRobot, then write the reference outputs."""
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
    from lerobot.policies.smolvla.processor_smolvla import make_smolvla_pre_post_processors
    from safetensors.torch import save_file

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


def check_fixture(folder: Path) -> float:
    """Recompute LeRobot's outputs for the committed fixture and print the max abs difference to the stored ones."""
    from safetensors.torch import load_file

    ref = load_file(str(folder / "reference.safetensors"))
    outputs = run_reference(folder, ref)
    return _compare(outputs, ref, ("action_chunk_normalized", "action_chunk", "loss", "loss_per_sample"))


def check_roundtrip(saved: Path, fixture: Path) -> float:
    """Load ``saved`` (written by mmrl) with LeRobot; compare its actions on the fixture's inputs with mmrl's.

    mmrl's outputs are ``saved/mmrl_outputs.safetensors`` (``python -m mmrl.adapters.vla.lerobot.roundtrip``).
    """
    from safetensors.torch import load_file

    inputs = load_file(str(fixture / "reference.safetensors"))
    expected = load_file(str(saved / "mmrl_outputs.safetensors"))
    outputs = run_reference(saved, inputs)
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
