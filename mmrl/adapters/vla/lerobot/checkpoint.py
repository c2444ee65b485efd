"""Read and write SmolVLA checkpoints (and read π0 ones) in LeRobot's ``save_pretrained`` layout.

A LeRobot policy folder holds ``config.json`` (``"type": "smolvla"``, input/output features, sizes),
``model.safetensors`` (names under ``model.``: the VLM under ``model.vlm_with_expert.vlm.``, the expert under
``model.vlm_with_expert.lm_expert.``, the projections directly under ``model.``) and the processor pipelines
``policy_preprocessor.json`` / ``policy_postprocessor.json`` with their ``*.safetensors`` state files (the
normalisation statistics). The VLM's own config and tokenizer are read from ``vlm_model_name`` (a hub id or a
folder, also looked up next to the checkpoint).

Sizes come from the tensors (widths, layer counts, vocabulary, patch size, padded state/action dims); head counts
and the other conventions from the configs. Anything that does not fit is one ``LeRobotCheckpointError`` line
naming the file, feature or tensor.

π0 and π0.5 (``"type": "pi0"`` / ``"pi05"``, ``load_pi0``): PaliGemma under
``model.paligemma_with_expert.paligemma.``, the expert under ``model.paligemma_with_expert.gemma_expert.``; the
tokenizer is the pre-processor's ``tokenizer_name`` (a hub id or a folder). LeRobot's config only names Gemma
variants, so every size is read from the tensors (see ``pi0.py``). ``load_policy`` loads any supported type by what
config.json says.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from mmrl.adapters.vla.lerobot import LeRobotCheckpointError

__all__ = [
    "LEROBOT_PREFIXES",
    "PI0_PREFIXES",
    "PI05_PREFIXES",
    "PI0_UNUSED_TENSORS",
    "SUPPORTED_TYPES",
    "UNUSED_TENSORS",
    "load_pi0",
    "load_policy",
    "load_smolvla",
    "save_policy",
    "save_smolvla",
    "to_lerobot_names",
    "to_mmrl_names",
]

LEROBOT_PREFIXES: tuple[tuple[str, str], ...] = (
    ("model.vlm_with_expert.vlm.model.vision_model.", "vision_model."),
    ("model.vlm_with_expert.vlm.model.connector.", "connector."),
    ("model.vlm_with_expert.vlm.model.text_model.embed_tokens.", "embed_tokens."),
    ("model.vlm_with_expert.vlm.model.text_model.layers.", "vlm_layers."),
    ("model.vlm_with_expert.lm_expert.layers.", "expert_layers."),
    ("model.vlm_with_expert.lm_expert.norm.", "expert_norm."),
    ("model.state_proj.", "state_proj."),
    ("model.action_in_proj.", "action_in_proj."),
    ("model.action_out_proj.", "action_out_proj."),
    ("model.action_time_mlp_in.", "action_time_mlp_in."),
    ("model.action_time_mlp_out.", "action_time_mlp_out."),
)
"""LeRobot tensor-name prefix -> ``SmolVLAModel`` parameter-name prefix (the rest of the name is unchanged)."""

UNUSED_TENSORS = ("model.vlm_with_expert.vlm.lm_head.weight", "model.vlm_with_expert.vlm.model.text_model.norm.weight")
"""Tensors LeRobot saves that no output depends on (the VLM's LM head and final norm): kept and written back."""

_PI0 = "model.paligemma_with_expert."
PI0_PREFIXES: tuple[tuple[str, str], ...] = (
    (_PI0 + "paligemma.model.vision_tower.vision_model.", "vision_tower."),
    (_PI0 + "paligemma.model.multi_modal_projector.linear.", "multi_modal_projector."),
    (_PI0 + "paligemma.model.language_model.embed_tokens.", "embed_tokens."),
    (_PI0 + "paligemma.model.language_model.layers.", "vlm_layers."),
    (_PI0 + "gemma_expert.model.layers.", "expert_layers."),
    (_PI0 + "gemma_expert.model.norm.", "expert_norm."),
    ("model.state_proj.", "state_proj."),
    ("model.action_in_proj.", "action_in_proj."),
    ("model.action_out_proj.", "action_out_proj."),
    ("model.action_time_mlp_in.", "action_time_mlp_in."),
    ("model.action_time_mlp_out.", "action_time_mlp_out."),
)
"""LeRobot π0 tensor-name prefix -> ``PI0Model`` parameter-name prefix."""

PI0_LM_HEAD = _PI0 + "paligemma.lm_head.weight"
PI0_UNUSED_TENSORS = (
    PI0_LM_HEAD,
    _PI0 + "paligemma.model.language_model.norm.weight",
    _PI0 + "gemma_expert.lm_head.weight",
)
"""π0 tensors no output depends on (PaliGemma's LM head and final norm, the expert's LM head): kept, written back."""

PI05_PREFIXES: tuple[tuple[str, str], ...] = tuple(
    pair for pair in PI0_PREFIXES if not pair[0].startswith(("model.state_proj.", "model.action_time_mlp_"))
) + (("model.time_mlp_in.", "time_mlp_in."), ("model.time_mlp_out.", "time_mlp_out."))
"""LeRobot π0.5 tensor-name prefix -> ``PI05Model`` parameter-name prefix (no state projection, a time MLP)."""

SUPPORTED_TYPES = ("smolvla", "pi0", "pi05")
"""LeRobot policy types mmrl loads (config.json's ``type``)."""

PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"
_IGNORED_STEPS = ("to_batch_processor", "device_processor")
_DISABLED_STEPS = ("relative_actions_processor", "absolute_actions_processor")
"""Steps mmrl accepts only while their config says ``enabled: false`` (π0's relative-action conversion)."""


def to_mmrl_names(
    tensors: dict[str, torch.Tensor],
    *,
    prefixes: tuple[tuple[str, str], ...] = LEROBOT_PREFIXES,
    unused_names: tuple[str, ...] = UNUSED_TENSORS,
    policy: str = "SmolVLA",
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split LeRobot's tensors into (mmrl-named model tensors, unused tensors); error on an unknown name."""
    mapped, unused = {}, {}
    for name, tensor in tensors.items():
        if name in unused_names:
            unused[name] = tensor
            continue
        for src, dst in prefixes:
            if name.startswith(src):
                mapped[dst + name[len(src) :]] = tensor
                break
        else:
            raise LeRobotCheckpointError(f"model.safetensors: tensor '{name}' is not part of a {policy} policy")
    return mapped, unused


def to_lerobot_names(
    state: dict[str, torch.Tensor], *, prefixes: tuple[tuple[str, str], ...] = LEROBOT_PREFIXES
) -> dict[str, torch.Tensor]:
    """mmrl parameter names -> LeRobot's (the inverse of ``to_mmrl_names``'s renaming)."""
    out = {}
    for name, tensor in state.items():
        for src, dst in prefixes:
            if name.startswith(dst):
                out[src + name[len(dst) :]] = tensor
                break
        else:
            raise LeRobotCheckpointError(f"parameter '{name}' has no LeRobot name")
    return out


# ---------------------------------------------------------------------------------------------- reading


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise LeRobotCheckpointError(
            f"{path.parent}: no {path.name} (not a LeRobot policy folder saved by save_pretrained)"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LeRobotCheckpointError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise LeRobotCheckpointError(f"{path}: holds a JSON {_json_kind(data)}, expected a JSON object ({{...}})")
    return data


def _json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type (for messages)."""
    if value is None:
        return "null"
    for kinds, name in (((bool,), "boolean"), ((int, float), "number"), ((str,), "string"), ((list,), "list")):
        if isinstance(value, kinds):
            return name
    return "object"


_INT_KEYS = (
    "chunk_size",
    "n_action_steps",
    "max_state_dim",
    "max_action_dim",
    "num_steps",
    "num_inference_steps",
    "prefix_length",
    "self_attn_every_n_layers",
    "num_vlm_layers",
    "num_expert_layers",
    "empty_cameras",
    "tokenizer_max_length",
)
_FLOAT_KEYS = ("min_period", "max_period")
_STR_KEYS = ("type", "attention_mode", "vlm_model_name")
_SIZE_KEYS = ("resize_imgs_with_padding", "image_resolution")  # [height, width] (or null)


def _check_config(cfg: dict[str, Any], path: Path) -> None:
    """The config.json values mmrl reads have LeRobot's types, else one line naming the file, the key and the value
    (a string ``chunk_size``, a feature without a ``shape`` list, ...)."""

    def bad(key: str, value: Any, expected: str) -> LeRobotCheckpointError:
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        return LeRobotCheckpointError(f"{path}: '{key}' is {shown} (a JSON {_json_kind(value)}), expected {expected}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for key in _INT_KEYS:
        if key in cfg and not is_int(cfg[key]):
            raise bad(key, cfg[key], "an integer")
    for key in _FLOAT_KEYS:
        if key in cfg and not (isinstance(cfg[key], (int, float)) and not isinstance(cfg[key], bool)):
            raise bad(key, cfg[key], "a number")
    for key in _STR_KEYS:
        if key in cfg and not isinstance(cfg[key], str) and not (key == "vlm_model_name" and cfg[key] is None):
            raise bad(key, cfg[key], "a string")
    for key in _SIZE_KEYS:
        v = cfg.get(key)
        if v is not None and not (isinstance(v, list) and len(v) == 2 and all(is_int(x) and x > 0 for x in v)):
            raise bad(key, v, "[height, width] in pixels")
    for key in ("input_features", "output_features"):
        features = cfg.get(key)
        if features is None:
            continue
        if not isinstance(features, dict):
            raise bad(key, features, 'an object {"<feature>": {"type": ..., "shape": [...]}}')
        for name, ft in features.items():
            if not isinstance(ft, dict) or not isinstance(ft.get("type"), str):
                raise bad(f"{key}.{name}", ft, 'an object with a "type" string and a "shape" list')
            shape = ft.get("shape")
            if not (isinstance(shape, list) and shape and all(is_int(x) and x > 0 for x in shape)):
                raise bad(f"{key}.{name}.shape", shape, "a list of positive integers")


_WEIGHT_FAMILIES = (
    ("model.vlm_with_expert.", "smolvla"),
    ("model.paligemma_with_expert.", "pi0"),
    ("paligemma_with_expert.", "pi0"),
)
"""A tensor-name prefix that only one policy family's weights have -> that family (π0 and π0.5 share PaliGemma's)."""


def _check_type_matches_weights(kind: str, names, folder: Path) -> None:
    """One line when config.json's ``type`` and model.safetensors' tensor names belong to different policies (a
    SmolVLA folder whose type says "pi0", ...), instead of the first tensor name the other loader does not know."""
    family = "pi0" if kind in ("pi0", "pi05") else kind
    for name in names:
        for prefix, found in _WEIGHT_FAMILIES:
            if name.startswith(prefix) and found != family:
                saved = "SmolVLA" if found == "smolvla" else "π0 / π0.5"
                fix = '"smolvla"' if found == "smolvla" else '"pi0" or "pi05"'
                raise LeRobotCheckpointError(
                    f'{folder / "config.json"} says "type": "{kind}" but {folder / "model.safetensors"} holds a '
                    f"{saved} policy's weights ('{name}'): the type and the weights disagree; set \"type\" to {fix}, "
                    "the policy the weights were saved from"
                )


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise LeRobotCheckpointError(f"{path.parent}: no {path.name}")
    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for a damaged file
        raise LeRobotCheckpointError(f"{path}: cannot be read as safetensors ({type(exc).__name__})") from None


def _count_layers(names, prefix: str) -> int:
    """How many numbered layers ``<prefix><i>.`` the names hold (they must be 0..n-1)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    found = {int(m.group(1)) for name in names if (m := pattern.match(name))}
    if found != set(range(len(found))):
        raise LeRobotCheckpointError(
            f"model.safetensors: layers under '{prefix}' are not numbered 0..n-1: {sorted(found)}"
        )
    return len(found)


def _hub_id_shaped(name: str) -> bool:
    """``owner/name``: what the hub takes (a relative path of two parts reads the same; a local folder wins)."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and all(name.split("/"))


def _resolve_vlm(folder: Path, name: Any, vlm_path: str | Path | None, *, key: str = "vlm_model_name") -> str:
    """The VLM config/tokenizer location: ``vlm_path`` (the Python API's folder), a folder ``name`` (as given or next
    to the checkpoint), else ``name`` as a hub id (from the local cache when offline). ``name`` is config.json's
    ``vlm_model_name`` (or the pre-processor's ``tokenizer_name``): null, or a folder that is not here, is one line
    naming the file and the key, and starts no hub request."""
    if vlm_path is not None:
        if not Path(vlm_path).is_dir():
            raise LeRobotCheckpointError(f"vlm_path {vlm_path} is not a folder")
        return str(vlm_path)
    where = folder / ("config.json" if key == "vlm_model_name" else PREPROCESSOR_FILE)
    if not isinstance(name, str) or not name.strip():
        raise LeRobotCheckpointError(
            f'{where}: {key} is {json.dumps(name)}; set it to the VLM\'s folder (e.g. "vlm", next to config.json, '
            "holding the VLM's config.json and tokenizer files) or to its hub id (LeRobot's SmolVLA: "
            "HuggingFaceTB/SmolVLM2-500M-Video-Instruct)"
        )
    candidates = (Path(name).expanduser(), folder / name, folder / Path(name).name)
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return str(candidate)
    if not _hub_id_shaped(name):
        looked = ", ".join(dict.fromkeys(str(c) for c in candidates))
        raise LeRobotCheckpointError(
            f"{where}: {key} '{name}' names a VLM folder that is not on this machine (looked in {looked}); put the "
            f"VLM's config.json and tokenizer files in {folder / Path(name).name}, or set {key} to a folder or hub id "
            "that is here"
        )
    return name


def _resolve_tokenizer(folder: Path, name: str, tokenizer_path: str | Path | None) -> str:
    """The tokenizer location: ``tokenizer_path``, a folder ``name`` (as given or next to the checkpoint), else
    ``name`` as a hub id (from the local cache when offline)."""
    if tokenizer_path is not None:
        if not Path(tokenizer_path).is_dir():
            raise LeRobotCheckpointError(f"tokenizer_path {tokenizer_path} is not a folder")
        return str(tokenizer_path)
    for candidate in (Path(name), folder / name, folder / Path(name).name):
        if (candidate / "tokenizer_config.json").is_file() or (candidate / "tokenizer.json").is_file():
            return str(candidate)
    if not _hub_id_shaped(name):  # a folder path, not a hub id: no hub request
        raise LeRobotCheckpointError(
            f"the pre-processor's tokenizer folder '{name}' is not on this machine (set model.tokenizer_path=<folder> "
            f"to a folder with the tokenizer, or put it in {folder / 'tokenizer'})"
        )
    return name


def _load_vlm_config(location: str, folder: Path) -> dict[str, Any]:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(location).to_dict()
    except OSError:
        raise LeRobotCheckpointError(
            f"the checkpoint's VLM '{location}' (vlm_model_name in {folder / 'config.json'}) is not on this machine: "
            f"fetch it with `hf download {location}` (config and tokenizer suffice) into {folder / 'vlm'} and set "
            '"vlm_model_name": "vlm" there, or into the Hugging Face cache'
        ) from None


def _load_tokenizer(location: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(location)
    except OSError:
        raise LeRobotCheckpointError(f"no tokenizer for the checkpoint's VLM at '{location}'") from None


def _model_config(cfg: dict[str, Any], vlm: dict[str, Any], tensors: dict[str, torch.Tensor]):
    """An mmrl ``SmolVLAConfig`` from LeRobot's config, the VLM config and the tensor shapes."""
    from mmrl.adapters.vla.lerobot.smolvla import SmolVLAConfig

    def shape(name: str) -> tuple[int, ...]:
        if name not in tensors:
            raise LeRobotCheckpointError(f"model.safetensors: tensor '{name}' is missing")
        return tuple(tensors[name].shape)

    num_vlm_layers = _count_layers(tensors, "vlm_layers.")
    num_expert_layers = _count_layers(tensors, "expert_layers.")
    if cfg.get("num_vlm_layers", -1) > 0 and cfg["num_vlm_layers"] != num_vlm_layers:
        raise LeRobotCheckpointError(
            f"config.json says num_vlm_layers={cfg['num_vlm_layers']} but model.safetensors holds {num_vlm_layers}"
        )
    if num_expert_layers < 1 or num_vlm_layers % num_expert_layers:
        raise LeRobotCheckpointError(
            f"model.safetensors: {num_expert_layers} expert layers for {num_vlm_layers} VLM layers (need a divisor)"
        )
    vocab, width = shape("embed_tokens.weight")
    text = dict(vlm["text_config"])
    text.update(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=shape("vlm_layers.0.mlp.gate_proj.weight")[0],
        num_hidden_layers=num_vlm_layers,
    )
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or width // heads)
    if shape("vlm_layers.0.self_attn.q_proj.weight")[0] != heads * head_dim:
        raise LeRobotCheckpointError(
            f"model.safetensors: the VLM's q_proj has {shape('vlm_layers.0.self_attn.q_proj.weight')[0]} outputs, "
            f"the VLM config says {heads} heads x {head_dim}"
        )
    vision = dict(vlm["vision_config"])
    v_width, _, patch, _ = shape("vision_model.embeddings.patch_embedding.weight")
    side = math.isqrt(shape("vision_model.embeddings.position_embedding.weight")[0])
    vision.update(
        hidden_size=v_width,
        patch_size=patch,
        image_size=side * patch,
        intermediate_size=shape("vision_model.encoder.layers.0.mlp.fc1.weight")[0],
        num_hidden_layers=_count_layers(tensors, "vision_model.encoder.layers."),
    )
    vlm = {**vlm, "text_config": text, "vision_config": vision}
    expert_width, max_action_dim = shape("action_in_proj.weight")
    used = {
        "chunk_size",
        "max_state_dim",
        "max_action_dim",
        "num_steps",
        "min_period",
        "max_period",
        "prefix_length",
        "self_attn_every_n_layers",
        "attention_mode",
        "num_vlm_layers",
        "num_expert_layers",
    }
    return SmolVLAConfig(
        vlm_config=vlm,
        num_vlm_layers=num_vlm_layers,
        expert_width=expert_width,
        expert_intermediate=shape("expert_layers.0.mlp.gate_proj.weight")[0],
        num_expert_layers=num_expert_layers,
        self_attn_every_n_layers=int(cfg.get("self_attn_every_n_layers", 2)),
        attention_mode=str(cfg.get("attention_mode", "cross_attn")),
        chunk_size=int(cfg.get("chunk_size", 50)),
        max_state_dim=shape("state_proj.weight")[1],
        max_action_dim=max_action_dim,
        num_steps=int(cfg.get("num_steps", 10)),
        min_period=float(cfg.get("min_period", 4e-3)),
        max_period=float(cfg.get("max_period", 4.0)),
        prefix_length=int(cfg.get("prefix_length", -1)),
        attention_bias="vlm_layers.0.self_attn.q_proj.bias" in tensors,
        mlp_bias="vlm_layers.0.mlp.gate_proj.bias" in tensors,
        extra={k: v for k, v in cfg.items() if k not in used},
    )


def _lerobot_name(name: str, prefixes: tuple[tuple[str, str], ...] = LEROBOT_PREFIXES) -> str:
    """LeRobot's name of one mmrl parameter name."""
    return next(iter(to_lerobot_names({name: None}, prefixes=prefixes)))


def _load_weights(
    model: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    *,
    prefixes: tuple[tuple[str, str], ...] = LEROBOT_PREFIXES,
    policy: str = "SmolVLA",
) -> None:
    """``load_state_dict`` with one-line errors for a missing, extra or mis-shaped tensor."""
    expected = model.state_dict()
    missing = [name for name in expected if name not in tensors]
    extra = [name for name in tensors if name not in expected]
    if missing:
        raise LeRobotCheckpointError(
            f"model.safetensors: tensor '{_lerobot_name(missing[0], prefixes)}' is missing "
            f"({len(missing)} missing in all)"
        )
    if extra:
        raise LeRobotCheckpointError(
            f"model.safetensors: tensor '{_lerobot_name(extra[0], prefixes)}' is not used by this {policy} "
            f"configuration ({len(extra)} extra in all)"
        )
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise LeRobotCheckpointError(
                f"model.safetensors: tensor '{_lerobot_name(name, prefixes)}' has shape {tuple(tensor.shape)}, the "
                f"configs imply {tuple(expected[name].shape)}"
            )
    model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=True)


def _processor_steps(folder: Path, filename: str) -> list[dict[str, Any]]:
    data = _read_json(folder / filename)
    steps = data.get("steps")
    if not isinstance(steps, list):
        raise LeRobotCheckpointError(f"{folder / filename}: no 'steps' list")
    return steps


def _normalizer(folder: Path, step: dict[str, Any], filename: str):
    """A ``Normalizer`` from a (un)normalizer step and its state file."""
    from mmrl.adapters.vla.lerobot.processing import Normalizer

    config = step.get("config", {})
    flat = _read_tensors(folder / step["state_file"]) if step.get("state_file") else {}
    features = {key: ft["type"] for key, ft in config.get("features", {}).items()}
    stats: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in flat.items():
        key, _, stat = name.rpartition(".")
        stats.setdefault(key, {})[stat] = tensor.to(torch.float32)
    try:
        return Normalizer(features, dict(config.get("norm_map", {})), stats, float(config.get("eps", 1e-8)))
    except LeRobotCheckpointError as exc:
        raise LeRobotCheckpointError(f"{filename}: {exc}") from None


def _check_disabled(step: dict[str, Any], filename: str) -> None:
    if step.get("config", {}).get("enabled", False):
        raise LeRobotCheckpointError(
            f"{filename}: processor step '{step.get('registry_name')}' is enabled (relative actions are not supported "
            f"by mmrl yet)"
        )


def _read_processors(folder: Path, cfg: dict[str, Any]):
    """(normalizer, unnormalizer, tokenizer settings, rename map, raw json of both files) from the processor files."""
    from mmrl.adapters.vla.lerobot.processing import Normalizer, TokenizerSettings

    pre = _processor_steps(folder, PREPROCESSOR_FILE)
    post = _processor_steps(folder, POSTPROCESSOR_FILE)
    normalizer = unnormalizer = None
    tokenizer = None
    rename: dict[str, str] = {}
    newline = state_prompt = False
    for step in pre:
        kind = step.get("registry_name", "")
        conf = step.get("config", {})
        if kind == "normalizer_processor":
            normalizer = _normalizer(folder, step, PREPROCESSOR_FILE)
        elif kind == "tokenizer_processor":
            tokenizer = TokenizerSettings(
                tokenizer_name=str(conf.get("tokenizer_name") or cfg.get("vlm_model_name") or ""),
                max_length=int(conf.get("max_length", cfg.get("tokenizer_max_length", 48))),
                padding=str(conf.get("padding", "longest")),
                padding_side=str(conf.get("padding_side", "right")),
                truncation=bool(conf.get("truncation", True)),
            )
        elif kind == "rename_observations_processor":
            rename = dict(conf.get("rename_map", {}))
        elif "new_line" in kind or "newline" in kind:
            newline = True
        elif kind == "pi05_prepare_state_tokenizer_processor_step":
            state_prompt = True
        elif kind in _DISABLED_STEPS:
            _check_disabled(step, PREPROCESSOR_FILE)
        elif kind not in _IGNORED_STEPS:
            raise LeRobotCheckpointError(f"{PREPROCESSOR_FILE}: processor step '{kind}' is not supported by mmrl")
    for step in post:
        kind = step.get("registry_name", "")
        if kind == "unnormalizer_processor":
            unnormalizer = _normalizer(folder, step, POSTPROCESSOR_FILE)
        elif kind in _DISABLED_STEPS:
            _check_disabled(step, POSTPROCESSOR_FILE)
        elif kind not in _IGNORED_STEPS:
            raise LeRobotCheckpointError(f"{POSTPROCESSOR_FILE}: processor step '{kind}' is not supported by mmrl")
    if tokenizer is None:
        raise LeRobotCheckpointError(f"{PREPROCESSOR_FILE}: no tokenizer_processor step")
    tokenizer.add_newline = newline
    tokenizer.state_in_prompt = state_prompt
    normalizer = normalizer or Normalizer({}, {})
    unnormalizer = unnormalizer or Normalizer({}, {})
    raw = {name: json.loads((folder / name).read_text()) for name in (PREPROCESSOR_FILE, POSTPROCESSOR_FILE)}
    return normalizer, unnormalizer, tokenizer, rename, raw


def _spec(cfg: dict[str, Any]):
    """Camera keys, state/action dims and image size from config.json's features."""
    from mmrl.adapters.vla.lerobot.pipeline import ACTION_KEY, STATE_KEY, PipelineSpec

    inputs = cfg.get("input_features") or {}
    outputs = cfg.get("output_features") or {}
    image_keys = [key for key, ft in inputs.items() if ft.get("type") == "VISUAL"]
    empty = int(cfg.get("empty_cameras", 0))
    empty_keys = [f"observation.images.empty_camera_{i}" for i in range(empty)]
    image_keys += [key for key in empty_keys if key not in inputs]
    if not image_keys:
        raise LeRobotCheckpointError("config.json: no VISUAL input feature (SmolVLA needs at least one camera)")
    if STATE_KEY not in inputs:
        raise LeRobotCheckpointError(f"config.json: input feature '{STATE_KEY}' is missing")
    unknown = [key for key, ft in inputs.items() if ft.get("type") not in ("VISUAL", "STATE")]
    if unknown:
        kind = inputs[unknown[0]].get("type")
        raise LeRobotCheckpointError(
            f"config.json: input feature '{unknown[0]}' ({kind}) cannot be mapped (SmolVLA takes cameras and the state)"
        )
    if ACTION_KEY not in outputs:
        raise LeRobotCheckpointError(f"config.json: output feature '{ACTION_KEY}' is missing")
    size = cfg.get("resize_imgs_with_padding")
    return PipelineSpec(
        image_keys=image_keys,
        state_dim=int(inputs[STATE_KEY]["shape"][-1]),
        action_dim=int(outputs[ACTION_KEY]["shape"][-1]),
        image_size=(int(size[0]), int(size[1])) if size else None,
        empty_cameras=empty,
    )


def load_smolvla(folder: str | Path, *, vlm_path: str | Path | None = None, device: str | torch.device = "cpu"):
    """Load a LeRobot SmolVLA folder into a float32 ``SmolVLAPipeline`` on ``device``.

    ``vlm_path``: a folder with the VLM's config and tokenizer, when ``vlm_model_name`` in config.json is a hub id
    that is not cached on this machine (or a folder path that does not exist here).
    """
    from mmrl.adapters.vla.lerobot.pipeline import SmolVLAPipeline
    from mmrl.adapters.vla.lerobot.smolvla import SmolVLAModel

    folder = Path(folder)
    if not folder.is_dir():
        raise LeRobotCheckpointError(f"LeRobot policy folder {folder} does not exist")
    cfg = _read_json(folder / "config.json")
    _check_config(cfg, folder / "config.json")
    if cfg.get("type") != "smolvla":
        raise LeRobotCheckpointError(f"{folder / 'config.json'}: policy type is {cfg.get('type')!r}, not 'smolvla'")
    if cfg.get("add_image_special_tokens"):
        raise LeRobotCheckpointError("config.json: add_image_special_tokens=true is not supported by mmrl yet")
    if cfg.get("adapt_to_pi_aloha"):
        raise LeRobotCheckpointError("config.json: adapt_to_pi_aloha=true is not supported by mmrl yet")
    spec = _spec(cfg)
    loaded = _read_tensors(folder / "model.safetensors")
    _check_type_matches_weights("smolvla", loaded, folder)
    tensors, unused = to_mmrl_names(loaded)
    normalizer, unnormalizer, tok_settings, rename, raw = _read_processors(folder, cfg)
    spec.rename_map = rename
    location = _resolve_vlm(folder, cfg.get("vlm_model_name"), vlm_path)
    vlm = _load_vlm_config(location, folder)
    tokenizer = _load_tokenizer(_resolve_vlm(folder, tok_settings.tokenizer_name, vlm_path, key="tokenizer_name"))
    model_config = _model_config(cfg, vlm, tensors)
    model = SmolVLAModel(model_config)
    _load_weights(model, tensors)
    for key in ("observation.state", "action"):
        source = normalizer if key != "action" else unnormalizer
        if source.mode(key) != "IDENTITY" and key not in source.stats:
            raise LeRobotCheckpointError(f"processor files: no normalisation statistics for feature '{key}'")
    pipeline = SmolVLAPipeline(
        model,
        spec,
        normalizer,
        unnormalizer,
        tokenizer,
        tok_settings,
        lerobot_config=cfg,
        unused_tensors=unused,
        processor_files=raw,
    )
    pipeline.source_folder = folder
    return pipeline.to(device).eval()


def load_policy(folder: str | Path, **kwargs):
    """Load a LeRobot policy folder by config.json's ``type``: ``load_smolvla`` or ``load_pi0`` (their keywords)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise LeRobotCheckpointError(f"LeRobot policy folder {folder} does not exist")
    kind = _read_json(folder / "config.json").get("type")
    if kind == "smolvla":
        return load_smolvla(folder, **kwargs)
    if kind in ("pi0", "pi05"):
        return load_pi0(folder, **kwargs)
    raise LeRobotCheckpointError(
        f"{folder / 'config.json'}: policy type {kind!r} is not supported by mmrl (supported: "
        f"{', '.join(SUPPORTED_TYPES)})"
    )


def _pi0_tensors(tensors: dict[str, torch.Tensor], pi05: bool = False) -> dict[str, torch.Tensor]:
    """Hub π0 names -> LeRobot's saved names, as LeRobot's loader fixes them: a ``model.`` prefix, ``time_mlp_*`` ->
    ``action_time_mlp_*`` (π0.5: the reverse, and no ``state_proj``), and the LM head copied into the token embedding
    when the checkpoint has no embedding."""
    fixed = {}
    for name, tensor in tensors.items():
        name = name if name.startswith("model.") else f"model.{name}"
        for short in ("time_mlp_in.", "time_mlp_out."):
            old, new = (
                (f"model.action_{short}", f"model.{short}") if pi05 else (f"model.{short}", f"model.action_{short}")
            )
            if name.startswith(old):
                name = new + name[len(old) :]
        if pi05 and name.startswith("model.state_proj."):
            continue
        fixed[name] = tensor
    embed = PI0_PREFIXES[2][0] + "weight"
    if embed not in fixed and PI0_LM_HEAD in fixed:
        fixed[embed] = fixed[PI0_LM_HEAD].clone()
    return fixed


def _pi0_config(cfg: dict[str, Any], tensors: dict[str, torch.Tensor]):
    """An mmrl ``PI0Config`` from LeRobot's config.json and the tensor shapes (LeRobot hard-codes the sizes)."""
    from mmrl.adapters.vla.lerobot.pi0 import SIGLIP_HEADS, PI0Config

    pi05 = cfg.get("type") == "pi05"
    prefixes = PI05_PREFIXES if pi05 else PI0_PREFIXES

    def shape(name: str) -> tuple[int, ...]:
        if name not in tensors:
            raise LeRobotCheckpointError(f"model.safetensors: tensor '{_lerobot_name(name, prefixes)}' is missing")
        return tuple(tensors[name].shape)

    depth = _count_layers(tensors, "vlm_layers.")
    expert_depth = _count_layers(tensors, "expert_layers.")
    if depth < 1 or depth != expert_depth:
        raise LeRobotCheckpointError(
            f"model.safetensors: {depth} PaliGemma layers and {expert_depth} action-expert layers (π0 needs as many)"
        )
    vocab, width = shape("embed_tokens.weight")
    head_dim = shape("vlm_layers.0.self_attn.k_proj.weight")[0]  # every π0 Gemma has a single key/value head
    q_dim = shape("vlm_layers.0.self_attn.q_proj.weight")[0]
    if q_dim % head_dim:
        raise LeRobotCheckpointError(
            f"model.safetensors: PaliGemma's q_proj has {q_dim} outputs, not a multiple of the head size {head_dim}"
        )
    expert_q, expert_k = (
        shape("expert_layers.0.self_attn.q_proj.weight")[0],
        shape("expert_layers.0.self_attn.k_proj.weight")[0],
    )
    if (expert_q, expert_k) != (q_dim, head_dim):
        raise LeRobotCheckpointError(
            f"model.safetensors: the action expert's attention ({expert_q} query / {expert_k} key outputs) does not "
            f"match PaliGemma's ({q_dim} / {head_dim}); joint attention needs the same heads"
        )
    v_width, channels, patch, _ = shape("vision_tower.embeddings.patch_embedding.weight")
    positions = shape("vision_tower.embeddings.position_embedding.weight")[0]
    side = math.isqrt(positions)
    resolution = [int(x) for x in cfg.get("image_resolution", (side * patch, side * patch))]
    if side * side != positions or resolution != [side * patch, side * patch]:
        raise LeRobotCheckpointError(
            f"config.json: image_resolution {resolution} does not match the vision tower ({positions} patches of "
            f"{patch} px)"
        )
    if v_width % SIGLIP_HEADS:
        raise LeRobotCheckpointError(
            f"model.safetensors: the vision tower's width {v_width} is not a multiple of SigLIP's {SIGLIP_HEADS} heads"
        )
    vision = {
        "hidden_size": v_width,
        "intermediate_size": shape("vision_tower.encoder.layers.0.mlp.fc1.weight")[0],
        "num_hidden_layers": _count_layers(tensors, "vision_tower.encoder.layers."),
        "num_attention_heads": SIGLIP_HEADS,
        "num_channels": channels,
        "patch_size": patch,
        "image_size": side * patch,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
        "vision_use_head": False,
    }
    expert_width, max_action_dim = shape("action_in_proj.weight")
    max_state_dim = int(cfg.get("max_state_dim", 32)) if pi05 else shape("state_proj.weight")[1]
    for key, found in (("max_state_dim", max_state_dim), ("max_action_dim", max_action_dim)):
        if key in cfg and int(cfg[key]) != found:
            raise LeRobotCheckpointError(f"config.json says {key}={cfg[key]} but model.safetensors implies {found}")
    used = {"chunk_size", "max_state_dim", "max_action_dim", "num_inference_steps", "min_period", "max_period"}
    return PI0Config(
        vision_config=vision,
        vocab_size=vocab,
        width=width,
        depth=depth,
        intermediate=shape("vlm_layers.0.mlp.gate_proj.weight")[0],
        num_heads=q_dim // head_dim,
        num_kv_heads=1,
        head_dim=head_dim,
        expert_width=expert_width,
        expert_intermediate=shape("expert_layers.0.mlp.gate_proj.weight")[0],
        chunk_size=int(cfg.get("chunk_size", 50)),
        max_state_dim=max_state_dim,
        max_action_dim=max_action_dim,
        num_steps=int(cfg.get("num_inference_steps", 10)),
        min_period=float(cfg.get("min_period", 4e-3)),
        max_period=float(cfg.get("max_period", 4.0)),
        image_size=side * patch,
        extra={k: v for k, v in cfg.items() if k not in used},
    )


def load_pi0(folder: str | Path, *, tokenizer_path: str | Path | None = None, device: str | torch.device = "cpu"):
    """Load a LeRobot π0 (or π0.5: ``"type": "pi05"``) folder into a float32 ``PI0Pipeline`` on ``device``.

    ``tokenizer_path``: a folder with the PaliGemma tokenizer, when the pre-processor's ``tokenizer_name`` (LeRobot
    writes ``google/paligemma-3b-pt-224``) is neither a folder nor cached on this machine.
    """
    from mmrl.adapters.vla.lerobot.pi0 import PI0Model
    from mmrl.adapters.vla.lerobot.pi05 import PI05Model
    from mmrl.adapters.vla.lerobot.pipeline import PI0Pipeline

    folder = Path(folder)
    if not folder.is_dir():
        raise LeRobotCheckpointError(f"LeRobot policy folder {folder} does not exist")
    cfg = _read_json(folder / "config.json")
    _check_config(cfg, folder / "config.json")
    if cfg.get("type") not in ("pi0", "pi05"):
        raise LeRobotCheckpointError(
            f"{folder / 'config.json'}: policy type is {cfg.get('type')!r}, not 'pi0' or 'pi05'"
        )
    pi05 = cfg["type"] == "pi05"
    prefixes = PI05_PREFIXES if pi05 else PI0_PREFIXES
    if cfg.get("use_relative_actions"):
        raise LeRobotCheckpointError("config.json: use_relative_actions=true is not supported by mmrl yet")
    spec = _spec(cfg)
    spec.centre_pad = True
    loaded = _read_tensors(folder / "model.safetensors")
    _check_type_matches_weights(cfg["type"], loaded, folder)
    raw_tensors = _pi0_tensors(loaded, pi05=pi05)
    label = "π0.5" if pi05 else "π0"
    tensors, unused = to_mmrl_names(raw_tensors, prefixes=prefixes, unused_names=PI0_UNUSED_TENSORS, policy=label)
    normalizer, unnormalizer, tok_settings, rename, raw = _read_processors(folder, cfg)
    spec.rename_map = rename
    model_config = _pi0_config(cfg, tensors)
    spec.image_size = (model_config.image_size, model_config.image_size)
    if tok_settings.tokenizer_name in ("None", ""):
        tok_settings.tokenizer_name = "google/paligemma-3b-pt-224"
    tokenizer = _load_tokenizer(_resolve_tokenizer(folder, tok_settings.tokenizer_name, tokenizer_path))
    if pi05 != tok_settings.state_in_prompt:
        need = "needs" if pi05 else "cannot have"
        raise LeRobotCheckpointError(
            f"{PREPROCESSOR_FILE}: a {label} checkpoint {need} the pi05_prepare_state_tokenizer_processor_step step"
        )
    model = (PI05Model if pi05 else PI0Model)(model_config)
    _load_weights(model, tensors, prefixes=prefixes, policy=label)
    for key in ("observation.state", "action"):
        source = normalizer if key != "action" else unnormalizer
        if source.mode(key) != "IDENTITY" and key not in source.stats:
            raise LeRobotCheckpointError(f"processor files: no normalisation statistics for feature '{key}'")
    pipeline = PI0Pipeline(
        model,
        spec,
        normalizer,
        unnormalizer,
        tokenizer,
        tok_settings,
        lerobot_config=cfg,
        unused_tensors=unused,
        processor_files=raw,
    )
    pipeline.source_folder = folder
    return pipeline.to(device).eval()


# ---------------------------------------------------------------------------------------------- writing


def save_smolvla(pipeline, folder: str | Path) -> Path:
    """Write ``pipeline`` as a LeRobot policy folder (same file and tensor names LeRobot's ``save_pretrained`` uses).

    config.json is the loaded one; model.safetensors holds the current weights (float32; LoRA adapters merged into
    their base weights, :func:`~mmrl.adapters.vla.lerobot.lora.plain_state_dict`) plus the unused VLM tensors; the processor files are re-written with the current normalisation statistics. A π0 / π0.5 pipeline
    (``load_pi0``) is written in its own layout, with a copy of a local tokenizer folder next to it (``save_policy``
    is the same function under a type-neutral name).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    policy_type = pipeline.lerobot_config.get("type", "smolvla")
    prefixes = {"pi0": PI0_PREFIXES, "pi05": PI05_PREFIXES}.get(policy_type, LEROBOT_PREFIXES)
    (folder / "config.json").write_text(json.dumps(pipeline.lerobot_config, indent=4))
    from mmrl.adapters.vla.lerobot.lora import plain_state_dict

    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in plain_state_dict(pipeline.model).items()}
    tensors = {
        **to_lerobot_names(state, prefixes=prefixes),
        **{k: v.contiguous() for k, v in pipeline.unused_tensors.items()},
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for filename, norm, kind in (
        (PREPROCESSOR_FILE, pipeline.normalizer, "normalizer_processor"),
        (POSTPROCESSOR_FILE, pipeline.unnormalizer, "unnormalizer_processor"),
    ):
        data = json.loads(json.dumps(pipeline.processor_files[filename]))
        for step in data["steps"]:
            if step.get("registry_name") == kind and step.get("state_file"):
                save_file({k: v.contiguous() for k, v in norm.state_dict().items()}, str(folder / step["state_file"]))
        (folder / filename).write_text(json.dumps(data, indent=2))
    bundled = getattr(pipeline, "bundled_vlm", None)
    if bundled is not None:
        _write_vlm_folder(
            folder / str(pipeline.lerobot_config.get("vlm_model_name", "vlm")), bundled, pipeline.tokenizer
        )
    name = pipeline.tokenizer_settings.tokenizer_name
    if policy_type in ("pi0", "pi05") and (Path(name).is_absolute() or name.startswith(".") or name.count("/") > 1):
        pipeline.tokenizer.save_pretrained(str(folder / Path(name).name))  # a local tokenizer travels with it
    source = getattr(pipeline, "source_folder", None)
    if source is not None and Path(source).resolve() != folder.resolve():
        for extra in ("README.md",):
            if (Path(source) / extra).is_file():
                shutil.copy2(Path(source) / extra, folder / extra)
    return folder


save_policy = save_smolvla


def _write_vlm_folder(folder: Path, vlm_config: dict[str, Any], tokenizer) -> None:
    """Write a VLM config, the tokenizer and a SmolVLM processor (what LeRobot's SmolVLA reads) into ``folder``.

    Without the processor's optional dependencies (torchvision for the video processor) only the config and the
    tokenizer are written: enough for mmrl, not for LeRobot.
    """
    from transformers import SmolVLMConfig

    config = SmolVLMConfig(**{k: v for k, v in vlm_config.items() if k != "architectures"})
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    try:
        from transformers import SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

        side = int(config.vision_config.image_size)
        patch, scale = int(config.vision_config.patch_size), int(config.scale_factor)
        size = {"longest_edge": side}
        processor = SmolVLMProcessor(
            image_processor=SmolVLMImageProcessor(size=size, max_image_size=size, do_image_splitting=False),
            tokenizer=tokenizer,
            video_processor=SmolVLMVideoProcessor(size=size, max_image_size=size),
            image_seq_len=(side // patch) ** 2 // (scale * scale),
        )
    except (ImportError, ValueError):
        tokenizer.save_pretrained(folder)
        return
    processor.save_pretrained(folder)
