"""The metrics of one RL update: per-micro-batch loss terms summed over the update's optimizer steps, and the gap
between the trainer's and the rollout engine's log-probs measured before the first of them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor

from mmrl import algos


@dataclass
class UpdateStats:
    """Weighted sums of per-token quantities over the micro-batches of an update."""

    sums: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def add_rollout_gap(self, logp: Tensor, rollout_logp: Tensor, mask: Tensor, cap: float) -> None:
        """|trainer - rollout engine| log-prob gap (summed) and the extreme importance ratios of a micro-batch's
        ``mask``-ed tokens (none: a dummy or ballast micro-batch, which adds nothing)."""
        self.add("rollout/logp_abs_diff_sum", float(((logp - rollout_logp).abs() * mask).sum()))
        self.add("rollout/tokens", float(mask.sum()))
        if bool(mask.any()):
            ist = algos.importance_stats(logp, rollout_logp, mask, cap=cap)
            self.sums["rollout/is_ratio_max"] = max(self.sums.get("rollout/is_ratio_max", 0.0), ist["ratio_max"])
            self.sums["rollout/is_ratio_min"] = min(self.sums.get("rollout/is_ratio_min", math.inf), ist["ratio_min"])

    def metrics(self, n_updates: int) -> dict[str, float]:
        """The update's metrics: each loss term's mean over the ``n_updates`` optimizer steps; the mean log-prob gap
        per token (absent when this process had no row in the first minibatch and ran a dummy forward) and the
        extreme importance ratios (absent when no token was measured)."""
        out = {k: v / n_updates for k, v in self.sums.items() if not k.startswith("rollout/")}
        toks = self.sums["rollout/tokens"]  # the first micro-batch always adds its count (0 for a dummy)
        if toks:
            out["rollout/logp_abs_diff"] = self.sums["rollout/logp_abs_diff_sum"] / toks
        for k in ("rollout/is_ratio_max", "rollout/is_ratio_min"):
            if k in self.sums and math.isfinite(self.sums[k]):
                out[k] = self.sums[k]
        return out
