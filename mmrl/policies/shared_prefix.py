"""Shared-prefix forward: each prompt is encoded once per group, its completions attend to it.

In GRPO every prompt is followed by ``G`` completions. The plain training forward runs ``G`` rows of
``prompt + completion`` (``G x (P + T)`` tokens); the shared-prefix forward packs the rows of one prompt
into ONE row holding the prompt once and its completions after it (``P + sum of completion lengths``
tokens), with an attention mask under which every completion sees the prompt and itself causally, never
the other completions, and position ids that continue from the prompt for every completion. The outputs
at the completion positions are those of the plain forward (same log-probs, same gradients), up to
floating-point summation order.

Layout of a packed batch (``R`` rows, one per distinct prompt of the micro-batch, ``W`` columns)::

    columns      0 ...... prefix_end-1 | prefix_end .......................................... W-1
    row r        pad .. pad  prompt r  | c_a[0 .. L_a-2]  c_b[0 .. L_b-2]  ...          pad .. pad
    segment     -1 .. -1    0 ...  0   |  1 ...... 1       2 ...... 2      ...         -1 .. -1

* Prompts are right-aligned on the column ``prefix_end`` (left padding, as the plain forward does), so the
  last prompt token of every row sits at ``prefix_end - 1`` and only the columns from there on need the
  LM head (``logits_to_keep = W - prefix_end + 1``).
* A completion of ``L`` trained tokens contributes its first ``L - 1`` tokens: the logit that predicts
  token ``j`` sits at token ``j - 1`` (at the prompt's last token for ``j = 0``), so the last token is
  never an input whose output is used, and trailing padding is dropped altogether.
* Mask (:func:`shared_prefix_mask_function`): query ``q`` may see key ``k`` iff ``k <= q`` and the key is
  a prompt token or a token of the query's own completion; every token also sees itself (so padding rows
  are never fully masked, which would give NaN in the softmax).
* Positions (:func:`pack_positions`): the prompt keeps the positions the plain forward gives it (1-D, or
  Qwen-VL's 3-D multimodal rotary index from the model's own ``get_rope_index``), and token ``j`` of
  every completion gets ``next + j`` where ``next`` is the position the plain forward gives the first
  token after the prompt.
* Outputs (:func:`prediction_index` / :func:`unpack`): the logits (values) of sample ``i`` at completion
  position ``j < L_i`` are read at the column that predicts it; positions ``j >= L_i`` (untrained padding)
  repeat the prompt's last output (finite, never trained, as the plain forward's outputs at padding).

The mask enters the model as a ready 4-D mask built by transformers' own mask interface for the model's
attention implementation (``sdpa``: boolean, ``eager``: additive float, ``flex_attention``: a BlockMask);
every decoder-only model of transformers 5 passes a 4-D mask through ``create_causal_mask`` unchanged.
Implementations that cannot take an arbitrary mask (flash attention) and sliding-window layers are not
exact and are refused by :func:`unsupported_reason` (the policy then runs the plain forward).

Everything here but :func:`model_attention_mask` and :class:`SharedPrefixGuard` is pure index maths.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch
from torch import Tensor

log = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_ATTENTION",
    "PackedLayout",
    "SharedPrefixGuard",
    "attention_implementation",
    "check_rows",
    "check_tolerance",
    "distribution_gap",
    "global_max",
    "group_rows",
    "is_distributed",
    "model_attention_mask",
    "pack_positions",
    "pack_rows",
    "plan_layout",
    "prediction_index",
    "right_padded_lengths",
    "segment_ids",
    "shared_prefix_mask",
    "shared_prefix_mask_function",
    "text_prefix_positions",
    "unpack",
    "unsupported_reason",
]

SUPPORTED_ATTENTION = ("sdpa", "eager", "flex_attention")
"""Attention implementations that take an arbitrary mask (flash attention only takes padding)."""

PAD_SEGMENT = -1
"""Segment id of padding columns."""
PREFIX_SEGMENT = 0
"""Segment id of prompt columns; completion ``k`` of a row (0-based) has segment ``k + 1``."""


# ============================================================================ grouping


def group_rows(keys: Sequence[Hashable]) -> list[list[int]]:
    """Rows with equal ``keys`` grouped, groups and rows in order of first appearance.

    >>> group_rows(["a", "b", "a", "c", "b"])
    [[0, 2], [1, 4], [3]]
    """
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    return list(groups.values())


def right_padded_lengths(mask: Tensor) -> list[int] | None:
    """Trained tokens per row of a completion mask ``[B, T]`` that is ones then zeros in every row (a completion
    up to its EOS, then padding); None when some row is not of that form (a hole, a weight other than 0/1): the
    shared layout drops trailing padding only, so such a mask needs the plain forward."""
    if mask.dim() != 2:
        raise ValueError(f"completion mask must be [B, T], got shape {tuple(mask.shape)}")
    m = mask.detach().cpu()
    lengths = (m != 0).sum(1)
    expected = (torch.arange(m.shape[1])[None, :] < lengths[:, None]).to(m.dtype)
    if not torch.equal(m, expected):
        return None
    return [int(n) for n in lengths]


def check_rows(groups: Sequence[Sequence[int]], per_group: int = 3) -> list[int]:
    """A few rows for the first-use self-check: up to ``per_group`` rows of the first group with several rows
    (they share a prefix) and the first row of another group (a second packed row, other padding), sorted."""
    multi = next((g for g in groups if len(g) > 1), None)
    if multi is None:
        raise ValueError("check_rows: no group has two rows (nothing is shared)")
    rows = list(multi[:per_group])
    other = next((g for g in groups if g is not multi), None)
    if other is not None:
        rows.append(other[0])
    return sorted(rows)


# ============================================================================ layout


@dataclass(frozen=True, eq=False)
class PackedLayout:
    """Where every prompt and completion sits in the packed rows (see the module docstring)."""

    groups: tuple[tuple[int, ...], ...]
    """Per packed row: the samples (rows of the plain batch) whose completions it holds, in order."""
    prefix_lens: tuple[int, ...]
    """Per packed row: prompt tokens."""
    lengths: tuple[int, ...]
    """Per sample: trained completion tokens ``L`` (the row holds its first ``L - 1``)."""
    prefix_end: int
    """Column after the last prompt token (every prompt ends there)."""
    width: int
    """Columns of the packed rows."""
    row: tuple[int, ...]
    """Per sample: its packed row."""
    start: tuple[int, ...]
    """Per sample: column of its first completion token (where it would be when ``L < 2``)."""

    @property
    def num_rows(self) -> int:
        return len(self.groups)

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    def fed(self, i: int) -> int:
        """Completion tokens of sample ``i`` that are model inputs (``L - 1``, or 0)."""
        return max(self.lengths[i] - 1, 0)

    @property
    def tokens(self) -> int:
        """Non-padding tokens of the packed batch."""
        return sum(self.prefix_lens) + sum(self.fed(i) for i in range(self.num_samples))


def plan_layout(groups: Sequence[Sequence[int]], prefix_lens: Sequence[int], lengths: Sequence[int]) -> PackedLayout:
    """The packed layout of ``groups`` (sample indices per packed row, each sample in exactly one) with
    ``prefix_lens`` prompt tokens per row and ``lengths`` trained completion tokens per sample."""
    n = len(lengths)
    if len(prefix_lens) != len(groups):
        raise ValueError(f"plan_layout: {len(prefix_lens)} prefix lengths for {len(groups)} groups")
    flat = sorted(i for g in groups for i in g)
    if flat != list(range(n)):
        raise ValueError(f"plan_layout: groups {[list(g) for g in groups]} do not hold each of the {n} samples once")
    if any(int(p) < 1 for p in prefix_lens):
        raise ValueError(f"plan_layout: every prompt needs a token, got prefix lengths {list(prefix_lens)}")
    if any(int(L) < 0 for L in lengths):
        raise ValueError(f"plan_layout: negative completion length in {list(lengths)}")
    prefix_end = max(int(p) for p in prefix_lens) if groups else 0
    row = [0] * n
    start = [0] * n
    width = prefix_end
    for r, g in enumerate(groups):
        col = prefix_end
        for i in g:
            row[i], start[i] = r, col
            col += max(int(lengths[i]) - 1, 0)
        width = max(width, col)
    return PackedLayout(
        groups=tuple(tuple(int(i) for i in g) for g in groups),
        prefix_lens=tuple(int(p) for p in prefix_lens),
        lengths=tuple(int(L) for L in lengths),
        prefix_end=prefix_end,
        width=width,
        row=tuple(row),
        start=tuple(start),
    )


def segment_ids(layout: PackedLayout) -> Tensor:
    """``[R, W]`` long: -1 on padding, 0 on prompt tokens, ``k + 1`` on the tokens of the row's ``k``-th completion."""
    seg = torch.full((layout.num_rows, layout.width), PAD_SEGMENT, dtype=torch.long)
    for r, P in enumerate(layout.prefix_lens):
        seg[r, layout.prefix_end - P : layout.prefix_end] = PREFIX_SEGMENT
    for r, g in enumerate(layout.groups):
        for k, i in enumerate(g):
            seg[r, layout.start[i] : layout.start[i] + layout.fed(i)] = k + 1
    return seg


def pack_rows(layout: PackedLayout, prefixes: Sequence[Tensor], completions: Tensor | None, pad_value: int) -> Tensor:
    """``[R, W]`` packed rows: row ``r`` holds ``prefixes[r]`` (1-D) right-aligned on ``prefix_end`` and the first
    ``L_i - 1`` entries of ``completions[i]`` (``[B, T]``) of each of its samples; ``pad_value`` elsewhere (and on
    the completion columns when ``completions`` is None, e.g. ``mm_token_type_ids`` 0)."""
    if len(prefixes) != layout.num_rows:
        raise ValueError(f"pack_rows: {len(prefixes)} prefixes for {layout.num_rows} packed rows")
    dtype = prefixes[0].dtype if prefixes else torch.long
    out = torch.full((layout.num_rows, layout.width), pad_value, dtype=dtype)
    for r, p in enumerate(prefixes):
        if p.numel() != layout.prefix_lens[r]:
            raise ValueError(f"pack_rows: prefix {r} has {p.numel()} entries, the layout {layout.prefix_lens[r]}")
        out[r, layout.prefix_end - p.numel() : layout.prefix_end] = p.to(dtype)
    if completions is not None:
        if completions.shape[0] != layout.num_samples:
            raise ValueError(f"pack_rows: {completions.shape[0]} completions for {layout.num_samples} samples")
        for i in range(layout.num_samples):
            n = layout.fed(i)
            if n > completions.shape[1]:
                raise ValueError(
                    f"pack_rows: sample {i} has {layout.lengths[i]} trained tokens, completions only "
                    f"{completions.shape[1]} columns"
                )
            out[layout.row[i], layout.start[i] : layout.start[i] + n] = completions[i, :n].to(dtype)
    return out


# ============================================================================ positions


def text_prefix_positions(layout: PackedLayout) -> tuple[Tensor, Tensor]:
    """1-D positions of the prompts: ``[1, R, prefix_end]`` (``0 .. P-1`` right-aligned, 0 on padding) and the
    position after each prompt ``[1, R]`` (``P``): what the plain forward's ``cumsum(attention_mask) - 1`` gives."""
    pos = torch.zeros(1, layout.num_rows, layout.prefix_end, dtype=torch.long)
    for r, P in enumerate(layout.prefix_lens):
        pos[0, r, layout.prefix_end - P :] = torch.arange(P)
    return pos, torch.tensor([list(layout.prefix_lens)], dtype=torch.long)


def pack_positions(layout: PackedLayout, prefix_positions: Tensor, next_positions: Tensor) -> Tensor:
    """``[C, R, W]`` position ids of the packed rows (``C`` = 1 for 1-D rotary, 3 for Qwen-VL's multimodal rotary).

    ``prefix_positions`` ``[C, R, prefix_end]`` are the prompt positions in the packed columns (left padding
    included), ``next_positions`` ``[C, R]`` the position of the first token after each prompt. Token ``j`` of
    every completion of row ``r`` gets ``next_positions[:, r] + j`` in all ``C`` components; padding after the
    prompts gets 0.
    """
    C = prefix_positions.shape[0]
    if prefix_positions.shape[1:] != (layout.num_rows, layout.prefix_end):
        raise ValueError(
            f"pack_positions: prefix positions {tuple(prefix_positions.shape)}, expected "
            f"[C, {layout.num_rows}, {layout.prefix_end}]"
        )
    if next_positions.shape != (C, layout.num_rows):
        raise ValueError(
            f"pack_positions: next positions {tuple(next_positions.shape)}, expected [{C}, {layout.num_rows}]"
        )
    out = torch.zeros(C, layout.num_rows, layout.width, dtype=torch.long, device=prefix_positions.device)
    out[:, :, : layout.prefix_end] = prefix_positions
    for i in range(layout.num_samples):
        n = layout.fed(i)
        if n:
            r, s = layout.row[i], layout.start[i]
            out[:, r, s : s + n] = next_positions[:, r, None] + torch.arange(n, device=out.device)
    return out


# ============================================================================ attention mask


def shared_prefix_mask_function(segments: Tensor) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """The mask as an index-based transformers mask function ``(batch, head, q, kv) -> bool`` over ``segments``
    ``[R, W]`` (:func:`segment_ids`): ``kv <= q`` and the key is a prompt token or in the query's own
    completion, or ``kv == q``. Works with broadcast index tensors (sdpa / eager masks) and inside flex attention."""

    def mask(batch_idx: Tensor, head_idx: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        sk = segments[batch_idx, kv_idx]
        sq = segments[batch_idx, q_idx]
        visible = (sk == PREFIX_SEGMENT) | ((sk == sq) & (sk != PAD_SEGMENT))
        return ((kv_idx <= q_idx) & visible) | (kv_idx == q_idx)

    return mask


def shared_prefix_mask(segments: Tensor) -> Tensor:
    """The dense boolean mask ``[R, 1, W, W]`` (True: attend) of :func:`shared_prefix_mask_function`."""
    R, W = segments.shape
    dev = segments.device
    fn = shared_prefix_mask_function(segments)
    return fn(
        torch.arange(R, device=dev)[:, None, None, None],
        None,  # the mask reads no head index: one mask for every head
        torch.arange(W, device=dev)[None, None, :, None],
        torch.arange(W, device=dev)[None, None, None, :],
    )


def attention_implementation(text_config) -> str:
    """The attention implementation a (text) config runs: its ``_attn_implementation``, transformers' ``eager`` when
    unset."""
    return getattr(text_config, "_attn_implementation", None) or "eager"


def unsupported_reason(text_config) -> str | None:
    """Why the shared-prefix forward would not be exact for a model with this (text) config, or None."""
    impl = attention_implementation(text_config)
    if impl not in SUPPORTED_ATTENTION:
        return f"attention implementation {impl!r} takes no custom mask (supported: {', '.join(SUPPORTED_ATTENTION)})"
    if "sliding_attention" in (getattr(text_config, "layer_types", None) or []):
        return "the model has sliding-window attention layers"
    if not getattr(text_config, "is_causal", True):
        return "the model is not causal"
    return None


def model_attention_mask(text_config, segments: Tensor, dtype: torch.dtype):
    """The 4-D mask for the model's attention implementation, built by transformers' mask interface
    (``masking_utils.ALL_MASK_ATTENTION_FUNCTIONS``) from :func:`shared_prefix_mask_function`."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    reason = unsupported_reason(text_config)
    if reason is not None:
        raise ValueError(f"shared-prefix forward: {reason}")
    R, W = segments.shape
    return ALL_MASK_ATTENTION_FUNCTIONS[attention_implementation(text_config)](
        batch_size=R,
        q_length=W,
        kv_length=W,
        mask_function=shared_prefix_mask_function(segments),
        allow_is_causal_skip=False,  # sdpa's default would hand back None ("plain causal") for this non-causal mask
        dtype=dtype,
        config=text_config,
        device=segments.device,
    )


# ============================================================================ unpacking


def prediction_index(layout: PackedLayout, T: int) -> tuple[Tensor, Tensor, Tensor]:
    """Where the output for completion position ``j`` of sample ``i`` is read: ``rows``, ``cols`` ``[B, T]`` long
    and ``valid`` ``[B, T]`` bool (``j < L_i``). Token ``j`` is predicted at the prompt's last column for ``j = 0``,
    else at the column of token ``j - 1``; untrained positions (``j >= L_i``) point at the prompt's last column too."""
    B = layout.num_samples
    rows = torch.tensor(layout.row, dtype=torch.long)[:, None].expand(B, T).clone()
    j = torch.arange(T)[None, :].expand(B, T)
    start = torch.tensor(layout.start, dtype=torch.long)[:, None]
    valid = j < torch.tensor(layout.lengths, dtype=torch.long)[:, None]
    cols = torch.where(valid & (j > 0), start + j - 1, torch.full_like(j, layout.prefix_end - 1))
    return rows, cols, valid


def unpack(x: Tensor, index: tuple[Tensor, Tensor, Tensor], first_col: int = 0) -> Tensor:
    """``[B, T, ...]`` outputs per sample from packed outputs ``x`` ``[R, K, ...]`` covering the columns
    ``first_col .. first_col + K - 1`` (e.g. the LM-head columns of ``logits_to_keep``).

    Untrained positions (``valid`` False) repeat the output at the prompt's last token: finite and never trained,
    like the plain forward's outputs at padding (a masked fill would cost one more pass over ``[B, T, V]`` logits)."""
    rows, cols, _ = (t.to(x.device) for t in index)
    local = cols - first_col
    if bool(((local < 0) | (local >= x.shape[1])).any()):
        raise ValueError(f"unpack: a prediction column lies outside the {x.shape[1]} columns from {first_col}")
    return x[rows, local]


# ============================================================================ first-use self-check


def distribution_gap(a: Tensor, b: Tensor, mask: Tensor) -> float:
    """Largest total-variation distance ``0.5 * sum |softmax(a) - softmax(b)|`` between two logit tensors
    ``[B, T, V]`` over the positions where ``mask`` ``[B, T]`` is non-zero (0 when there are none). Robust to
    rounding in the far tail, where low-precision log-probs differ most."""
    m = mask.to(a.device) != 0
    if not bool(m.any()):
        return 0.0
    pa, pb = a.float()[m].softmax(-1), b.float()[m].softmax(-1)
    return float(0.5 * (pa - pb).abs().sum(-1).max())


def check_tolerance(dtype: torch.dtype) -> float:
    """Largest :func:`distribution_gap` the self-check accepts: rounding of another summation order (fp32: ~1e-7 on
    the tiny models; a positions bug there, where the random distributions are nearly flat, gives ~1e-4)."""
    return 1e-5 if dtype in (torch.float32, torch.float64) else 5e-2


def is_distributed() -> bool:
    """True inside a process group of several processes (DDP / FSDP)."""
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def global_max(x: float, device) -> float:
    """``x`` maximised over the processes of the default group (NaN counts as +inf); ``x`` alone outside one."""
    x = float(x) if math.isfinite(x) or x == math.inf else math.inf
    if not is_distributed():
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t.item())


class SharedPrefixGuard:
    """Whether a policy uses the shared-prefix forward (``model.shared_prefix``), and its first-use self-check.

    The first shared forward of a policy compares a few rows (:func:`check_rows`) with the plain forward
    (no gradient, eval mode); beyond :func:`check_tolerance` it warns, turns sharing off for the rest of the
    run and counts the fallback (``shared_prefix/fallbacks`` in :meth:`metrics`).
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled)
        """Sharing is on (the config asks for it and the self-check did not fail)."""
        self.checked = False
        """The self-check ran."""
        self.fallbacks = 0
        """Times the self-check failed and sharing was turned off."""
        self.check_gap = math.nan
        """The gap measured by the self-check."""
        self.shared_calls = 0
        """Forwards that ran shared."""
        self.check_requested = False
        """Set while :meth:`~mmrl.policies.token_policy.HFTokenPolicy._first_rollout_check` runs: check even with
        several processes, and even without a shared group."""
        self.disabled_reason: str | None = None
        """Why sharing is off although the config asks for it (not exact for this model), or None."""

    @property
    def needs_check(self) -> bool:
        return self.enabled and not self.checked

    def record_check(self, gap: float, tolerance: float, *, what: str = "") -> bool:
        """Store the self-check result; False (and sharing off, a warning, a counted fallback) when ``gap`` is over
        ``tolerance`` or not finite."""
        self.checked = True
        self.check_gap = float(gap)
        if math.isfinite(gap) and gap <= tolerance:
            return True
        self.enabled = False
        self.fallbacks += 1
        log.warning(
            "shared-prefix forward%s differs from the plain forward (max total-variation gap %.3g > %.3g): "
            "falling back to the plain forward for the rest of the run (model.shared_prefix=false "
            "silences this check)",
            f" of {what}" if what else "",
            gap,
            tolerance,
        )
        return False

    def disable(self, reason: str) -> None:
        """Turn sharing off for good without a check: it would not be exact for this model (``reason``)."""
        if self.enabled:
            log.warning("model.shared_prefix: off for this model, %s; every forward runs the plain layout", reason)
        self.enabled = False
        self.checked = True
        self.disabled_reason = reason

    def metrics(self) -> dict[str, float]:
        """``shared_prefix/enabled``, ``shared_prefix/fallbacks`` and, once checked, ``shared_prefix/check_gap``."""
        out = {"shared_prefix/enabled": float(self.enabled), "shared_prefix/fallbacks": float(self.fallbacks)}
        if self.checked:
            out["shared_prefix/check_gap"] = self.check_gap
        return out
