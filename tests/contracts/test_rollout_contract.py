"""The [B, T] Rollout contract, layout-independent sampling noise and the seeded token sampler."""

import pytest
import torch

from mmrl.policies.base import PromptBatch, Rollout
from mmrl.rollout.noise import counter_uniform, mix_seed
from mmrl.rollout.token_sampler import SeededTokenSampler, completion_mask, top_p_mask


def _ro(B, T, offset=0):
    return Rollout(
        rollout_logp=torch.arange(B * T, dtype=torch.float32).view(B, T) + offset,
        mask=torch.ones(B, T),
        group_id=torch.arange(B) // 2 + offset,
        samples=[f"s{i + offset}" for i in range(B)],
        payload={"ids": [torch.arange(i + 1) for i in range(B)], "fixed": torch.zeros(B, 3)},
    )


def test_index_selects_every_field():
    ro = _ro(4, 3).index(torch.tensor([3, 1]))
    assert ro.samples == ["s3", "s1"]
    assert ro.rollout_logp[0].tolist() == [9.0, 10.0, 11.0]
    assert [t.numel() for t in ro.payload["ids"]] == [4, 2]
    assert ro.payload["fixed"].shape == (2, 3) and ro.group_id.tolist() == [1, 0]


def test_concat_pads_actions_and_joins_payloads():
    ro = Rollout.concat([_ro(2, 3), _ro(2, 5, offset=100)])
    assert ro.mask.shape == (4, 5)
    assert ro.mask[:2, 3:].sum() == 0 and ro.mask[2:].sum() == 10  # padding is masked out
    assert ro.samples[-1] == "s101" and len(ro.payload["ids"]) == 4


def test_concat_rejects_mismatched_tensor_payloads():
    a, b = _ro(2, 3), _ro(2, 3)
    b.payload["fixed"] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="per-sample lists"):
        Rollout.concat([a, b])


@pytest.mark.parametrize(
    "logp, mask, group_id, samples, match",
    [
        ((2, 3), (2, 4), 2, 2, r"rollout_logp \(2, 3\) and mask \(2, 4\) differ"),
        ((2, 3), (2, 3), 3, 2, "group_id, samples and the .B, T. tensors must have the same batch size"),
        ((2, 3), (2, 3), 2, 1, "group_id, samples and the .B, T. tensors must have the same batch size"),
    ],
)
def test_rollout_shape_checks(logp, mask, group_id, samples, match):
    with pytest.raises(ValueError, match=match):
        Rollout(
            rollout_logp=torch.zeros(*logp),
            mask=torch.zeros(*mask),
            group_id=torch.zeros(group_id),
            samples=list(range(samples)),
            payload=None,
        )
    ok = Rollout(
        rollout_logp=torch.zeros(2, 3), mask=torch.zeros(2, 3), group_id=torch.zeros(2), samples=[0, 1], payload=None
    )  # consistent shapes are accepted, with the documented defaults
    assert ok.valid.tolist() == [True, True] and ok.probe.tolist() == [False, False]


def test_group_ids_unique_per_prompt_even_for_repeated_items():
    b = PromptBatch(items=[{}, {}], indices=[5, 5], seeds=[11, 12])
    assert b.group_ids(3).tolist() == [11, 11, 11, 12, 12, 12]


def test_counter_noise_is_layout_independent_and_uniform():
    seeds = torch.tensor([mix_seed(1, i) for i in range(64)])
    full = counter_uniform(seeds, 3, 50)
    part = counter_uniform(seeds[10:20], 3, 50)
    assert torch.equal(full[10:20], part)  # a row's noise depends only on its own seed
    assert not torch.equal(counter_uniform(seeds, 4, 50), full)  # and on the step
    u = counter_uniform(torch.arange(2000), 0, 100).flatten()
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002


def test_gumbel_sampler_matches_softmax_and_records_logp():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    n = 20000
    sampler = SeededTokenSampler([mix_seed(7, i) for i in range(n)], temperature=1.5)
    out = sampler(torch.zeros(n, 1, dtype=torch.long), logits.expand(n, 4).clone())
    chosen = out.argmax(-1)
    freq = torch.bincount(chosen, minlength=4).float() / n
    probs = (logits[0] / 1.5).softmax(-1)
    # multinomial std of each frequency is sqrt(p(1-p)/n) <= 0.0036; allow 4 sigma
    assert torch.allclose(freq, probs, atol=0.015)
    lp = sampler.behaviour_logp(1)[:, 0]
    assert torch.allclose(lp, (logits[0] / 1.5).log_softmax(-1)[chosen], atol=1e-6)


def test_sampler_suppresses_tokens_and_greedy_is_argmax():
    logits = torch.tensor([[0.0, 5.0, 1.0]]).expand(100, 3).clone()
    s = SeededTokenSampler(list(range(100)), suppress_ids=[1])
    assert (s(torch.zeros(100, 1, dtype=torch.long), logits).argmax(-1) != 1).all()
    g = SeededTokenSampler(list(range(100)), greedy=True)
    assert (g(torch.zeros(100, 1, dtype=torch.long), logits).argmax(-1) == 1).all()


def test_top_p_mask_by_hand():
    # probs 0.5, 0.3, 0.15, 0.05 -> mass before each: 0, .5, .8, .95; top_p=0.8 keeps the first two
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert top_p_mask(logits, 0.8).tolist() == [[False, False, True, True]]
    assert not top_p_mask(logits, 1.0).any()


def test_completion_mask_includes_first_eos_only():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8]])
    mask, trunc = completion_mask(ids, [2])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]] and trunc.tolist() == [False, True]


def test_python_and_tensor_splitmix_agree():
    from mmrl.rollout.noise import _splitmix64_int, splitmix64

    for x in (0, 1, 12345, (1 << 63) + 99, (1 << 64) - 1):
        t = int(splitmix64(torch.tensor(x - (1 << 64) if x >= 1 << 63 else x, dtype=torch.int64)).item())
        assert t % (1 << 64) == _splitmix64_int(x)
    assert mix_seed(1, 2) != mix_seed(2, 1) and 0 <= mix_seed(-5, 7) < (1 << 63)


def test_left_and_right_pad():
    from mmrl.policies.token_policy import left_pad, right_pad

    ids, att = left_pad([torch.tensor([1, 2, 3]), torch.tensor([4])], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and att.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert right_pad([torch.tensor([1, 2]), torch.tensor([3])], 9, 4).tolist() == [[1, 2, 9, 9], [3, 9, 9, 9]]
    assert right_pad([torch.tensor([1, 2, 3])], 9, 2).tolist() == [[1, 2]]


def test_noise_blocks_equal_step_by_step():
    seeds = torch.tensor([3, 99, 12345])
    block = counter_uniform(seeds, torch.arange(2, 6), 7)
    for j, s in enumerate(range(2, 6)):
        assert torch.equal(block[:, j], counter_uniform(seeds, s, 7))
