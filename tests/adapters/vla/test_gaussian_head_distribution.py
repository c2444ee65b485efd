"""The Gaussian chunk head (OpenVLA-OFT parallel decoding) against references that do not come from the head (issue 41).

- The policy's sampling path (``GaussianRule.sample``, the one rollouts use) draws from N(mean, exp(log_std)^2): the
  mean and std of many seeded draws match the head's mean and std within statistical tolerance, and the log-prob
  it records is the density of that Gaussian (torch.distributions, not mmrl's formula).
- Its cross-attention honours the prefix padding mask: padding tokens cannot move the mean or the log-std, and get
  no gradient (as the flow expert's test checks for the flow head).
- The head's forward is recomputed here from its parameters with plain tensor algebra (LayerNorm, softmax attention,
  exact GELU written out), and the log-prob of a chunk is checked against a Normal log density around *that* mean.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from mmrl.adapters.vla import gaussian_head
from mmrl.adapters.vla.continuous_heads import GaussianRule
from mmrl.adapters.vla.gaussian_head import GaussianChunkHead

torch.set_num_threads(1)

PREFIX_DIM, CHUNK, ACTION_DIM, WIDTH, HEADS = 6, 3, 2, 8, 2
KINDS = gaussian_head.LOG_STD_KINDS


def make_head(kind: str, *, num_layers: int = 1, seed: int = 0) -> GaussianChunkHead:
    torch.manual_seed(seed)
    head = GaussianChunkHead(
        PREFIX_DIM, CHUNK, ACTION_DIM, log_std=kind, width=WIDTH, num_heads=HEADS, num_layers=num_layers
    )
    with torch.no_grad():  # spread the outputs so that mean and std differ per element (and from the init values)
        head.mean_out.bias.copy_(torch.tensor([0.7, -1.3]))
        if kind == "learned":
            head.log_std.copy_(torch.tensor([-0.4, 0.3]))
        else:
            head.log_std_out.weight.normal_(0.0, 0.15, generator=torch.Generator().manual_seed(5))
    return head


def prefix(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = torch.randn(2, 5, PREFIX_DIM, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, 3:] = False  # row 0: two padding tokens
    return hidden, mask


# ------------------------------------------------------------------------------------------- the sampled distribution
@pytest.mark.parametrize("kind", KINDS)
def test_the_policy_samples_from_the_gaussian_its_log_prob_assumes(kind):
    head = make_head(kind)
    hidden, mask = prefix()
    rule = GaussianRule(SimpleNamespace())
    module = SimpleNamespace(head=head)
    n = 4000
    index = torch.zeros(n, dtype=torch.long)  # n episodes observing row 0's prefix, each with its own seed
    exec_mask = torch.ones(n, CHUNK, dtype=torch.bool)
    dim_mask = torch.ones(ACTION_DIM, dtype=torch.bool)
    with torch.no_grad():
        actions, logp, record = rule.sample(
            module, hidden, mask, index, list(range(n)), greedy=False, exec_mask=exec_mask, dim_mask=dim_mask
        )
        mean, log_std = head(hidden, mask)
    mu, sigma = mean[0], log_std[0].exp()  # [H, A]
    assert float(sigma.min()) > 0.05 and float(sigma.max() / sigma.min()) > 1.2  # elements differ in std
    # per element: the draws' mean within 5 standard errors of mu, their std within 5 standard errors of sigma
    assert torch.all((actions.mean(0) - mu).abs() < 5 * sigma / math.sqrt(n))
    assert torch.all((actions.std(0) - sigma).abs() < 5 * sigma / math.sqrt(2 * (n - 1)))
    # standardised draws are N(0, 1) jointly: second moment 1, no correlation between the two action dims
    z = (actions - mu) / sigma
    assert float(z.pow(2).mean()) == pytest.approx(1.0, abs=5 * math.sqrt(2 / z.numel()))
    assert abs(float((z[..., 0] * z[..., 1]).mean())) < 5 / math.sqrt(n * CHUNK)
    # the recorded log-prob is the density of that Gaussian at the draw (torch's Normal, summed over the chunk)
    ref = torch.distributions.Normal(mu, sigma).log_prob(actions).sum((1, 2))
    torch.testing.assert_close(logp, ref, rtol=1e-5, atol=1e-4)
    assert torch.equal(record["actions"], actions)
    # and training recomputes the same value from the record
    again, _, _ = rule.log_prob(
        module, hidden, mask, index, record, exec_mask=exec_mask, dim_mask=dim_mask, entropy=False
    )
    torch.testing.assert_close(again, logp, rtol=0, atol=1e-5)


def test_same_seed_same_draw_and_greedy_is_the_mean():
    head = make_head("learned")
    hidden, mask = prefix()
    rule, module = GaussianRule(SimpleNamespace()), SimpleNamespace(head=head)
    kw = dict(exec_mask=torch.ones(2, CHUNK, dtype=torch.bool), dim_mask=torch.ones(ACTION_DIM, dtype=torch.bool))
    with torch.no_grad():
        a, _, _ = rule.sample(module, hidden, mask, torch.tensor([0, 1]), [7, 8], greedy=False, **kw)
        b, _, _ = rule.sample(module, hidden, mask, torch.tensor([1, 0]), [8, 7], greedy=False, **kw)
        g, glogp, _ = rule.sample(module, hidden, mask, torch.tensor([0, 1]), [7, 8], greedy=True, **kw)
        mean, _ = head(hidden, mask)
    assert torch.equal(a, b.flip(0))  # a row's draw depends on its seed only, not on its place in the batch
    assert torch.equal(g, mean) and torch.equal(glogp, torch.zeros(2))


# ------------------------------------------------------------------------------------------- the padding mask
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_layers", [1, 2])
def test_padding_tokens_cannot_move_the_output_and_get_no_gradient(kind, num_layers):
    head = make_head(kind, num_layers=num_layers)
    hidden, mask = prefix()
    mean, log_std = head(hidden, mask)
    # (not a constant shift of a token: the prefix LayerNorm would remove that whether or not the mask works)
    noise = torch.randn(2, PREFIX_DIM, generator=torch.Generator().manual_seed(9))
    moved = hidden.clone()
    moved[0, 3:] = 50.0 * noise  # row 0's padding tokens
    mean2, log_std2 = head(moved, mask)
    torch.testing.assert_close(mean2, mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(log_std2, log_std, rtol=0, atol=1e-6)
    real = hidden.clone()
    real[0, 1] += 3.0 * noise[0]  # a real token of row 0 does move its output (and only row 0's)
    mean3, _ = head(real, mask)
    assert float((mean3[0] - mean[0]).abs().max()) > 1e-3 and torch.equal(mean3[1], mean[1])
    hidden.requires_grad_(True)
    mean, log_std = head(hidden, mask)
    (mean.sum() + log_std.sum() if kind == "state" else mean.sum()).backward()
    assert torch.equal(hidden.grad[0, 3:], torch.zeros(2, PREFIX_DIM))
    assert float(hidden.grad[0, :3].abs().min()) > 0 and float(hidden.grad[1].abs().sum()) > 0


# ------------------------------------------------------------------------------------------- an independent forward
def _layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _attention(att, h: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v per head, padding keys excluded, then the output projection."""
    w = h.shape[-1]
    d = w // HEADS
    q = h @ att.q.weight.T + att.q.bias
    kv = memory @ att.kv.weight.T + att.kv.bias
    k, v = kv[..., :w], kv[..., w:]
    out = torch.zeros_like(q)
    for b in range(h.shape[0]):
        for head in range(HEADS):
            cols = slice(head * d, (head + 1) * d)
            scores = q[b, :, cols] @ k[b, :, cols].T / math.sqrt(d)
            if mask is not None:
                scores = scores.masked_fill(~mask[b][None, :], float("-inf"))
            out[b, :, cols] = torch.softmax(scores, dim=-1) @ v[b, :, cols]
    return out @ att.out.weight.T + att.out.bias


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def reference_forward(head: GaussianChunkHead, hidden: torch.Tensor, mask: torch.Tensor):
    """OFT's parallel decoding written out: queries cross-attend to the normalised prefix, self-attend, MLP (pre-norm
    residual blocks), a final norm, then linear maps to the mean and (state kind) the bounded log-std."""
    h = head.queries[None].expand(hidden.shape[0], -1, -1)
    for layer in head.layers:
        h = h + _attention(layer.cross, _layer_norm(h, layer.cross_norm), _layer_norm(hidden, layer.prefix_norm), mask)
        q = _layer_norm(h, layer.self_norm)
        h = h + _attention(layer.self_attn, q, q, None)
        fc1, fc2 = layer.mlp[0], layer.mlp[2]
        h = h + (_gelu(_layer_norm(h, layer.mlp_norm) @ fc1.weight.T + fc1.bias) @ fc2.weight.T + fc2.bias)
    features = _layer_norm(h, head.out_norm)
    mean = features @ head.mean_out.weight.T + head.mean_out.bias
    if head.log_std_kind == "learned":
        log_std = head.log_std.expand_as(mean)
    else:
        low, high = head.log_std_bounds
        log_std = low + (high - low) * torch.sigmoid(features @ head.log_std_out.weight.T + head.log_std_out.bias)
    return mean, log_std


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_layers", [1, 2])
def test_mean_log_std_and_log_prob_against_an_independent_forward(kind, num_layers):
    head = make_head(kind, num_layers=num_layers)
    hidden, mask = prefix()
    with torch.no_grad():
        mean, log_std = head(hidden, mask)
        ref_mean, ref_log_std = reference_forward(head, hidden, mask)
    torch.testing.assert_close(mean, ref_mean, rtol=0, atol=1e-5)
    torch.testing.assert_close(log_std, ref_log_std, rtol=0, atol=1e-5)
    # a chunk whose second step was not executed and whose last action dim is padding: those elements drop out
    actions = torch.tensor([[[0.5, -1.0], [2.0, 9.0], [-0.3, 0.1]], [[1.0, 0.0], [-2.0, 3.0], [0.0, 0.4]]])
    exec_mask = torch.tensor([[True, False, True], [True, True, True]])
    dim_mask = torch.tensor([True, False])
    keep = exec_mask[:, :, None] & dim_mask[None, None, :]
    density = torch.distributions.Normal(ref_mean, ref_log_std.exp()).log_prob(actions)
    expected = torch.where(keep, density, torch.zeros_like(density)).sum((1, 2))
    got = gaussian_head.log_prob(actions, *head(hidden, mask), exec_mask, dim_mask)
    torch.testing.assert_close(got.detach(), expected, rtol=1e-5, atol=1e-5)
