"""Sizes of LeRobot's flow VLAs (``model.architecture=smolvla|pi0|pi05``) for ``mmrl plan``, without loading weights.

mmrl runs these policies with its own modules (:mod:`mmrl.adapters.vla.lerobot`: ``SmolVLAModel``, ``PI0Model``,
``PI05Model``); :class:`FlowVLAArch` holds the numbers that decide their memory and counts their parameters with
the layouts of those modules (:meth:`FlowVLAArch.param_groups`). The sizes come from, in order:

1. a local LeRobot folder (``config.json`` + ``model.safetensors``; also a hub id already in the local hub cache):
   the tensor shapes of the safetensors **header** (its first 8 + n bytes; no weight is read), as
   ``checkpoint._model_config`` / ``checkpoint._pi0_config`` read them when loading (:func:`arch_from_folder`);
2. the tiny presets (``tiny_smolvla`` / ``tiny_pi0`` / ``tiny_pi05``): the builders' constants in
   ``mmrl/adapters/vla/lerobot/tiny.py`` (:func:`tiny_arch`);
3. anything else (the presets' hub ids ``lerobot/pi0_base``, ``lerobot/pi05_base``, ``lerobot/smolvla_base``, a
   fine-tune's id that is not on this machine): the published architecture of the family, :data:`PUBLISHED`.

The published sizes (no network here: written from the papers and the published configs, as known to the author):

* π0 (Black et al., arXiv 2410.24164, §3 / App. B: "PaliGemma ... 3B" VLM + "a 300M parameter action expert",
  "3.3 billion parameters" in all) and π0.5 (arXiv 2504.16054, the same PaliGemma backbone and expert):

  - SigLIP So400m/14 at 224 px (google/paligemma-3b-pt-224 ``vision_config``: 27 layers, width 1152, MLP 4304,
    patch 14 -> 16 x 16 = 256 image tokens per camera, no pooling head) and PaliGemma's linear projector 1152 -> 2048;
  - Gemma 2B (PaliGemma ``text_config``: 18 layers, width 2048, MLP 16384, 8 query heads, 1 key/value head, head dim
    256, vocabulary 257152);
  - the action expert, Gemma-300M-style (LeRobot's ``action_expert_variant=gemma_300m``, openpi's ``gemma_300m``):
    18 layers, width 1024, MLP 4096, with the VLM's 8 heads / 1 key/value head / head dim 256 (joint attention
    needs the same heads);
  - LeRobot's ``PI0Config`` / ``PI05Config``: chunk_size 50, max_state_dim 32, max_action_dim 32,
    num_inference_steps 10, tokenizer_max_length 48 (π0) / 200 (π0.5, whose prompt also holds the state);
  - π0.5's expert norms are adaRMS (a ``Linear(1024, 3 x 1024)`` each, 2 per layer + the final one) and it has
    ``time_mlp_in`` / ``time_mlp_out`` (1024 -> 1024) instead of π0's state projection and action-time MLP.

* SmolVLA (Shukor et al., arXiv 2506.01844: "SmolVLA (0.45B)"; LeRobot's ``SmolVLAConfig`` and
  lerobot/smolvla_base): SmolVLM2-500M-Video-Instruct truncated to its first ``num_vlm_layers = 16`` text layers
  (SmolLM2-360M-style text model: width 960, MLP 2560, 15 query heads, 5 key/value heads, head dim 64, vocabulary
  49280), its SigLIP-B/16 vision encoder at 512 px (12 layers, width 768, MLP 3072, patch 16 -> 1024 patches) and
  pixel-shuffle connector (scale factor 4: 1024 / 16 = 64 image tokens per camera, ``Linear(768 x 16, 960)`` without
  bias); the expert has ``expert_width_multiplier = 0.75`` x 960 = 720 width, MLP 2048 (LeRobot's
  ``get_intermediate_size``: 4 x 720 x 2/3 rounded up to a multiple of 256), one layer per VLM layer
  (``num_expert_layers = -1``), joint self-attention every ``self_attn_every_n_layers = 2`` layers and cross-attention
  to the VLM's keys/values in the others; chunk_size 50, max_state_dim 32, max_action_dim 32, num_steps 10,
  tokenizer_max_length 48.

The published totals are checked in ``tests/trainer/test_planner_lerobot.py``: π0's model (what mmrl holds and trains,
the vision tower included) is within 2 % of 3.3B, SmolVLA's model + the VLM's LM head (the checkpoint, as the paper
counts it) within 1 % of 0.45B. The parameter formula itself is exact: it reproduces every tensor count of the four
LeRobot-written fixtures in ``tests/fixtures/lerobot/`` and of the tiny builds.

Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mmrl.planning.block_shapes import adapter_params, decoder_linear_shapes

__all__ = [
    "FAMILIES",
    "PUBLISHED",
    "FlowVLAArch",
    "VisionTower",
    "arch_from_folder",
    "published_arch",
    "read_safetensors_shapes",
    "resolve_flow_vla",
    "tiny_arch",
]

FAMILIES = ("smolvla", "pi0", "pi05")
"""``model.architecture`` values modelled here (= LeRobot config.json's ``type``)."""


@dataclass(frozen=True)
class VisionTower:
    """A SigLIP-style vision encoder (π0's SigLIP, SmolVLM's): Conv2d patch embedding (with bias), learned position
    embeddings, pre-norm blocks of LayerNorm (weight + bias) x 2, q/k/v/out projections with bias and a GELU MLP fc1 /
    fc2 with bias, a final ``post_layernorm``."""

    depth: int
    width: int
    intermediate: int
    patch: int
    image_size: int
    channels: int = 3

    @property
    def patches(self) -> int:
        """Patch tokens of one image: (image_size / patch)^2."""
        return (self.image_size // self.patch) ** 2

    def layer_params(self) -> int:
        w, f = self.width, self.intermediate
        return 4 * (w * w + w) + (w * f + f) + (f * w + w) + 4 * w

    def params(self) -> int:
        w = self.width
        embed = self.channels * self.patch * self.patch * w + w + self.patches * w
        return embed + self.depth * self.layer_params() + 2 * w


@dataclass(frozen=True)
class FlowVLAArch:
    """What the planner knows of a LeRobot flow VLA (mmrl's ``SmolVLAModel`` / ``PI0Model`` / ``PI05Model``).

    The VLM's language model has ``layers`` Llama- (SmolVLA) or Gemma-style (π0) blocks of width ``width``; the expert
    ``expert_layers`` blocks of width ``expert_width`` with the VLM's query heads (``heads x head_dim``) and key/value
    heads; SmolVLA's ``expert_cross`` of them cross-attend to the VLM's cached keys/values (their k/v projections read
    ``kv_heads x head_dim``), the others attend jointly to the prefix and the chunk."""

    family: str  # smolvla | pi0 | pi05
    vision: VisionTower
    connector_in: int  # input width of the projector (π0: the vision width; SmolVLA: width x scale^2 after the shuffle)
    tokens_per_image: int  # prefix tokens of one camera (π0: the patches; SmolVLA: patches / scale^2)
    vocab: int
    width: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    expert_width: int
    expert_layers: int
    expert_intermediate: int
    expert_cross: int = 0  # SmolVLA: expert layers that cross-attend (k/v projections from kv_heads x head_dim)
    attention_bias: bool = False  # SmolVLA: q/k/v/o biases in the text and expert blocks
    mlp_bias: bool = False  # SmolVLA: gate/up/down biases
    chunk: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_steps: int = 10
    tokenizer_max_length: int = 48
    cameras: int = 0  # image features of the checkpoint (+ LeRobot's empty cameras); 0: the task's cameras
    prefix_length: int = -1  # SmolVLA: the prefix is padded to this many tokens when shorter (-1: no padding)
    unused: int = 0  # checkpoint tensors no output reads (the VLM's LM head and final norm, π0's expert LM head)
    source: str = ""
    published_params: int | None = None

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def suffix_tokens(self) -> int:
        """Expert tokens of one denoising pass: the chunk (+ π0's state token)."""
        return self.chunk + (1 if self.family == "pi0" else 0)

    def prefix_tokens(self, images: int, image_tokens: int, text_tokens: int) -> int:
        """Prefix tokens of one observation: ``images x image_tokens + text_tokens`` + SmolVLA's state token, padded
        up to ``prefix_length`` (SmolVLA's, when set)."""
        return max(images * image_tokens + text_tokens + self.state_tokens, self.prefix_length)

    @property
    def state_tokens(self) -> int:
        """Prefix tokens beyond the images and the prompt: SmolVLA's state token (π0: in the suffix; π0.5: in the
        prompt)."""
        return 1 if self.family == "smolvla" else 0

    # ------------------------------------------------------------------ parameters
    def vlm_layer_params(self) -> int:
        """One language-model block: q/k/v/o (+ biases), the gated MLP (+ biases), 2 RMSNorm weights."""
        h, q, kv, f = self.width, self.q_dim, self.kv_dim, self.intermediate
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv + h) if self.attention_bias else 0)
        mlp = 3 * h * f + ((2 * f + h) if self.mlp_bias else 0)
        return attn + mlp + 2 * h

    def expert_layer_params(self, cross: bool = False) -> int:
        """One expert block: q from W, k/v from W (joint) or from the VLM's kv_dim (cross), o back to W, the gated MLP,
        two norms (RMSNorm weights W each; π0.5's adaRMS ``Linear(W, 3W)`` each)."""
        w, q, kv, f = self.expert_width, self.q_dim, self.kv_dim, self.expert_intermediate
        kv_in = kv if cross else w
        attn = w * q + 2 * kv_in * kv + q * w + ((q + 2 * kv + w) if self.attention_bias else 0)
        mlp = 3 * w * f + ((2 * f + w) if self.mlp_bias else 0)
        return attn + mlp + 2 * self._norm_params()

    def _norm_params(self) -> int:
        w = self.expert_width
        return w * 3 * w + 3 * w if self.family == "pi05" else w

    def param_groups(self) -> dict[str, int]:
        """Parameters of the model mmrl holds, by module (the names of ``PI0Model`` / ``SmolVLAModel``):

        * ``vision``: the vision encoder (:meth:`VisionTower.params`);
        * ``connector``: π0's ``multi_modal_projector`` (connector_in x width + width), SmolVLA's
          ``connector.modality_projection.proj`` (connector_in x width, no bias);
        * ``embed_tokens``: vocab x width; ``vlm_layers``: layers x :meth:`vlm_layer_params`;
        * ``expert_layers``: the joint and cross blocks (:meth:`expert_layer_params`); ``expert_norm``: W (π0.5: 3W^2
          + 3W);
        * ``suffix``: action_in_proj A W + W, action_out_proj W A + A, and π0 / SmolVLA's action-time MLP (2W W + W,
          W W + W) and state projection (S -> W for π0, S -> width for SmolVLA), π0.5's time MLP (2 x (W W + W)).
        """
        w, a, s = self.expert_width, self.max_action_dim, self.max_state_dim
        connector = self.connector_in * self.width + (self.width if self.family != "smolvla" else 0)
        joint = self.expert_layers - self.expert_cross
        suffix = (a * w + w) + (w * a + a)
        if self.family == "pi05":
            suffix += 2 * (w * w + w)
        else:
            suffix += (2 * w * w + w) + (w * w + w)
            state_out = self.width if self.family == "smolvla" else w
            suffix += s * state_out + state_out
        return {
            "vision": self.vision.params(),
            "connector": connector,
            "embed_tokens": self.vocab * self.width,
            "vlm_layers": self.layers * self.vlm_layer_params(),
            "expert_layers": joint * self.expert_layer_params() + self.expert_cross * self.expert_layer_params(True),
            "expert_norm": self._norm_params(),
            "suffix": suffix,
        }

    def model_params(self) -> int:
        """Every parameter of mmrl's model (what a run holds on the device and, but a frozen vision tower, trains)."""
        return sum(self.param_groups().values())

    def linear_shapes(self, stack: str, *, cross: bool = False) -> dict[str, tuple[int, int]]:
        """``name -> (in, out)`` of the linears of one block of ``stack`` (``vlm_layers`` or ``expert_layers``; a cross
        expert block's k/v read the VLM's cached keys/values, ``kv_dim`` wide)."""
        w, f = (
            (self.width, self.intermediate) if stack == "vlm_layers" else (self.expert_width, self.expert_intermediate)
        )
        return decoder_linear_shapes(w, self.q_dim, self.kv_dim, f, kv_in=self.kv_dim if cross else None)

    def lora_blocks(self) -> list[tuple[str, bool]]:
        """``(stack, cross)`` of every block LoRA adapts (``model.lora.enabled=true``: the VLM's and the expert's)."""
        joint = self.expert_layers - self.expert_cross
        return (
            [("vlm_layers", False)] * self.layers
            + [("expert_layers", False)] * joint
            + [("expert_layers", True)] * self.expert_cross
        )

    def lora_params(self, targets: tuple[str, ...] | list[str], r: int) -> int:
        """Adapter parameters: ``r (in + out)`` for every targeted linear of every adapted block."""
        return sum(adapter_params(self.linear_shapes(s, cross=c), targets, r) for s, c in self.lora_blocks())

    def lora_frozen_params(self) -> int:
        """What LoRA freezes besides the vision encoder (:data:`mmrl.adapters.vla.lerobot.lora.FROZEN_WITH_LORA`): the
        token embeddings, the VLM's and the expert's blocks and the expert's final norm."""
        g = self.param_groups()
        return g["embed_tokens"] + g["vlm_layers"] + g["expert_layers"] + g["expert_norm"]

    def vision_params(self) -> int:
        """The modules ``model.freeze_vision_tower`` freezes: the vision encoder and its projector."""
        g = self.param_groups()
        return g["vision"] + g["connector"]

    def checkpoint_params(self) -> int:
        """The model + the tensors LeRobot saves that no output reads (kept on the CPU by the pipeline)."""
        return self.model_params() + self.unused

    def default_unused(self) -> int:
        """LeRobot's unused tensors for these sizes: the VLM's LM head (vocab x width) and final norm, and π0's
        expert LM head (vocab x W)."""
        extra = self.vocab * self.expert_width if self.family in ("pi0", "pi05") else 0
        return self.vocab * self.width + self.width + extra


# ============================================================================ published sizes

_SIGLIP_SO400M_224 = VisionTower(depth=27, width=1152, intermediate=4304, patch=14, image_size=224)
_SIGLIP_B16_512 = VisionTower(depth=12, width=768, intermediate=3072, patch=16, image_size=512)


def _pi0_published(family: str) -> FlowVLAArch:
    arch = FlowVLAArch(
        family=family,
        vision=_SIGLIP_SO400M_224,
        connector_in=1152,
        tokens_per_image=256,
        vocab=257_152,
        width=2048,
        layers=18,
        intermediate=16_384,
        heads=8,
        kv_heads=1,
        head_dim=256,
        expert_width=1024,
        expert_layers=18,
        expert_intermediate=4096,
        tokenizer_max_length=48 if family == "pi0" else 200,
        source=(
            f"published {'π0' if family == 'pi0' else 'π0.5'} sizes (PaliGemma 3B: SigLIP So400m/14 @224 + Gemma 2B; "
            "Gemma-300M-style expert; mmrl/planning/lerobot.py)"
        ),
        published_params=3_300_000_000 if family == "pi0" else None,
    )
    return replace(arch, unused=arch.default_unused())


def _smolvla_published() -> FlowVLAArch:
    arch = FlowVLAArch(
        family="smolvla",
        vision=_SIGLIP_B16_512,
        connector_in=768 * 16,
        tokens_per_image=64,
        vocab=49_280,
        width=960,
        layers=16,
        intermediate=2560,
        heads=15,
        kv_heads=5,
        head_dim=64,
        expert_width=720,
        expert_layers=16,
        expert_intermediate=2048,
        expert_cross=8,
        tokenizer_max_length=48,
        source="published SmolVLA sizes (SmolVLM2-500M truncated to 16 layers + 0.75-wide expert; "
        "mmrl/planning/lerobot.py)",
        published_params=450_000_000,
    )
    return replace(arch, unused=arch.default_unused())


PUBLISHED: dict[str, FlowVLAArch] = {
    "pi0": _pi0_published("pi0"),
    "pi05": _pi0_published("pi05"),
    "smolvla": _smolvla_published(),
}
"""The published architecture of each family (see the module docstring for where every number comes from)."""

_PUBLISHED_IDS = {
    "lerobot/pi0_base": "pi0",
    "lerobot/pi0": "pi0",
    "lerobot/pi05_base": "pi05",
    "lerobot/pi05": "pi05",
    "lerobot/smolvla_base": "smolvla",
}
"""Hub ids whose sizes are the published ones (the presets' defaults)."""


def published_arch(family: str) -> FlowVLAArch:
    if family not in PUBLISHED:
        raise ValueError(f"no published sizes for {family!r} ({', '.join(FAMILIES)})")
    return PUBLISHED[family]


# ============================================================================ tiny presets


def tiny_arch(family: str, *, chunk: int, num_steps: int, state_dim: int = 8) -> FlowVLAArch:
    """The random tiny model ``model.path=tiny_<family>`` builds (``mmrl/adapters/vla/lerobot/tiny.py``):

    * SmolVLA (``TinySmolVLASpec``): vision width 32, MLP 64, 2 layers, 64 px frames, 16 px patches (16 patches,
      pixel-shuffled 2 x 2: 4 tokens per camera); text width 64, MLP 128, 4 layers, 4 heads of 16, 2 key/value heads,
      vocabulary 263 (256 byte tokens + 3 chat tokens + SmolVLM's 4 image tokens); expert width 48 (0.75 x 64), MLP
      256, self-attention every 2nd layer;
    * π0 / π0.5 (``TinyPI0Spec``): SigLIP width 32, MLP 64, 2 layers, 32 px frames, 8 px patches (16 tokens per
      camera); Gemma width 64, MLP 128, 2 layers, 8 heads of 8, 1 key/value head, vocabulary 260 (Gemma's 4 special
      tokens + 256 bytes); expert width 32, MLP 64; π0.5's prompt holds max(48, 48 + 4 x state dims) tokens.

    Both pad state and actions to 32 dims; chunk and K are the run's ``model.chunk`` / ``model.num_steps``."""
    if family == "smolvla":
        arch = FlowVLAArch(
            family="smolvla",
            vision=VisionTower(depth=2, width=32, intermediate=64, patch=16, image_size=64),
            connector_in=32 * 4,
            tokens_per_image=4,
            vocab=263,
            width=64,
            layers=4,
            intermediate=128,
            heads=4,
            kv_heads=2,
            head_dim=16,
            expert_width=48,
            expert_layers=4,
            expert_intermediate=256,
            expert_cross=2,
            chunk=chunk,
            num_steps=num_steps,
            tokenizer_max_length=48,
            source="tiny builder constants (mmrl/adapters/vla/lerobot/tiny.py, TinySmolVLASpec)",
        )
    elif family in ("pi0", "pi05"):
        arch = FlowVLAArch(
            family=family,
            vision=VisionTower(depth=2, width=32, intermediate=64, patch=8, image_size=32),
            connector_in=32,
            tokens_per_image=16,
            vocab=260,
            width=64,
            layers=2,
            intermediate=128,
            heads=8,
            kv_heads=1,
            head_dim=8,
            expert_width=32,
            expert_layers=2,
            expert_intermediate=64,
            chunk=chunk,
            num_steps=num_steps,
            tokenizer_max_length=max(48, 48 + 4 * state_dim) if family == "pi05" else 48,
            source="tiny builder constants (mmrl/adapters/vla/lerobot/tiny.py, TinyPI0Spec)",
        )
    else:
        raise ValueError(f"no tiny preset for {family!r} ({', '.join(FAMILIES)})")
    return replace(arch, unused=arch.default_unused())


# ============================================================================ a LeRobot folder, from its header


def read_safetensors_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's header (the first 8 + n bytes; no tensor data is read)."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (header length {n})")
        header = json.loads(fh.read(n))
    return {k: tuple(int(x) for x in v["shape"]) for k, v in header.items() if k != "__metadata__"}


_PI0 = "model.paligemma_with_expert."
_PI0_NAMES = {
    "vision": _PI0 + "paligemma.model.vision_tower.vision_model.",
    "projector": _PI0 + "paligemma.model.multi_modal_projector.linear.weight",
    "embed": _PI0 + "paligemma.model.language_model.embed_tokens.weight",
    "lm_head": _PI0 + "paligemma.lm_head.weight",
    "vlm": _PI0 + "paligemma.model.language_model.layers.",
    "expert": _PI0 + "gemma_expert.model.layers.",
}
_PI0_UNUSED = (
    _PI0 + "paligemma.lm_head.weight",
    _PI0 + "paligemma.model.language_model.norm.weight",
    _PI0 + "gemma_expert.lm_head.weight",
)
_SMOL = "model.vlm_with_expert."
_SMOL_NAMES = {
    "vision": _SMOL + "vlm.model.vision_model.",
    "projector": _SMOL + "vlm.model.connector.modality_projection.proj.weight",
    "embed": _SMOL + "vlm.model.text_model.embed_tokens.weight",
    "vlm": _SMOL + "vlm.model.text_model.layers.",
    "expert": _SMOL + "lm_expert.layers.",
}
_SMOL_UNUSED = (_SMOL + "vlm.lm_head.weight", _SMOL + "vlm.model.text_model.norm.weight")


def _count_layers(shapes: dict[str, tuple[int, ...]], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for name in shapes if (m := pattern.match(name))}
    return len(found)


def _vision_from(shapes: dict[str, tuple[int, ...]], prefix: str) -> VisionTower:
    width, channels, patch, _ = shapes[prefix + "embeddings.patch_embedding.weight"]
    positions = shapes[prefix + "embeddings.position_embedding.weight"][0]
    side = math.isqrt(positions)
    return VisionTower(
        depth=_count_layers(shapes, prefix + "encoder.layers."),
        width=width,
        intermediate=shapes[prefix + "encoder.layers.0.mlp.fc1.weight"][0],
        patch=patch,
        image_size=side * patch,
        channels=channels,
    )


def _pi0_hub_names(shapes: dict[str, tuple[int, ...]], pi05: bool) -> dict[str, tuple[int, ...]]:
    """Hub π0 names as LeRobot's loader fixes them (``checkpoint._pi0_tensors``): a ``model.`` prefix and the
    time-MLP names; the embedding is the LM head when only the latter is saved (tied)."""
    out = {}
    for name, shape in shapes.items():
        name = name if name.startswith("model.") else f"model.{name}"
        for short in ("time_mlp_in.", "time_mlp_out."):
            old, new = (
                (f"model.action_{short}", f"model.{short}") if pi05 else (f"model.{short}", f"model.action_{short}")
            )
            if name.startswith(old):
                name = new + name[len(old) :]
        if pi05 and name.startswith("model.state_proj."):
            continue
        out[name] = shape
    if _PI0_NAMES["embed"] not in out and _PI0_NAMES["lm_head"] in out:
        out[_PI0_NAMES["embed"]] = out[_PI0_NAMES["lm_head"]]
    return out


def _cameras(cfg: dict[str, Any]) -> int:
    """Image inputs of one observation: the VISUAL input features plus LeRobot's empty cameras not listed."""
    inputs = cfg.get("input_features") or {}
    keys = [k for k, ft in inputs.items() if ft.get("type") == "VISUAL"]
    empty = [f"observation.images.empty_camera_{i}" for i in range(int(cfg.get("empty_cameras", 0) or 0))]
    return len(keys) + len([k for k in empty if k not in inputs])


def _smolvla_text_heads(folder: Path, cfg: dict[str, Any], q_dim: int, kv_dim: int) -> tuple[int, int, int, str]:
    """(heads, kv heads, head dim, where from) of SmolVLA's VLM: its config.json (``vlm_model_name``: a folder as
    given or next to the checkpoint, or a hub id in the local cache), else SmolVLM2's head dim 64."""
    name = str(cfg.get("vlm_model_name") or "")
    text = None
    for candidate in (Path(name), folder / name, folder / Path(name).name) if name else ():
        if (candidate / "config.json").is_file():
            text = json.loads((candidate / "config.json").read_text()).get("text_config")
            break
    if text is None and name.count("/") == 1:
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(name, "config.json")
        except Exception:  # noqa: BLE001 - no hub library or a malformed id: not cached
            hit = None
        if isinstance(hit, str):
            text = json.loads(Path(hit).read_text()).get("text_config")
    if text and text.get("num_attention_heads"):
        heads = int(text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or q_dim // heads)
        return q_dim // head_dim, kv_dim // head_dim, head_dim, "its VLM config"
    return q_dim // 64, kv_dim // 64, 64, "head dim 64 assumed (SmolVLM2's; the VLM config is not on this machine)"


def _smolvla_cross_layers(cfg: dict[str, Any], vlm_layers: int, expert_layers: int) -> int:
    """Expert layers that cross-attend (``SmolVLAConfig.is_self_attention``): expert layer i runs beside VLM layer
    i x (vlm_layers / expert_layers), which is joint self-attention when ``attention_mode`` is not cross_attn or its
    index is a multiple of ``self_attn_every_n_layers`` (> 0)."""
    if str(cfg.get("attention_mode", "cross_attn")) != "cross_attn":
        return 0
    every_n = int(cfg.get("self_attn_every_n_layers", 2))
    step = vlm_layers // max(expert_layers, 1)
    return sum(1 for i in range(expert_layers) if not (every_n > 0 and (i * step) % every_n == 0))


def arch_from_folder(folder: str | Path, weights: str | Path | None = None) -> FlowVLAArch:
    """A LeRobot policy folder's sizes from ``config.json`` and the shapes in the ``model.safetensors`` header, as
    mmrl's loader reads them (``checkpoint._model_config`` / ``_pi0_config``); no weight is read."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    kind = cfg.get("type")
    if kind not in FAMILIES:
        raise ValueError(f"{folder / 'config.json'}: policy type {kind!r} is not one of {', '.join(FAMILIES)}")
    raw = read_safetensors_shapes(weights or folder / "model.safetensors")
    if kind == "smolvla":
        shapes, names, unused_names = raw, _SMOL_NAMES, _SMOL_UNUSED
    else:  # the names as the loader fixes them (π0.5 drops a hub checkpoint's state_proj: not counted)
        shapes, names, unused_names = _pi0_hub_names(raw, kind == "pi05"), _PI0_NAMES, _PI0_UNUSED
    tied = names["embed"] not in raw and "lm_head" in names and names["lm_head"] in shapes  # embedding = LM head
    total = sum(math.prod(s) for s in shapes.values()) - (math.prod(shapes[names["embed"]]) if tied else 0)
    unused = sum(math.prod(s) for n, s in shapes.items() if n in unused_names)
    if tied:  # the saved LM head is the embedding itself, not a tensor beyond the model
        unused -= math.prod(shapes[names["lm_head"]])
    vision = _vision_from(shapes, names["vision"])
    _, connector_in = shapes[names["projector"]]
    vocab, width = shapes[names["embed"]]
    vlm, exp = names["vlm"], names["expert"]
    q_dim, _ = shapes[vlm + "0.self_attn.q_proj.weight"]
    kv_dim, _ = shapes[vlm + "0.self_attn.k_proj.weight"]
    expert_layers = _count_layers(shapes, exp)
    expert_width, max_action_dim = shapes["model.action_in_proj.weight"]
    state = shapes.get("model.state_proj.weight")
    common = dict(
        vision=vision,
        connector_in=connector_in,
        vocab=vocab,
        width=width,
        layers=_count_layers(shapes, vlm),
        intermediate=shapes[vlm + "0.mlp.gate_proj.weight"][0],
        expert_width=expert_width,
        expert_layers=expert_layers,
        expert_intermediate=shapes[exp + "0.mlp.gate_proj.weight"][0],
        max_action_dim=max_action_dim,
        max_state_dim=state[1] if state is not None else int(cfg.get("max_state_dim", 32)),
        chunk=int(cfg.get("chunk_size", 50)),
        cameras=_cameras(cfg),
        unused=unused,
    )
    if kind == "smolvla":
        heads, kv_heads, head_dim, heads_from = _smolvla_text_heads(folder, cfg, q_dim, kv_dim)
        cross = _smolvla_cross_layers(cfg, common["layers"], expert_layers)
        arch = FlowVLAArch(
            family="smolvla",
            tokens_per_image=vision.patches * vision.width // connector_in,  # the shuffle folds scale^2 patches
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            expert_cross=cross,
            attention_bias=vlm + "0.self_attn.q_proj.bias" in shapes,
            mlp_bias=vlm + "0.mlp.gate_proj.bias" in shapes,
            num_steps=int(cfg.get("num_steps", 10)),
            tokenizer_max_length=int(cfg.get("tokenizer_max_length", 48)),
            prefix_length=int(cfg.get("prefix_length", -1)),
            source=f"{folder} (config.json + model.safetensors header; heads from {heads_from})",
            **common,
        )
    else:
        head_dim = kv_dim  # every π0 Gemma has one key/value head
        arch = FlowVLAArch(
            family=kind,
            tokens_per_image=vision.patches,
            heads=q_dim // head_dim,
            kv_heads=1,
            head_dim=head_dim,
            num_steps=int(cfg.get("num_inference_steps", 10)),
            tokenizer_max_length=int(cfg.get("tokenizer_max_length", 48 if kind == "pi0" else 200)),
            source=f"{folder} (config.json + model.safetensors header)",
            **common,
        )
    if arch.checkpoint_params() != total:  # a layout the formula does not know: say so rather than mis-plan
        raise ValueError(
            f"{folder}: the planner's parameter count {arch.checkpoint_params():,} differs from the "
            f"{total:,} of model.safetensors (a layout mmrl plan does not model)"
        )
    return arch


def _cached_folder(path: str) -> Path | None:
    """The snapshot folder of a hub id whose config.json and model.safetensors are in the local hub cache."""
    if path.count("/") != 1 or Path(path).expanduser().exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        cfg = try_to_load_from_cache(path, "config.json")
        weights = try_to_load_from_cache(path, "model.safetensors")
    except Exception:  # noqa: BLE001 - no hub library or a malformed id: not cached
        return None
    if isinstance(cfg, str) and isinstance(weights, str) and Path(cfg).parent == Path(weights).parent:
        return Path(cfg).parent
    return None


def resolve_flow_vla(
    family: str, path: str, *, name: str = "", chunk: int = 50, num_steps: int = 10, state_dim: int = 8
) -> tuple[FlowVLAArch, tuple[str, ...]]:
    """(sizes, notes) of ``model.architecture=family`` with ``model.path=path``: a local folder (or a cached hub id)
    from its header; ``tiny_<family>`` (or the task's VLM preset with ``model.name=tiny_<family>``, as the policy
    reads it) from the tiny builder's constants; anything else from :data:`PUBLISHED`, with a note."""
    folder = Path(path).expanduser()
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return arch_from_folder(folder), ()
    tiny = f"tiny_{family}"
    if path == tiny or name == tiny:
        return tiny_arch(family, chunk=chunk, num_steps=num_steps, state_dim=state_dim), ()
    cached = _cached_folder(path)
    if cached is not None:
        arch = arch_from_folder(cached)
        return replace(arch, source=f"{path} (hub cache: config.json + model.safetensors header)"), ()
    arch = published_arch(family)
    if _PUBLISHED_IDS.get(path) == family:
        return arch, ()
    return arch, (
        f"model.path={path} is not a LeRobot folder on this machine: planned with the published {family} sizes "
        "(a fine-tune keeps them; set model.path to the folder to read its own)",
    )
