"""The linear shapes of one transformer block and the LoRA parameters they take: pure arithmetic shared by the
architecture descriptions of :mod:`mmrl.planning.architectures` (VLMs) and :mod:`mmrl.planning.lerobot` (flow VLAs).
Nothing here imports torch."""

from __future__ import annotations


def decoder_linear_shapes(
    width: int, q_dim: int, kv_dim: int, intermediate: int, kv_in: int | None = None
) -> dict[str, tuple[int, int]]:
    """``name -> (in, out)`` of a Llama / Gemma-style block's linears: q/k/v/o attention (k/v read ``kv_in``, the
    width by default; a cross-attending block reads other keys/values) and the gated MLP."""
    kv_in = width if kv_in is None else kv_in
    return {
        "q_proj": (width, q_dim),
        "k_proj": (kv_in, kv_dim),
        "v_proj": (kv_in, kv_dim),
        "o_proj": (q_dim, width),
        "gate_proj": (width, intermediate),
        "up_proj": (width, intermediate),
        "down_proj": (intermediate, width),
    }


def adapter_params(shapes: dict[str, tuple[int, int]], targets: list[str] | tuple[str, ...], r: int) -> int:
    """LoRA parameters of one block: ``r (in + out)`` per targeted linear of ``shapes`` (unknown names match
    nothing)."""
    wanted = set(targets)
    return sum(r * (i + o) for name, (i, o) in shapes.items() if name in wanted)
