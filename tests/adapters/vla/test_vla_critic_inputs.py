"""What the VLA critic reads (issue 41): which layer and which tokens feed V(s).

- Flow and Gaussian heads (``ContinuousVLAModule``): the backbone's LAST hidden states (``hidden_states[-1]``) over the
  prompt's real tokens, plus the projected robot-state token when the policy reads the state; never an earlier
  layer, never a padding token.
- LeRobot heads (``LeRobotFlowModule``): the last kept VLM layer's cached VALUES (``cache.values[-1]``, heads
  flattened) over the prefix's real tokens; never the keys, never an earlier layer, never a padding token.

Each test perturbs what the critic must not read (values unchanged, bit for bit) and what it must read (values
change), and checks V against the value MLP applied to a mean pooled by hand.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mmrl.adapters.vla.continuous_heads import ContinuousVLAModule
from mmrl.adapters.vla.lerobot.policy import LeRobotFlowModule
from mmrl.adapters.vla.lerobot.smolvla import PrefixCache
from mmrl.adapters.vla.value_head import ValueHead

torch.set_num_threads(1)

U, P, D, S = 2, 4, 6, 3  # observations, prompt tokens, hidden width, state dim
MASK = torch.tensor([[True, True, True, False], [True, True, True, True]])  # row 0: one padding token


class LayersLM(nn.Module):
    """A stand-in backbone whose forward returns the given per-layer hidden states (embeddings, layer 1, last)."""

    def __init__(self, layers: list[torch.Tensor]) -> None:
        super().__init__()
        self.layers = layers

    def forward(self, *, input_ids, attention_mask, output_hidden_states, use_cache):
        assert output_hidden_states and not use_cache
        return SimpleNamespace(hidden_states=tuple(self.layers), logits=None)


def _layers(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(U, P, D, generator=g) for _ in range(3)]


def _critic(seed: int = 2) -> ValueHead:
    torch.manual_seed(seed)
    return ValueHead(D, hidden=8)


def _pooled_by_hand(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = []
    for u in range(tokens.shape[0]):
        real = [tokens[u, p] for p in range(tokens.shape[1]) if bool(mask[u, p])]
        rows.append(sum(real) / len(real))
    return torch.stack(rows)


@pytest.mark.parametrize("use_state", [False, True])
def test_continuous_heads_critic_reads_the_last_layer_over_real_tokens(use_state):
    critic = _critic()
    torch.manual_seed(3)
    state_proj = nn.Linear(S, D) if use_state else None
    state = torch.randn(U, S, generator=torch.Generator().manual_seed(4)) if use_state else None

    def values(layers, state=state):
        module = ContinuousVLAModule(LayersLM(layers), nn.Identity(), value_head=critic, state_proj=state_proj)
        inputs = {"input_ids": torch.zeros(U, P, dtype=torch.long), "attention_mask": MASK.long()}
        with torch.no_grad():
            return module(run=lambda m, hidden, mask: m.value(hidden, mask), state=state, **inputs)

    layers = _layers()
    v = values(layers)
    tokens, mask = layers[-1], MASK
    if use_state:  # the state token is one more real token at the end of every row
        with torch.no_grad():
            tokens = torch.cat([tokens, state_proj(state)[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones(U, 1, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        expected = critic.net(_pooled_by_hand(tokens, mask)).squeeze(-1)
    torch.testing.assert_close(v, expected, rtol=0, atol=1e-6)

    g = torch.Generator().manual_seed(7)
    earlier = [layers[0] + torch.randn(U, P, D, generator=g), layers[1] + torch.randn(U, P, D, generator=g), layers[2]]
    assert torch.equal(values(earlier), v)  # the embeddings and the middle layer are not read
    padded = [x.clone() for x in layers]
    padded[-1][0, 3] += 100.0 * torch.randn(D, generator=g)  # row 0's padding token of the last layer
    assert torch.equal(values(padded), v)
    real = [x.clone() for x in layers]
    real[-1][0, 1] += torch.randn(D, generator=g)  # a real token of row 0: row 0's value moves, row 1's does not
    moved = values(real)
    assert float((moved[0] - v[0]).abs()) > 1e-4 and torch.equal(moved[1], v[1])
    if use_state:
        other = state.clone()
        other[1] += 1.0
        changed = values(layers, other)
        assert float((changed[1] - v[1]).abs()) > 1e-4 and torch.equal(changed[0], v[0])


def test_lerobot_critic_reads_the_last_layers_values_over_real_tokens():
    heads, head_dim = 2, 3  # kv heads x head dim = D
    critic = _critic()
    module = LeRobotFlowModule(nn.Module(), value_head=critic)
    g = torch.Generator().manual_seed(0)

    def cache(keys, vals):
        return PrefixCache(keys=keys, values=vals, pad_mask=MASK)

    keys = [torch.randn(U, P, heads, head_dim, generator=g) for _ in range(3)]
    vals = [torch.randn(U, P, heads, head_dim, generator=g) for _ in range(3)]
    with torch.no_grad():
        v = module.value(cache(keys, vals), MASK)
        expected = critic.net(_pooled_by_hand(vals[-1].reshape(U, P, D), MASK)).squeeze(-1)
    torch.testing.assert_close(v, expected, rtol=0, atol=1e-6)

    def value_of(keys, vals):
        with torch.no_grad():
            return module.value(cache(keys, vals), MASK)

    other_keys = [k + torch.randn(k.shape, generator=g) for k in keys]
    assert torch.equal(value_of(other_keys, vals), v)  # keys are not read
    earlier = [vals[0] + 1.0 + torch.randn(vals[0].shape, generator=g), vals[1] * 3.0, vals[2]]
    assert torch.equal(value_of(keys, earlier), v)  # earlier layers are not read
    padded = [x.clone() for x in vals]
    padded[-1][0, 3] += 100.0 * torch.randn(heads, head_dim, generator=g)  # row 0's padding token
    assert torch.equal(value_of(keys, padded), v)
    real = [x.clone() for x in vals]
    real[-1][0, 0, 1] += torch.randn(head_dim, generator=g)  # one head of a real token of row 0
    moved = value_of(keys, real)
    assert float((moved[0] - v[0]).abs()) > 1e-4 and torch.equal(moved[1], v[1])
