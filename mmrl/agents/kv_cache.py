"""Continuing each turn of a batch of trajectories from the previous turn's KV cache (Qwen-VL families).

After a turn's ``generate`` the cache holds, per row, the left-padded sequence it was given plus the sampled tokens
but the last one (tokens after a row's end, and tokens cut by the token budget, are in it too). The next turn passes
``generate`` the same cache (rows of finished trajectories dropped) and, per row, ``input_ids`` = the cached columns
(pads where they are not part of the trajectory any more) followed by the trajectory tokens the cache does not hold
yet (the end of the last turn, the observation with its images), left-padded to a common width. The attention mask
is 1 exactly on trajectory tokens, so the garbage columns are never attended to; transformers computes the rotary
positions of the uncached tokens over the whole masked sequence (``get_rope_index``; 3-D for the new images) and the
model runs only the uncached tokens, with the vision features of the NEW images only. Text and images of earlier
turns are never encoded again.

:class:`TurnCache` is that bookkeeping; tested against re-encoding the whole sequence each turn (same tokens, same
behaviour log-probs within 1e-5, tests/agents/test_kv_cache.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from mmrl.agents.trajectory import Trajectory
from mmrl.policies.token_policy import left_pad
from mmrl.policies.vlm_inputs import ImageFeatures, merge_features


def _image_runs(mm: Tensor) -> int:
    """How many images a token-type row holds (runs of non-zero types)."""
    if mm.numel() == 0:
        return 0
    on = (mm != 0).long()
    return int(on[0]) + int(((on[1:] - on[:-1]) == 1).sum())


@dataclass
class TurnCache:
    """The KV cache of the rows of the last ``generate`` and what its columns hold."""

    cache: Any
    rows: list[int]
    """Trajectory index of each cache row."""
    ids: Tensor
    """[R, C] token ids of the cached columns (pads where not a trajectory token)."""
    att: Tensor
    """[R, C] 1 where the column is a trajectory token."""
    mm: Tensor
    """[R, C] token types of the cached columns."""
    rope_deltas: Tensor | None

    @staticmethod
    def after_generate(cache, rows: list[int], inputs: dict, gen_ids: Tensor, kept: Sequence[int], rope_deltas):
        """The state after a ``generate`` over ``inputs`` for trajectories ``rows``, which sampled ``gen_ids``
        ([R, L]) of which each row kept ``kept[r]`` tokens. None when the cache is not the expected width."""
        L = gen_ids.shape[1]
        ids_in = inputs["input_ids"].cpu()
        width = ids_in.shape[1] + max(L - 1, 0)
        if L == 0 or cache.get_seq_length() != width:
            return None
        fed = gen_ids[:, : L - 1]
        keep = (torch.arange(L - 1)[None, :] < torch.tensor(list(kept))[:, None].clamp(max=L - 1)).long()
        att = torch.cat([inputs["attention_mask"].cpu().long(), keep], 1)
        mm_in = inputs.get("mm_token_type_ids")
        mm_in = mm_in.cpu().long() if mm_in is not None else torch.zeros_like(ids_in)
        return TurnCache(
            cache=cache,
            rows=list(rows),
            ids=torch.cat([ids_in, fed], 1),
            att=att,
            mm=torch.cat([mm_in, torch.zeros_like(fed)], 1),
            rope_deltas=rope_deltas.detach().clone() if rope_deltas is not None else None,
        )

    def continue_inputs(self, policy: Any, active: list[int], trajs: Sequence[Trajectory]) -> dict | None:
        """``generate`` inputs for the trajectories ``active`` (a subset of :attr:`rows`, same order) that continue
        from the cache; None when a row's cached tokens are not the start of its trajectory (then re-encode)."""
        where = {k: i for i, k in enumerate(self.rows)}
        if any(k not in where for k in active):
            return None
        idx = torch.tensor([where[k] for k in active], dtype=torch.long)
        ids, att, mm = self.ids[idx], self.att[idx], self.mm[idx]
        image_dim = policy.family_layer.image_dim
        new_ids, new_mm, new_feats, grids = [], [], [], []
        for r, k in enumerate(active):
            full = trajs[k].full_inputs(image_dim)
            n = int(att[r].sum())
            if not torch.equal(ids[r][att[r].bool()], full.input_ids[:n]):
                return None
            new_ids.append(full.input_ids[n:])
            new_mm.append(full.mm_token_type_ids[n:])
            if full.image_grid_thw is not None:
                grids.append(full.image_grid_thw)
            seen = _image_runs(full.mm_token_type_ids[:n])
            if full.num_images > seen:
                if full.features is None:
                    return None
                f = full.features
                deep = [layer[seen:] for layer in f.deepstack] if f.deepstack is not None else None
                new_feats.append(ImageFeatures(embeds=f.embeds[seen:], deepstack=deep, output_cls=f.output_cls))
        n_ids, n_att = left_pad(new_ids, policy.pad_id)
        n_mm, _ = left_pad(new_mm, 0)
        self.cache.batch_select_indices(idx.to(policy.device))
        base = policy.module.lm.get_base_model() if hasattr(policy.module.lm, "get_base_model") else policy.module.lm
        if self.rope_deltas is not None:
            base.model.rope_deltas = self.rope_deltas[idx.to(self.rope_deltas.device)]
        dev = policy.device
        from mmrl.rollout.token_sampler import cache_kwarg

        inputs: dict[str, Any] = {
            "input_ids": torch.cat([ids, n_ids], 1).to(dev),
            "attention_mask": torch.cat([att, n_att], 1).to(dev),
            "mm_token_type_ids": torch.cat([mm, n_mm], 1).to(dev),
            cache_kwarg(policy.module.lm): self.cache,
        }
        if grids:
            inputs["image_grid_thw"] = torch.cat(grids).to(dev)
        if new_feats:
            inputs["mm_encoder_outputs"] = {"image": merge_features(new_feats)}
        return inputs
