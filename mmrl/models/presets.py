"""Named VLM presets: tiny offline models (built on first use) and real Hugging Face ids.

``resolve_vlm(name_or_path)`` turns what a config says (``model.name=tiny_qwen2_5_vl``,
``qwen2_5_vl_7b``, a local folder, or a hub id ``owner/name``) into something
:func:`mmrl.models.tiny_vlm.load_vlm` can open.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["VLM_PRESETS", "UnknownVLMError", "VLMPreset", "resolve_vlm"]


class UnknownVLMError(ValueError):
    """A model name that is neither a preset, an existing path nor a hub id."""


@dataclass(frozen=True)
class VLMPreset:
    """One named model: ``hf_id`` for a real checkpoint, else ``build_tiny_vlm(family, **tiny_kwargs)``."""

    family: str
    hf_id: str | None = None
    tiny_kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def is_tiny(self) -> bool:
        """True for presets built offline by :func:`mmrl.models.tiny_vlm.build_tiny_vlm`."""
        return self.hf_id is None


VLM_PRESETS: dict[str, VLMPreset] = {
    "tiny_qwen2_vl": VLMPreset("qwen2_vl", description="~0.7M-param Qwen2-VL built offline (CPU tests)"),
    "tiny_qwen2_5_vl": VLMPreset("qwen2_5_vl", description="~0.7M-param Qwen2.5-VL built offline (CPU tests)"),
    "tiny_qwen3_vl": VLMPreset("qwen3_vl", description="~0.8M-param Qwen3-VL built offline (CPU tests)"),
    "tiny_smolvlm": VLMPreset("smolvlm", description="~0.5M-param SmolVLM built offline (CPU tests, non-Qwen path)"),
    "qwen2_vl_2b": VLMPreset("qwen2_vl", hf_id="Qwen/Qwen2-VL-2B-Instruct"),
    "qwen2_5_vl_3b": VLMPreset("qwen2_5_vl", hf_id="Qwen/Qwen2.5-VL-3B-Instruct"),
    "qwen2_5_vl_7b": VLMPreset("qwen2_5_vl", hf_id="Qwen/Qwen2.5-VL-7B-Instruct"),
    "qwen3_vl_4b": VLMPreset("qwen3_vl", hf_id="Qwen/Qwen3-VL-4B-Instruct"),
}

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def resolve_vlm(name_or_path: str | Path, *, cache_dir: str | Path | None = None) -> str:
    """Resolve a preset name, local folder or hub id to a path or hub id for ``load_vlm``.

    * a tiny preset -> the folder of its build (built now if not cached, in ``cache_dir``);
    * a real preset -> its Hugging Face id;
    * an existing local path -> that path, unchanged;
    * a hub id of the form ``owner/name`` -> unchanged (downloaded later, if the hub is reachable).

    Anything else raises :class:`UnknownVLMError` listing the presets.
    """
    key = str(name_or_path)
    preset = VLM_PRESETS.get(key)
    if preset is not None:
        if preset.hf_id is not None:
            return preset.hf_id
        from mmrl.models.tiny_vlm import build_tiny_vlm

        return str(build_tiny_vlm(preset.family, cache_dir=cache_dir, **preset.tiny_kwargs))
    if Path(key).expanduser().exists():
        return key
    if _HUB_ID.match(key) and not key.startswith("."):
        return key
    raise UnknownVLMError(
        f"unknown VLM {key!r}: not a preset, not an existing path and not a hub id 'owner/name'. "
        f"Presets: {', '.join(sorted(VLM_PRESETS))}"
    )
