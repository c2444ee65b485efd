"""With several processes the update sees the global batch as one process does: GAE's advantages are whitened over
all ranks' actions (:func:`mmrl.parallel.global_batch.gae_of_rank`) and PPO's minibatches are drawn from the global batch
(:func:`mmrl.parallel.global_batch.local_rows`). The 2-process == 1-process runs are in test_fsdp.py; these are the pure parts."""

import pytest
import torch

from mmrl import algos
from mmrl.config import load_config
from mmrl.parallel.global_batch import gae_of_rank, local_rows


def _part(rows, T, gen, *, kl=False):
    mask = torch.zeros(rows, T)
    for r in range(rows):  # episodes of different lengths (trailing holes)
        mask[r, : int(torch.randint(1, T + 1, (1,), generator=gen))] = 1.0
    return {
        "rewards": torch.randn(rows, generator=gen),
        "group_id": torch.arange(rows) // 2,
        "valid": torch.ones(rows, dtype=torch.bool),
        "mask": mask,
        "values": torch.randn(rows, T, generator=gen) * mask,
        "token_rewards": torch.randn(rows, T, generator=gen) * mask,
        "kl_tok": torch.randn(rows, T, generator=gen) * mask if kl else None,
    }


@pytest.mark.parametrize("kl", [False, True])
def test_gae_of_rank_equals_one_process_gae_and_local_whitening_does_not(kl):
    algo = load_config(["algo=ppo", "algo.kl_in_reward=true", "algo.kl_coef=0.1"] if kl else ["algo=ppo"]).algo
    gen = torch.Generator().manual_seed(0)
    parts = [_part(3, 5, gen, kl=kl), _part(2, 3, gen, kl=kl)]  # ranks with different T (padded to the longest)
    width = 5

    def pad(x):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]))

    whole = {
        k: (None if parts[0][k] is None else torch.cat([pad(p[k]) if p[k].dim() == 2 else p[k] for p in parts]))
        for k in parts[0]
    }
    adv, ret = algos.token_advantages(
        whole["rewards"],
        whole["group_id"],
        whole["valid"],
        whole["mask"],
        algo,
        kl_tok=whole["kl_tok"],
        values=whole["values"],
        token_rewards=whole["token_rewards"],
    )
    got = [gae_of_rank(parts, r, algo) for r in range(2)]
    assert [a.shape for a, _ in got] == [(3, 5), (2, 3)]
    assert torch.allclose(torch.cat([pad(a) for a, _ in got]), adv, atol=1e-6)
    assert torch.allclose(torch.cat([pad(r) for _, r in got]), ret, atol=1e-6)
    # the bug this replaces: each rank whitening its own shard gives other advantages (returns are per sample)
    shard = algos.token_advantages(
        parts[1]["rewards"],
        parts[1]["group_id"],
        parts[1]["valid"],
        parts[1]["mask"],
        algo,
        kl_tok=parts[1]["kl_tok"],
        values=parts[1]["values"],
        token_rewards=parts[1]["token_rewards"],
    )
    assert not torch.allclose(shard[0], got[1][0], atol=1e-3)
    assert torch.allclose(shard[1], got[1][1], atol=1e-6)


def test_local_rows_split_every_global_minibatch_between_the_ranks():
    sizes = [3, 2, 4]  # ranks may hold different numbers of rows (invalid rows dropped)
    offsets = [0, 3, 5]
    order = torch.randperm(sum(sizes), generator=torch.Generator().manual_seed(1))
    for gmb in torch.tensor_split(order, 3):
        mine = [local_rows(gmb, o, n) for o, n in zip(offsets, sizes)]
        assert all(((m >= 0) & (m < n)).all() for m, n in zip(mine, sizes))
        back = sorted(int(i) + o for m, o in zip(mine, offsets) for i in m)
        assert back == sorted(gmb.tolist())  # every row of the global minibatch, on exactly one rank
        for m, o, n in zip(mine, offsets, sizes):  # in the global minibatch's order
            assert m.tolist() == [int(i) - o for i in gmb if o <= int(i) < o + n]
    # one process: the minibatch itself
    assert torch.equal(local_rows(order[:4], 0, 9), order[:4])
    # a rank with none of the minibatch's rows gets an empty one (the update runs a zero-weight dummy forward)
    assert local_rows(torch.tensor([0, 1]), 3, 2).numel() == 0
