"""The LM head restricted to a few token ids (mmrl/adapters/vla/output_vocab.py): values and gradients equal the selected
columns of the full head, the head is put back (also after an error), heads that are not a plain Linear are left
alone, and the VLA policy's log-probs and gradients are those of the full-vocabulary path."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from mmrl.adapters.vla.output_vocab import SubsetHead, restricted_output_vocab  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import load_vlm  # noqa: E402


def test_subset_head_is_the_selected_rows_by_hand():
    head = nn.Linear(2, 3)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.0]]))
        head.bias.copy_(torch.tensor([0.1, 0.2, 0.3]))
    h = torch.tensor([[2.0, 1.0]])
    out = SubsetHead(head, torch.tensor([2, 0]))(h)
    # row 2: 0.5*2 + 0*1 + 0.3 = 1.3; row 0: 1*2 + 2*1 + 0.1 = 4.1 (in the order of ids)
    assert torch.allclose(out, torch.tensor([[1.3, 4.1]]))
    out.sum().backward()
    # d/dW of the selected rows is h; the row not selected gets no gradient
    assert torch.equal(head.weight.grad, torch.tensor([[2.0, 1.0], [0.0, 0.0], [2.0, 1.0]]))
    assert torch.equal(head.bias.grad, torch.tensor([1.0, 0.0, 1.0]))


@pytest.fixture(scope="module")
def lm():
    model, _proc = load_vlm(resolve_vlm("tiny_qwen3_vl"))
    return model


def test_restricted_logits_and_gradients_equal_the_full_columns(lm):
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (3, 12))
    sub = torch.tensor([1010, 1003, 1031])
    weight = lm.get_output_embeddings().weight

    full = lm(input_ids=ids, use_cache=False).logits[..., sub]
    (full.square().sum()).backward()
    g_full = weight.grad.clone()
    lm.zero_grad()
    head = lm.get_output_embeddings()
    with restricted_output_vocab(lm, sub) as restricted:
        assert restricted and isinstance(lm.get_output_embeddings(), SubsetHead)
        part = lm(input_ids=ids, use_cache=False).logits
    assert lm.get_output_embeddings() is head  # put back
    assert part.shape == (3, 12, 3)
    assert torch.allclose(part, full, atol=1e-6)
    part.square().sum().backward()
    assert torch.allclose(weight.grad, g_full, atol=1e-5)  # tied weights: embedding + head gradient, same rows
    lm.zero_grad()


def test_head_is_restored_after_an_error_and_other_heads_are_left_alone(lm):
    head = lm.get_output_embeddings()
    with pytest.raises(RuntimeError, match="boom"):
        with restricted_output_vocab(lm, torch.tensor([1, 2])):
            raise RuntimeError("boom")
    assert lm.get_output_embeddings() is head

    class Custom(nn.Linear):
        pass

    owner = nn.Module()
    owner.head = Custom(4, 5)
    owner.get_output_embeddings = lambda: owner.head
    owner.set_output_embeddings = lambda m: pytest.fail("a custom head must not be replaced")
    with restricted_output_vocab(owner, torch.tensor([0])) as restricted:
        assert restricted is False


def test_vla_log_probs_equal_the_full_vocabulary_path(monkeypatch):
    from tests.adapters.vla.test_vla_policy import batch, make_policy

    policy = make_policy(env_kwargs={"success_step": 3})
    try:
        ro = policy.rollout(batch(), 2)
        fast = policy.log_probs(ro, entropy=True)
        (fast.logp * ro.mask).sum().backward()
        g_fast = [p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None]
        policy.module.zero_grad()

        calls = []

        @contextlib.contextmanager
        def full_vocab(lm, ids):
            calls.append(len(ids))
            yield False

        monkeypatch.setattr("mmrl.adapters.vla.policy.restricted_output_vocab", full_vocab)
        slow = policy.log_probs(ro, entropy=True)
        (slow.logp * ro.mask).sum().backward()
        g_slow = [p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None]
        policy.module.zero_grad()
    finally:
        policy.close()
    assert calls and calls[0] == 256  # the fallback ran, over the 256 action ids
    assert torch.allclose(fast.logp, slow.logp, atol=1e-6) and torch.allclose(fast.entropy, slow.entropy, atol=1e-6)
    assert len(g_fast) == len(g_slow) > 0
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_fast, g_slow))
