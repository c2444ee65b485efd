"""OpenVLA-style action tokenizer: continuous actions <-> bins <-> reserved vocabulary ids.

Per action dimension ``d`` (statistics ``low[d]``, ``high[d]``, by default the 1st / 99th
percentiles of the dataset's actions):

* normalise ``u = 2 (a - low) / (high - low) - 1`` and clip to [-1, 1] (a dimension with
  ``high == low`` maps to ``u = 0``);
* ``n_bins`` uniform bins over [-1, 1]: width ``w = 2 / n_bins``, edges ``-1 + k w``,
  ``bin = min(floor((u + 1) / w), n_bins - 1)``;
* decode to the bin centre ``u_c = -1 + (bin + 1/2) w`` and back to the original scale
  ``a = low + (u_c + 1) (high - low) / 2``; the round-trip error of an in-range value is at
  most half a bin width, ``(high - low) / (2 n_bins)``;
* gripper dimensions decode to ``gripper_values[0]`` (default -1, open) when the centre is
  below the midpoint of [low, high] (``u_c < 0``) and ``gripper_values[1]`` (+1, closed) otherwise.

NaN entries and entries outside [low, high] are clipped (NaN to the middle, ``u = 0``) and
counted: ``last_clip_count`` / ``last_nan_count`` after each :meth:`ActionTokenizer.encode`.

Bins map to vocabulary ids with ``token_ids[bin]`` (the 256 reserved ``<|act_i|>`` tokens of the
tiny VLM: :func:`mmrl.models.tokenizer_builder.action_token_ids`).

Chunks: a chunk of ``chunk`` actions of ``D`` dims is ``chunk * D`` tokens in time-major order,
token ``t * D + d`` = dimension ``d`` of action ``t`` (the order OFT decodes in one pass).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = [
    "ActionTokenError",
    "ActionTokenizer",
    "GRANULARITIES",
    "PartialGroupError",
    "group_logp",
    "group_mask",
    "group_size",
]

STATS_VERSION = 1
GRANULARITIES = ("token", "action", "chunk")


class ActionTokenError(ValueError):
    """Bad bins, token ids or statistics for an :class:`ActionTokenizer`."""


class PartialGroupError(ValueError):
    """A mask covers only part of an action / chunk group (its log-prob would be partial)."""


class ActionTokenizer:
    """Discretise actions into ``n_bins`` uniform bins per dimension and map bins to token ids.

    Args:
        low, high: per-dimension statistics ``[D]`` (normalisation maps them to -1 and +1).
        n_bins: bins per dimension.
        token_ids: vocabulary id of each bin (``n_bins`` distinct non-negative ints); None
            leaves :meth:`to_token_ids` / :meth:`from_token_ids` unavailable.
        gripper_dims: dimensions decoded to the binary ``gripper_values``.
        chunk: actions per chunk (used by the chunk helpers and ``tokens_per_chunk``).
        gripper_values: decoded (low, high) gripper values.
    """

    def __init__(
        self,
        low: Any,
        high: Any,
        *,
        n_bins: int = 256,
        token_ids: Sequence[int] | None = None,
        gripper_dims: Sequence[int] = (),
        chunk: int = 1,
        gripper_values: tuple[float, float] = (-1.0, 1.0),
    ) -> None:
        self.low = np.asarray(low, dtype=np.float64).reshape(-1)
        self.high = np.asarray(high, dtype=np.float64).reshape(-1)
        if self.low.shape != self.high.shape or self.low.size == 0:
            raise ActionTokenError(
                f"low and high must be non-empty [D] arrays of equal size, got {self.low.shape}, {self.high.shape}"
            )
        if not (np.isfinite(self.low).all() and np.isfinite(self.high).all()):
            raise ActionTokenError(f"low/high must be finite, got low={self.low}, high={self.high}")
        if (self.high < self.low).any():
            bad = np.nonzero(self.high < self.low)[0].tolist()
            raise ActionTokenError(f"high < low in dimensions {bad}")
        if int(n_bins) < 2:
            raise ActionTokenError(f"n_bins must be >= 2, got {n_bins}")
        self.n_bins = int(n_bins)
        self.action_dim = int(self.low.size)
        self.gripper_dims = tuple(int(d) for d in gripper_dims)
        if any(not 0 <= d < self.action_dim for d in self.gripper_dims):
            raise ActionTokenError(f"gripper_dims {self.gripper_dims} out of range for D={self.action_dim}")
        if int(chunk) < 1:
            raise ActionTokenError(f"chunk must be >= 1, got {chunk}")
        self.chunk = int(chunk)
        self.gripper_values = (float(gripper_values[0]), float(gripper_values[1]))
        self.token_ids: list[int] | None = None
        self._id_to_bin: np.ndarray | None = None
        if token_ids is not None:
            self._set_token_ids(token_ids)
        self.last_clip_count = 0
        self.last_nan_count = 0

    def _set_token_ids(self, token_ids: Sequence[int]) -> None:
        ids = [int(i) for i in token_ids]
        if len(ids) != self.n_bins:
            raise ActionTokenError(f"token_ids must have n_bins={self.n_bins} entries, got {len(ids)}")
        if len(set(ids)) != len(ids) or min(ids) < 0:
            raise ActionTokenError("token_ids must be distinct non-negative ints")
        lookup = np.full(max(ids) + 1, -1, dtype=np.int64)
        lookup[ids] = np.arange(self.n_bins)
        self.token_ids = ids
        self._id_to_bin = lookup

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dataset(cls, actions: Any, q_low: float = 0.01, q_high: float = 0.99, **kwargs: Any) -> ActionTokenizer:
        """Statistics from the per-dimension ``q_low`` / ``q_high`` quantiles of ``actions [N, D]``
        (numpy's default linear interpolation); other arguments go to the constructor."""
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] == 0:
            raise ActionTokenError(f"from_dataset: actions must be [N, D] with N >= 1, got shape {a.shape}")
        if not np.isfinite(a).all():
            rows = np.nonzero(~np.isfinite(a).all(axis=1))[0][:5].tolist()
            raise ActionTokenError(f"from_dataset: non-finite actions in rows {rows} (first 5); clean the dataset")
        if not 0.0 <= q_low < q_high <= 1.0:
            raise ActionTokenError(f"need 0 <= q_low < q_high <= 1, got {q_low}, {q_high}")
        low = np.quantile(a, q_low, axis=0)
        high = np.quantile(a, q_high, axis=0)
        return cls(low, high, **kwargs)

    # ------------------------------------------------------------------ geometry
    @property
    def bin_width(self) -> float:
        """Width of one bin in normalised units (``2 / n_bins``)."""
        return 2.0 / self.n_bins

    def bin_edges(self) -> np.ndarray:
        """``[D, n_bins + 1]`` bin edges in the original action scale."""
        u = np.linspace(-1.0, 1.0, self.n_bins + 1)
        return self._denormalise(np.broadcast_to(u[:, None], (u.size, self.action_dim))).T

    def bin_centers(self) -> np.ndarray:
        """``[D, n_bins]`` bin centres in the original action scale (before gripper binarisation)."""
        u = -1.0 + (np.arange(self.n_bins) + 0.5) * self.bin_width
        return self._denormalise(np.broadcast_to(u[:, None], (u.size, self.action_dim))).T

    @property
    def tokens_per_action(self) -> int:
        """Tokens per action (``D``)."""
        return self.action_dim

    @property
    def tokens_per_chunk(self) -> int:
        """Tokens per chunk (``chunk * D``)."""
        return self.chunk * self.action_dim

    def _normalise(self, a: np.ndarray) -> np.ndarray:
        span = self.high - self.low
        safe = np.where(span > 0, span, 1.0)
        return np.where(span > 0, 2.0 * (a - self.low) / safe - 1.0, 0.0)

    def _denormalise(self, u: np.ndarray) -> np.ndarray:
        return self.low + (u + 1.0) * (self.high - self.low) / 2.0

    # ------------------------------------------------------------------ continuous actions
    def normalise(self, actions: Any) -> np.ndarray:
        """Actions ``[..., D]`` in the normalised space of the continuous heads: ``low -> -1``, ``high -> +1`` per
        dimension (a dimension with ``low == high`` maps to 0); not clipped (float64)."""
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim == 0 or a.shape[-1] != self.action_dim:
            raise ActionTokenError(f"normalise: actions must be [..., D={self.action_dim}], got shape {a.shape}")
        return self._normalise(a)

    def to_env(self, normalised: Any) -> np.ndarray:
        """What the env executes for normalised continuous actions ``[..., D]``: clipped to [-1, 1], mapped back to
        [low, high], gripper dims binarised to ``gripper_values`` by sign, as :meth:`decode` does for bins (float64)."""
        u = np.clip(np.asarray(normalised, dtype=np.float64), -1.0, 1.0)
        if u.ndim == 0 or u.shape[-1] != self.action_dim:
            raise ActionTokenError(f"to_env: actions must be [..., D={self.action_dim}], got shape {u.shape}")
        a = self._denormalise(u)
        for d in self.gripper_dims:
            a[..., d] = np.where(u[..., d] < 0.0, self.gripper_values[0], self.gripper_values[1])
        return a

    # ------------------------------------------------------------------ encode / decode
    def encode(self, actions: Any) -> np.ndarray:
        """Bins (int64, same shape) of ``actions [..., D]``; clipped entries are counted in
        ``last_clip_count`` (NaN included, also counted in ``last_nan_count``)."""
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim == 0 or a.shape[-1] != self.action_dim:
            raise ActionTokenError(f"encode: actions must be [..., D={self.action_dim}], got shape {a.shape}")
        nan = np.isnan(a)
        u = self._normalise(np.where(nan, (self.low + self.high) / 2.0, a))
        outside = ~nan & ((a < self.low) | (a > self.high))
        self.last_nan_count = int(nan.sum())
        self.last_clip_count = int(nan.sum() + outside.sum())
        u = np.clip(u, -1.0, 1.0)
        return np.minimum(np.floor((u + 1.0) / self.bin_width), self.n_bins - 1).astype(np.int64)

    def decode(self, bins: Any) -> np.ndarray:
        """Actions ``[..., D]`` (float64) at the bin centres; gripper dims binarised."""
        b = np.asarray(bins)
        self._check_bins(b, "decode")
        u = -1.0 + (b + 0.5) * self.bin_width
        a = self._denormalise(u)
        for d in self.gripper_dims:
            a[..., d] = np.where(u[..., d] < 0.0, self.gripper_values[0], self.gripper_values[1])
        return a

    def _check_bins(self, b: np.ndarray, where: str) -> None:
        if b.ndim == 0 or b.shape[-1] != self.action_dim:
            raise ActionTokenError(f"{where}: bins must be [..., D={self.action_dim}], got shape {b.shape}")
        if b.dtype.kind not in "iu":
            raise ActionTokenError(f"{where}: bins must be integers, got dtype {b.dtype}")
        if b.size and (b.min() < 0 or b.max() >= self.n_bins):
            raise ActionTokenError(f"{where}: bins must be in [0, {self.n_bins}), got range [{b.min()}, {b.max()}]")

    # ------------------------------------------------------------------ vocabulary
    def to_token_ids(self, bins: Any) -> Any:
        """Vocabulary ids of ``bins`` (numpy array or torch tensor in, same type out)."""
        ids = self._require_ids()
        if _is_tensor(bins):
            import torch

            if bins.numel() and (int(bins.min()) < 0 or int(bins.max()) >= self.n_bins):
                raise ActionTokenError(f"to_token_ids: bins must be in [0, {self.n_bins})")
            return torch.as_tensor(ids, device=bins.device)[bins.long()]
        b = np.asarray(bins)
        if b.dtype.kind not in "iu" or (b.size and (b.min() < 0 or b.max() >= self.n_bins)):
            raise ActionTokenError(
                f"to_token_ids: bins must be integers in [0, {self.n_bins}), got {b.dtype} {b.min() if b.size else ''}..{b.max() if b.size else ''}"
            )
        return np.asarray(ids, dtype=np.int64)[b]

    def from_token_ids(self, token_ids: Any) -> Any:
        """Bins of vocabulary ids; an id that is not an action token raises :class:`ActionTokenError`
        naming it and its position."""
        self._require_ids()
        lookup = self._id_to_bin
        assert lookup is not None
        if _is_tensor(token_ids):
            import torch

            flat = token_ids.detach().long().cpu().numpy()
            return torch.as_tensor(self._lookup_bins(flat, lookup), device=token_ids.device)
        return self._lookup_bins(np.asarray(token_ids), lookup)

    @staticmethod
    def _lookup_bins(ids: np.ndarray, lookup: np.ndarray) -> np.ndarray:
        if ids.dtype.kind not in "iu":
            raise ActionTokenError(f"from_token_ids: ids must be integers, got dtype {ids.dtype}")
        inside = (ids >= 0) & (ids < lookup.size)
        bins = np.where(inside, lookup[np.clip(ids, 0, lookup.size - 1)], -1)
        if (bins < 0).any():
            pos = tuple(int(p[0]) for p in np.nonzero(bins < 0))
            raise ActionTokenError(
                f"from_token_ids: id {int(ids[pos])} at position {pos} is not an action token "
                f"({int((bins < 0).sum())} such ids)"
            )
        return bins.astype(np.int64)

    def _require_ids(self) -> list[int]:
        if self.token_ids is None:
            raise ActionTokenError("this ActionTokenizer has no token_ids; pass token_ids=action_token_ids(tokenizer)")
        return self.token_ids

    def vocab_mask(self, vocab_size: int) -> np.ndarray:
        """``[vocab_size]`` bool, True at the action token ids (to restrict sampling to them)."""
        ids = self._require_ids()
        if max(ids) >= vocab_size:
            raise ActionTokenError(f"action token id {max(ids)} >= vocab_size {vocab_size}")
        mask = np.zeros(vocab_size, dtype=bool)
        mask[ids] = True
        return mask

    # ------------------------------------------------------------------ chunks
    def flatten_chunk(self, x: Any) -> np.ndarray:
        """``[..., chunk, D] -> [..., chunk * D]`` (time-major: entry ``t * D + d``)."""
        a = np.asarray(x)
        if a.ndim < 2 or a.shape[-2:] != (self.chunk, self.action_dim):
            raise ActionTokenError(f"flatten_chunk: expected [..., {self.chunk}, {self.action_dim}], got {a.shape}")
        return a.reshape(*a.shape[:-2], self.tokens_per_chunk)

    def unflatten_chunk(self, x: Any) -> np.ndarray:
        """``[..., chunk * D] -> [..., chunk, D]`` (inverse of :meth:`flatten_chunk`)."""
        a = np.asarray(x)
        if a.ndim < 1 or a.shape[-1] != self.tokens_per_chunk:
            raise ActionTokenError(f"unflatten_chunk: expected [..., {self.tokens_per_chunk}], got {a.shape}")
        return a.reshape(*a.shape[:-1], self.chunk, self.action_dim)

    def encode_chunk(self, actions: Any) -> np.ndarray:
        """``[..., chunk, D]`` actions -> ``[..., chunk * D]`` token ids."""
        return self.to_token_ids(self.flatten_chunk(self.encode(actions)))

    def decode_chunk(self, token_ids: Any) -> np.ndarray:
        """``[..., chunk * D]`` token ids -> ``[..., chunk, D]`` actions."""
        ids = token_ids.detach().cpu().numpy() if _is_tensor(token_ids) else np.asarray(token_ids)
        return self.decode(self.unflatten_chunk(self.from_token_ids(ids)))

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable statistics and settings."""
        return {
            "version": STATS_VERSION,
            "low": self.low.tolist(),
            "high": self.high.tolist(),
            "n_bins": self.n_bins,
            "token_ids": self.token_ids,
            "gripper_dims": list(self.gripper_dims),
            "chunk": self.chunk,
            "gripper_values": list(self.gripper_values),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], token_ids: Sequence[int] | None = None) -> ActionTokenizer:
        """Inverse of :meth:`to_dict`; ``token_ids`` overrides the stored ids (another tokenizer)."""
        if data.get("version") != STATS_VERSION:
            raise ActionTokenError(f"action tokenizer stats version {data.get('version')!r}, expected {STATS_VERSION}")
        return cls(
            data["low"],
            data["high"],
            n_bins=data["n_bins"],
            token_ids=token_ids if token_ids is not None else data.get("token_ids"),
            gripper_dims=tuple(data.get("gripper_dims", ())),
            chunk=data.get("chunk", 1),
            gripper_values=tuple(data.get("gripper_values", (-1.0, 1.0))),
        )

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_dict` as JSON (checkpoints carry the normalisation statistics)."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path, token_ids: Sequence[int] | None = None) -> ActionTokenizer:
        """Read a file written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()), token_ids=token_ids)


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


# ============================================================================ log-prob groups
def group_size(granularity: str, action_dim: int, chunk: int = 1) -> int:
    """Tokens per group: 1 (token), ``action_dim`` (action) or ``action_dim * chunk`` (chunk)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if action_dim < 1 or chunk < 1:
        raise ValueError(f"action_dim and chunk must be >= 1, got {action_dim}, {chunk}")
    return {"token": 1, "action": action_dim, "chunk": action_dim * chunk}[granularity]


def _grouped(x: Any, size: int, where: str) -> Any:
    if x.ndim != 2:
        raise ValueError(f"{where}: expected [B, T], got shape {tuple(x.shape)}")
    if x.shape[1] % size:
        raise ValueError(f"{where}: T={x.shape[1]} is not a multiple of the group size {size}")
    return x.reshape(x.shape[0], x.shape[1] // size, size)


def group_logp(token_logp: Any, granularity: str, action_dim: int, chunk: int = 1, mask: Any = None) -> Any:
    """Sum token log-probs ``[B, T]`` per action or per chunk: ``[B, T / group]``.

    With ``mask [B, T]`` the masked-out tokens contribute 0 (combine with :func:`group_mask`).
    Works on torch tensors (differentiable) and numpy arrays.
    """
    size = group_size(granularity, action_dim, chunk)
    x = token_logp if mask is None else token_logp * mask
    if size == 1:
        return x
    return _grouped(x, size, "group_logp").sum(-1)


def group_mask(mask: Any, granularity: str, action_dim: int, chunk: int = 1, strict: bool = True) -> Any:
    """Group validity ``[B, T / group]``: True when every token of the group is valid.

    ``strict`` raises :class:`PartialGroupError` when a group is only partly valid (padding
    that cuts an action in two is a bug upstream).
    """
    size = group_size(granularity, action_dim, chunk)
    g = _grouped(mask, size, "group_mask") != 0
    full = g.all(-1)
    if strict:
        partial = g.any(-1) & ~full
        if bool(partial.any()):
            idx = partial.nonzero() if not isinstance(partial, np.ndarray) else np.argwhere(partial)
            raise PartialGroupError(
                f"group_mask: {int(partial.sum())} {granularity} groups are partly masked, first at {tuple(int(v) for v in idx[0])}"
            )
    return full
