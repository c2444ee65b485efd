"""The policy of the minimal adapter: a small torch MLP that listens to a clip and emits a few discrete tokens.

One sample is a completion of at most ``model.max_len`` tokens over the task's vocabulary (``PolicySpec.vocabulary``,
e.g. ``"0123."``, whose last character is the end token). One action is one token; its log-prob is
``log_softmax(logits / temperature)`` at that token, so the trainer's ``[B, T]`` tensors are real:

* :meth:`TonePolicy.rollout` featurises each clip (magnitude spectrum, the "processor"), samples tokens step by step
  with Gumbel-max noise drawn from the prompt's seed (the same samples whatever the batch layout), stops a sample at
  the end token and records the behaviour log-probs and the mask (1 up to and including the end token).
* :meth:`TonePolicy.log_probs` recomputes the same log-probs in one differentiable forward (teacher forcing).

What it reads and writes: each prepared item's ``audio`` (a 1-D waveform), and one ``{"text": completion}`` dict per
sample in ``Rollout.samples`` (what the task's rewards, user rewards and ``samples.jsonl`` read).

The network conditions step ``t`` on the clip, the previous token and ``t``: ``logits = head(enc(x) + emb(prev) +
pos(t))``. Checkpoints are ``model.safetensors`` plus ``config.json`` (what the checkpoint validator expects).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributions import Categorical

from mmrl.policies.base import FrozenCopyReference, LogProbOutput, Policy, PolicyCapabilityError, PolicySpec, Rollout
from mmrl.rollout.noise import counter_gumbel, mix_seed


@dataclass
class ToneModelConfig:
    """The tone MLP; every field is a ``model.<field>`` setting. The core reads ``type`` (the registry key) and
    ``name`` (labels); ``temperature``, when a model config has one, is validated at load."""

    type: str = "tone_mlp"
    """Model family selector (the name the builder is registered under)."""
    name: str = "tone_mlp"
    """Label shown in the start banner and eval results."""
    n_fft: int = 64
    """FFT size of the front end (the clip is cut or zero-padded to it); n_fft // 2 + 1 spectrum bins."""
    hidden: int = 64
    """Hidden size."""
    max_len: int = 3
    """Completion length limit T (tokens)."""
    temperature: float = 1.0
    """Sampling temperature (log-probs use the same one)."""


class ToneNet(nn.Module):
    """``logits[n, t] = head(enc(features[n]) + emb(prev[n, t]) + pos(t))``; ``prev`` starts with BOS (= vocab size)."""

    def __init__(self, n_bins: int, vocab: int, hidden: int, max_len: int) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(n_bins, hidden), nn.Tanh(), nn.Linear(hidden, hidden))
        self.emb = nn.Embedding(vocab + 1, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        self.head = nn.Sequential(nn.Tanh(), nn.Linear(hidden, vocab))

    def forward(self, features: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        t = torch.arange(prev.shape[1], device=prev.device)
        return self.head(self.enc(features)[:, None] + self.emb(prev) + self.pos(t)[None])  # [N, T, V]


class TonePolicy(Policy):
    """Token policy over a tiny vocabulary; see the module docstring for what each method does."""

    def __init__(self, cfg: ToneModelConfig, vocabulary: str) -> None:
        self.cfg, self.vocab = cfg, vocabulary
        self.end_id = len(vocabulary) - 1  # the vocabulary's last character ends a completion
        self.model = ToneNet(cfg.n_fft // 2 + 1, len(vocabulary), cfg.hidden, cfg.max_len)
        self._frozen_ref = FrozenCopyReference(self)  # the KL reference: a frozen copy of the initial weights

    def features(self, items) -> torch.Tensor:
        """[N, n_fft // 2 + 1] log magnitude spectrum of each item's ``audio`` (the policy's preprocessing)."""
        audio = torch.stack([torch.as_tensor(it["audio"], dtype=torch.float32) for it in items])
        spec = torch.fft.rfft(audio, n=self.cfg.n_fft).abs() / self.cfg.n_fft**0.5
        return torch.log1p(spec).to(self._device())

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _logits(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[N, T, V] logits / temperature of every step, given the tokens chosen before it (teacher forcing)."""
        bos = torch.full_like(tokens[:, :1], len(self.vocab))
        return self.model(features, torch.cat([bos, tokens[:, :-1]], dim=1)) / self.cfg.temperature

    # ------------------------------------------------------------------ required by the contract
    @torch.no_grad()  # the trainer calls rollout with autograd on; nothing here needs a gradient
    def rollout(self, batch, group_size, *, greedy=False) -> Rollout:
        G, T = group_size, self.cfg.max_len
        items = [it for it in batch.items for _ in range(G)]  # prompt-major: G copies of each prompt
        seeds = torch.tensor([mix_seed(s, j) for s in batch.seeds for j in range(G)])  # one noise stream per sample
        feats = self.features(items)
        tokens = torch.full((len(items), T), self.end_id, dtype=torch.long, device=feats.device)
        logp = torch.zeros(len(items), T)
        for t in range(T):  # step t only reads tokens < t, so the unfilled columns do not matter
            logits = self._logits(feats, tokens)[:, t]
            noise = 0.0 if greedy else counter_gumbel(seeds, t, logits.shape[1], device=logits.device)
            tokens[:, t] = (logits + noise).argmax(-1)  # Gumbel-max: a sample of softmax(logits)
            logp[:, t] = logits.log_softmax(-1).gather(1, tokens[:, t : t + 1])[:, 0].cpu()  # behaviour log-prob
        ended = (tokens == self.end_id).long().cpu()
        mask = (ended.cumsum(1) - ended == 0).float()  # 1 up to and including the first end token
        lengths = mask.sum(1).long().tolist()
        samples = [{"text": "".join(self.vocab[i] for i in row[:n])} for row, n in zip(tokens.tolist(), lengths)]
        return Rollout(
            rollout_logp=logp * mask,
            mask=mask,
            group_id=batch.group_ids(G),
            samples=samples,
            payload={"features": feats, "tokens": tokens},
            prompt_index=torch.arange(len(batch)).repeat_interleave(G),
        )

    def log_probs(self, rollout, *, entropy=False, values=False) -> LogProbOutput:
        if values:
            raise PolicyCapabilityError("TonePolicy has no value head; use an outcome estimator (algo.advantage=grpo)")
        tokens = rollout.payload["tokens"]
        dist = Categorical(logits=self._logits(rollout.payload["features"], tokens))
        return LogProbOutput(logp=dist.log_prob(tokens), entropy=dist.entropy() if entropy else None)

    def reference(self):
        return self._frozen_ref.swap()

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def save_pretrained(self, path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        module = getattr(self.model, "module", self.model)  # the trainer may have wrapped it (DDP)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}, path / "model.safetensors"
        )
        (path / "config.json").write_text(json.dumps({**asdict(self.cfg), "vocabulary": self.vocab}, indent=1))

    def load_pretrained(self, path) -> None:
        module = getattr(self.model, "module", self.model)
        module.load_state_dict(load_file(Path(path) / "model.safetensors", device=str(self._device())))


def build_tone_policy(run_cfg, spec: PolicySpec) -> TonePolicy:
    """The builder registered for ``model.type=tone_mlp``: ``(run config, the task's PolicySpec) -> Policy``."""
    if not spec.vocabulary:
        raise ValueError(
            f"model.type=tone_mlp needs the task's output vocabulary (PolicySpec.vocabulary); "
            f"task {spec.task_name} has none"
        )
    return TonePolicy(run_cfg.model, spec.vocabulary)
