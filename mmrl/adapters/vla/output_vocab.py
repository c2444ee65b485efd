"""Logits over a few token ids only: the LM head restricted to rows of its weight.

A VLA policy's log-probs are over its action tokens (e.g. 256 bins) but the language model's head produces logits
over the whole vocabulary (151k for Qwen-VL): for 1,600 observations x 7 action tokens that is a 6.8 GB fp32 tensor
of which the policy keeps 0.2%. :func:`restricted_output_vocab` swaps the head for :class:`SubsetHead` for the
duration of a forward, so the model computes ``hidden @ W[ids].T (+ b[ids])`` directly: logits ``[..., len(ids)]``
in the order of ``ids``, equal to ``full_logits[..., ids]`` and with the gradient flowing into the same weight rows.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch.nn.functional as F
from torch import Tensor, nn

from mmrl.models.lora import is_peft


class SubsetHead(nn.Module):
    """``head`` (an ``nn.Linear``) evaluated on the rows ``ids`` of its weight only."""

    def __init__(self, head: nn.Linear, ids: Tensor) -> None:
        super().__init__()
        self.head = head
        self.ids = ids

    def forward(self, hidden: Tensor) -> Tensor:
        w = self.head.weight
        ids = self.ids.to(w.device)
        bias = self.head.bias.index_select(0, ids) if self.head.bias is not None else None
        return F.linear(hidden, w.index_select(0, ids), bias)


def _head_owner(lm: nn.Module) -> nn.Module:
    return lm.get_base_model() if is_peft(lm) else lm


@contextlib.contextmanager
def restricted_output_vocab(lm: nn.Module, ids: Tensor) -> Iterator[bool]:
    """Within the block, ``lm``'s logits are over ``ids`` only (``[..., len(ids)]``); yields True when the head was
    restricted. A head that is not a plain ``nn.Linear`` (LoRA on the head, a custom head) is left as it is and the
    block yields False: the caller then selects the columns from the full logits."""
    owner = _head_owner(lm)
    head = owner.get_output_embeddings()
    if type(head) is not nn.Linear:
        yield False
        return
    owner.set_output_embeddings(SubsetHead(head, ids))
    try:
        yield True
    finally:
        owner.set_output_embeddings(head)
