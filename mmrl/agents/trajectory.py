"""The token record of one multi-turn trajectory: ONE sequence, with the provenance of every token.

::

    [ prompt (system, tools, user + image) ][ turn 1 ][ observation 1 (+ crop image) ][ turn 2 ] ...
      context                                 GEN       context (OBS)                   GEN

Everything after the prompt is the trajectory's ``[T]`` row of the rollout: GEN tokens were sampled by the policy
(mask 1, with their behaviour log-prob), OBS tokens were written by the environment through the chat template (tool
messages, their images' placeholder tokens, the next ``assistant`` header): context only, outside the loss, the KL and
the entropy (mask 0). The ids are kept exactly as sampled and as encoded (never decoded and re-tokenised), so training
sees the very sequence the rollout produced.

:meth:`Trajectory.full_inputs` is the whole sequence as ONE :class:`~mmrl.policies.vlm_inputs.PromptInputs` (all its
images in sequence order, their cached vision features concatenated): what each turn's generation is prefilled with
and what training runs one forward over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from mmrl.policies.vlm_inputs import ImageFeatures, PromptInputs

GEN, OBS = 1, 2
"""Token kinds after the prompt: sampled by the policy, or written by the environment."""


@dataclass(eq=False)
class Segment:
    """A run of tokens of one kind: a policy turn (``GEN``, with behaviour log-probs) or an observation (``OBS``,
    a processor-encoded chunk that may hold images)."""

    kind: int
    ids: Tensor
    """[n] token ids."""
    logp: Tensor | None = None
    """GEN: [n] behaviour log-probs of the sampled tokens."""
    chunk: PromptInputs | None = None
    """OBS: the processor output of the observation text and its images (pixels, grids, cached features)."""


def concat_features(parts: Sequence[ImageFeatures]) -> ImageFeatures | None:
    """One :class:`ImageFeatures` holding ``parts``' image features in order (Qwen3-VL's deepstack layers too)."""
    if not parts:
        return None
    embeds = [e for p in parts for e in p.embeds]
    deep = None
    if parts[0].deepstack is not None:
        deep = [[e for p in parts for e in p.deepstack[layer]] for layer in range(len(parts[0].deepstack))]
    return ImageFeatures(embeds=embeds, deepstack=deep, output_cls=parts[0].output_cls)


def _cat(tensors: list[Tensor | None], dim: int) -> Tensor | None:
    present = [t for t in tensors if t is not None]
    return torch.cat(present, dim) if present else None


@dataclass(eq=False)
class Trajectory:
    """One trajectory: the prompt, then its segments; plus how it ended."""

    prompt: PromptInputs
    segments: list[Segment] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    """Per policy turn: ``text``, ``truncated``, ``tool_calls``, ``errors``, ``observation`` (the text sent back)."""
    finished: bool = False
    """The last turn was a final answer (no tool call)."""
    over_turn: bool = False
    """It still called a tool on its last allowed turn (``agent.max_turns``)."""
    over_budget: bool = False
    """It ran out of ``agent.max_tokens`` before a final answer."""
    _full: PromptInputs | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.finished or self.over_turn or self.over_budget

    @property
    def length(self) -> int:
        """Tokens after the prompt."""
        return sum(int(s.ids.numel()) for s in self.segments)

    def add(self, segment: Segment) -> None:
        self.segments.append(segment)
        self._full = None

    def rest_ids(self) -> Tensor:
        """[length] token ids after the prompt."""
        return torch.cat([s.ids for s in self.segments]) if self.segments else torch.zeros(0, dtype=torch.long)

    def kinds(self) -> Tensor:
        """[length] ``GEN`` / ``OBS`` of each token after the prompt."""
        if not self.segments:
            return torch.zeros(0, dtype=torch.long)
        return torch.cat([torch.full((int(s.ids.numel()),), s.kind, dtype=torch.long) for s in self.segments])

    def rest_mm(self) -> Tensor:
        """[length] multimodal token types after the prompt (0 text; the observation chunks' own image types)."""
        if not self.segments:
            return torch.zeros(0, dtype=torch.long)
        return torch.cat(
            [s.chunk.mm_token_type_ids if s.kind == OBS else torch.zeros_like(s.ids) for s in self.segments]
        )

    def behaviour_logp(self) -> Tensor:
        """[length] behaviour log-probs (0 on observation tokens)."""
        if not self.segments:
            return torch.zeros(0)
        return torch.cat([s.logp.float() if s.kind == GEN else torch.zeros(int(s.ids.numel())) for s in self.segments])

    def chunks(self) -> list[PromptInputs]:
        return [s.chunk for s in self.segments if s.kind == OBS]

    def images(self) -> list:
        """Every image of the sequence in order (the prompt's, then each observation's)."""
        return list(self.prompt.images) + [im for c in self.chunks() for im in c.images]

    def full_inputs(self, image_dim: int = 0) -> PromptInputs:
        """The whole sequence so far as ONE prompt: ids, token types, every image's pixels, grids, sizes and (when all
        are cached) vision features, in sequence order. ``image_dim``: the family's dimension along which image
        tensors of several prompts concatenate (:attr:`mmrl.policies.vlm_family.VLMFamily.image_dim`)."""
        if self._full is not None:
            return self._full
        p = self.prompt
        chunks = [c for c in self.chunks() if c.num_images]
        parts = [p] + chunks if p.num_images else chunks
        feats = None
        if all(c.features is not None for c in parts):
            feats = concat_features([c.features for c in parts])
        extras = {}
        for key in parts[0].pixel_extras if parts else {}:
            extras[key] = _cat([c.pixel_extras.get(key) for c in parts], image_dim)
        self._full = PromptInputs(
            text=p.text + "".join(s.chunk.text if s.kind == OBS else "" for s in self.segments),
            images=self.images(),
            input_ids=torch.cat([p.input_ids, self.rest_ids()]),
            mm_token_type_ids=torch.cat([p.mm_token_type_ids, self.rest_mm()]),
            pixel_values=_cat([c.pixel_values for c in parts], image_dim),
            image_grid_thw=_cat([c.image_grid_thw for c in parts], 0),
            orig_sizes=[s for c in [p, *self.chunks()] for s in c.orig_sizes],
            input_sizes=[s for c in [p, *self.chunks()] for s in c.input_sizes],
            features=feats,
            pixel_extras=extras,
        )
        return self._full
