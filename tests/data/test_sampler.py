"""The prompt sampler's epoch wrap (mmrl/data/sampler.py): the positions of draws across epoch ends, worked by hand,
and the sampler drawing at exactly those positions."""

from __future__ import annotations

from mmrl.data.sampler import PromptSampler, draw_positions


def test_draw_positions_across_epoch_ends():
    # 5 items, at position 3 of epoch 0: 2 draws left in epoch 0, then epoch 1 from its start
    assert draw_positions(0, 3, 4, num_items=5) == [(0, 3), (0, 4), (1, 0), (1, 1)]
    # a state at the very end of an epoch (the last batch ended it): the first draw starts the next epoch
    assert draw_positions(0, 5, 2, num_items=5) == [(1, 0), (1, 1)]
    # 2 items, 5 draws from (2, 1): the last item of epoch 2, then the whole of epochs 3 and 4
    assert draw_positions(2, 1, 5, num_items=2) == [(2, 1), (3, 0), (3, 1), (4, 0), (4, 1)]
    assert draw_positions(7, 0, 0, num_items=3) == []


def test_the_sampler_draws_at_those_positions_and_keeps_the_state_after_the_last():
    s = PromptSampler(3, batch_size=2, seed=0, shuffle=False)  # unshuffled: the item at position p is p
    indices, seeds, positions = s.next_draws()
    assert (indices, positions) == ([0, 1], [(0, 0), (0, 1)])
    assert (s.state.epoch, s.state.position, s.state.step) == (0, 2, 1)
    indices, more_seeds, positions = s.next_draws()
    assert (indices, positions) == ([2, 0], [(0, 2), (1, 0)])
    assert (s.state.epoch, s.state.position, s.state.step) == (1, 1, 2)
    assert len(set(seeds + more_seeds)) == 4  # item 0 again in epoch 1: a seed of its own
    indices, _, positions = s.next_draws(2)
    assert (indices, positions) == ([1, 2], [(1, 1), (1, 2)])
    assert (s.state.epoch, s.state.position) == (1, 3)  # the epoch's end: the next draw wraps, not this one


def test_next_batch_is_next_draws_without_the_positions_and_a_resume_draws_the_same():
    a, b = PromptSampler(5, 3, seed=11), PromptSampler(5, 3, seed=11)
    for _ in range(3):  # 9 draws: epoch 0, then 4 of epoch 1
        indices, seeds, _ = b.next_draws()
        assert a.next_batch() == (indices, seeds)
    assert a.state_dict() == b.state_dict() == {"epoch": 1, "position": 4, "step": 3}
    # each epoch is a permutation of the items
    c = PromptSampler(5, 5, seed=11)
    assert sorted(c.next_batch()[0]) == sorted(c.next_batch()[0]) == [0, 1, 2, 3, 4]
    # a sampler resumed at position 3 of epoch 0 draws what the uninterrupted one drew there
    full = PromptSampler(5, 4, seed=11)
    drawn = full.next_batch(8)
    resumed = PromptSampler(5, 4, seed=11)
    resumed.load_state_dict({"epoch": 0, "position": 3, "step": 0})
    idx, seeds = resumed.next_batch(5)
    assert idx == drawn[0][3:] and seeds == drawn[1][3:]
