"""The trainable module of a continuous-action VLA and the two heads' sampling / log-prob / warm-start rules.

:class:`ContinuousVLAModule` holds the backbone (the Qwen-VL ``lm``), the action head (a flow-matching
:class:`~mmrl.adapters.vla.flow_expert.FlowActionExpert` or a
:class:`~mmrl.adapters.vla.gaussian_head.GaussianChunkHead`), Flow-Noise's noise head, the PPO value head and the
state projection. Its ``forward`` encodes the prefix (images + instruction from the backbone's last hidden states,
then one projected robot-state token) and hands ``(module, prefix_hidden, prefix_mask)`` to a ``run`` function, so
that every trained computation goes through one forward of the (possibly DDP / FSDP-wrapped) module.

:class:`FlowRule` and :class:`GaussianRule` say what a head does with the prefix of ``U`` distinct observations and
``index [N]`` (the observation of each of the ``N`` rows, e.g. the G episodes of a group at their first call):
``sample`` (one chunk per row, its log-prob and the record that :meth:`log_prob` needs), ``log_prob`` (recomputed
with gradients; given the reference weights' ``distribution`` of the same chunks, also the exact KL to it: the
Gaussian chunk's, or the sum of the chain's Gaussian transitions') and ``sft_loss`` (flow matching / L1 on demo
chunks). Every Gaussian step and density comes from
:mod:`mmrl.rollout.sde_math` through :mod:`~mmrl.adapters.vla.flow_chain` and
:mod:`~mmrl.adapters.vla.gaussian_head`. Per-row noise is drawn from a ``torch.Generator`` seeded by the row's
seed, so a row's sample does not depend on the batch layout.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from mmrl.adapters.vla import flow_chain, gaussian_head
from mmrl.adapters.vla.flow_expert import FlowActionExpert, FlowExpertConfig
from mmrl.adapters.vla.value_head import ValueHead
from mmrl.policies.token_policy import accepts_logits_to_keep
from mmrl.rollout import sde_math

__all__ = ["ContinuousVLAModule", "FlowRule", "GaussianRule", "HeadRule", "row_generators"]

PrefixRun = Callable[["ContinuousVLAModule", Tensor, Tensor], Any]
"""``run(module, prefix_hidden [U, P, D], prefix_mask [U, P])``: what a forward computes from the prefix. Another
module may pass its own prefix in place of ``prefix_hidden`` (SmolVLA: the per-layer key/value cache, which its
``head.prefix_kv`` returns as is); the rules read only ``module.head``, ``module.noise_head`` and ``prefix_mask``'s
device, and :class:`FlowRule` never looks inside the prefix."""


class ContinuousVLAModule(nn.Module):
    """Backbone + action head (+ noise head, value head, state projection): the policy's trainable module.

    ``lm`` keeps its name, so everything the token policies do with ``module.lm`` (vision tower, LoRA, saving) applies.
    """

    def __init__(
        self,
        lm: nn.Module,
        head: nn.Module,
        *,
        noise_head: nn.Module | None = None,
        value_head: ValueHead | None = None,
        state_proj: nn.Linear | None = None,
    ) -> None:
        super().__init__()
        self.lm = lm
        self.head = head
        self.noise_head = noise_head
        self.value_head = value_head
        self.state_proj = state_proj

    def head_modules(self) -> nn.ModuleDict:
        """The modules outside the backbone that ``action_head.safetensors`` holds (not the value head)."""
        mods = {"head": self.head, "noise_head": self.noise_head, "state_proj": self.state_proj}
        return nn.ModuleDict({k: m for k, m in mods.items() if m is not None})

    def prefix(self, inputs: dict, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """The backbone's last hidden states ``[U, L, D]`` over the prompt (images + instruction) and its mask, with
        one projected state token appended when the module has a state projection (``state [U, S]``)."""
        kw = {"logits_to_keep": 1} if accepts_logits_to_keep(self.lm) else {}
        out = self.lm(**inputs, output_hidden_states=True, use_cache=False, **kw)
        hidden = out.hidden_states[-1]
        mask = inputs["attention_mask"].to(torch.bool)
        if self.state_proj is None:
            return hidden, mask
        if state is None:
            raise ValueError("this policy reads the robot state (model.use_state=true) but got none")
        token = self.state_proj(state.to(device=hidden.device, dtype=self.state_proj.weight.dtype))
        hidden = torch.cat([hidden, token.to(hidden.dtype)[:, None, :]], dim=1)
        return hidden, torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)

    def forward(self, *, run: PrefixRun, state: Tensor | None = None, **inputs: Any) -> Any:
        """``run(self, *self.prefix(inputs, state))``: the prefix, then the head computation, in one forward."""
        hidden, mask = self.prefix(inputs, state)
        return run(self, hidden, mask)

    def value(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """The critic's V(prefix) ``[U]`` of the prefix ``(hidden, mask)`` a ``run`` function receives."""
        return self.value_head(hidden, mask)


def row_generators(seeds: Sequence[int]) -> list[torch.Generator]:
    """One CPU generator per row, seeded by the row's seed (a row's noise is independent of the batch layout)."""
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def _row_normal(gens: Sequence[torch.Generator], shape: tuple[int, ...], device: torch.device) -> Tensor:
    """``[N, *shape]`` standard normals, row n drawn from ``gens[n]`` (next draws of that generator)."""
    return torch.stack([torch.randn(shape, generator=g, dtype=torch.float32) for g in gens]).to(device)


class HeadRule:
    """What a continuous head does with a prefix; see the module docstring. ``cfg``: the :class:`VLAConfig`. The
    registry of heads (:mod:`mmrl.adapters.vla.heads`) names each rule."""

    record_keys: tuple[str, ...] = ()
    """The keys of the per-row record :meth:`sample` returns and :meth:`log_prob` reads back (one entry per policy
    call in the rollout's payload)."""
    has_entropy: bool = False
    """:meth:`log_prob` returns the chunk's entropy when asked (a closed form exists)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def build(self, prefix_dim: int, action_dim: int) -> tuple[nn.Module, nn.Module | None]:
        """The head and (Flow-Noise) its noise head, for prefix width ``prefix_dim`` and ``action_dim`` head dims."""
        raise NotImplementedError

    def sample(
        self,
        module: ContinuousVLAModule,
        hidden: Tensor,
        mask: Tensor,
        index: Tensor,
        seeds: Sequence[int],
        *,
        greedy: bool,
        exec_mask: Tensor,
        dim_mask: Tensor,
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Normalised chunks ``[N, H, A]``, their log-probs ``[N]`` (0 when greedy) and the per-row record (CPU)."""
        raise NotImplementedError

    def distribution(
        self,
        module: ContinuousVLAModule,
        hidden: Tensor,
        mask: Tensor,
        index: Tensor,
        record: dict[str, Tensor],
        *,
        exec_mask: Tensor,
        dim_mask: Tensor,
    ) -> Any:
        """What the weights of ``module`` make of the recorded chunks: the Gaussians the log-prob and the KL are
        computed from (gaussian: the chunk's ``(mean, log_std)``; flow: the chain's stochastic transitions)."""
        raise NotImplementedError

    def log_prob(
        self,
        module: ContinuousVLAModule,
        hidden: Tensor,
        mask: Tensor,
        index: Tensor,
        record: dict[str, Tensor],
        *,
        exec_mask: Tensor,
        dim_mask: Tensor,
        entropy: bool,
        reference: Any = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Log-probs ``[N]`` of the recorded chunks under the current weights, the entropy ``[N]`` (or None) and,
        given the reference's :meth:`distribution` of the same chunks, the exact KL ``[N]`` of the policy's
        distribution to it (or None)."""
        raise NotImplementedError

    def sft_loss(
        self,
        module: ContinuousVLAModule,
        hidden: Tensor,
        mask: Tensor,
        index: Tensor,
        actions: Tensor,
        *,
        dim_mask: Tensor,
        generator: torch.Generator,
    ) -> Tensor:
        """Warm-start loss of the normalised demo chunks ``actions [N, H, A]`` (padding dims excluded)."""
        raise NotImplementedError


class FlowRule(HeadRule):
    """π0's flow-matching expert: K denoising steps at rollout (``model.likelihood`` makes them stochastic, the ODE
    when greedy), :func:`~mmrl.adapters.vla.flow_chain.chunk_log_prob` over the recorded chain in training, the
    flow-matching loss on demos. The prefix keys/values are computed once per observation and shared by the K steps
    and the rows of that observation (``PrefixKV.index_select``)."""

    record_keys = ("chain", "stochastic")  # the denoising chain [K + 1, H, A] and which of its K steps were stochastic

    def build(self, prefix_dim: int, action_dim: int) -> tuple[nn.Module, nn.Module | None]:
        cfg = self.cfg
        expert = FlowActionExpert(
            FlowExpertConfig(
                prefix_dim=prefix_dim,
                action_dim=action_dim,
                chunk_size=cfg.chunk,
                width=cfg.expert_width,
                depth=cfg.expert_depth,
                num_heads=cfg.expert_heads,
                num_steps=cfg.num_steps,
            )
        )
        noise_head = None
        if cfg.likelihood == "flow_noise":
            noise_head = flow_chain.FlowNoiseHead(
                expert.feature_dim, action_dim, min_std=cfg.noise_min_std, max_std=cfg.noise_max_std
            )
        return expert, noise_head

    def sample(self, module, hidden, mask, index, seeds, *, greedy, exec_mask, dim_mask):
        cfg = self.cfg
        kv = module.head.prefix_kv(hidden, mask).index_select(index)
        gens = row_generators(seeds)
        shape = (cfg.chunk, int(dim_mask.numel()))
        dev = mask.device
        noise = _row_normal(gens, shape, dev)
        mode = "ode" if greedy else cfg.likelihood
        step_noise = sde_index = None
        if not greedy:
            step_noise = _row_normal(gens, (cfg.num_steps, *shape), dev).transpose(0, 1)
            if mode == "flow_sde_one":
                sde_index = torch.cat([torch.randint(0, cfg.num_steps - 1, (1,), generator=g) for g in gens])
                sde_index = sde_index.to(dev)
        out = flow_chain.sample_chunk(
            module.head,
            kv,
            noise,
            mode=mode,
            num_steps=cfg.num_steps,
            noise_level=cfg.noise_level,
            sde_step_index=sde_index,
            noise_head=module.noise_head,
            step_noise=step_noise,
            exec_mask=exec_mask,
            dim_mask=dim_mask,
        )
        record = {"chain": out.chain.transpose(0, 1).cpu(), "stochastic": out.stochastic.transpose(0, 1).cpu()}
        return out.actions, out.log_prob, record

    def distribution(self, module, hidden, mask, index, record, *, exec_mask, dim_mask):
        kv = module.head.prefix_kv(hidden, mask).index_select(index)
        dev = mask.device
        return flow_chain.chain_steps(
            module.head,
            kv,
            record["chain"].to(dev).transpose(0, 1),
            record["stochastic"].to(dev).transpose(0, 1),
            mode=self.cfg.likelihood,
            exec_mask=exec_mask,
            dim_mask=dim_mask,
            noise_level=self.cfg.noise_level,
            noise_head=module.noise_head,
            where="chunk_log_prob",
        )

    def log_prob(self, module, hidden, mask, index, record, *, exec_mask, dim_mask, entropy, reference=None):
        steps = self.distribution(module, hidden, mask, index, record, exec_mask=exec_mask, dim_mask=dim_mask)
        rows, dev = int(index.numel()), mask.device
        logp = flow_chain.steps_log_prob(steps, rows, dev)
        kl = flow_chain.steps_kl(steps, reference, rows, dev) if reference is not None else None
        return logp, None, kl  # the chain's entropy has no closed form: LogProbOutput.entropy None

    def sft_loss(self, module, hidden, mask, index, actions, *, dim_mask, generator):
        kv = module.head.prefix_kv(hidden, mask).index_select(index)
        noise = torch.randn(actions.shape, generator=generator, dtype=torch.float32).to(actions.device)
        time = flow_chain.sample_flow_time(actions.shape[0], time_sampling=self.cfg.time_sampling, generator=generator)
        return flow_chain.flow_matching_loss(
            module.head, kv, actions, dim_mask, noise=noise, time=time.to(actions.device)
        )


class GaussianRule(HeadRule):
    """OpenVLA-OFT's parallel decoding: the chunk's mean and log-std in one pass; a Gaussian draw at rollout (the
    mean when greedy), :func:`~mmrl.adapters.vla.gaussian_head.log_prob` of the stored unclipped draw in training,
    L1 on demos. Clipping to the action range happens only for the env."""

    record_keys = ("actions",)  # the unclipped chunk [H, A]
    has_entropy = True

    def build(self, prefix_dim: int, action_dim: int) -> tuple[nn.Module, nn.Module | None]:
        cfg = self.cfg
        head = gaussian_head.GaussianChunkHead(
            prefix_dim,
            cfg.chunk,
            action_dim,
            log_std=cfg.log_std,
            width=cfg.expert_width,
            num_heads=cfg.expert_heads,
            num_layers=cfg.expert_depth,
            init_log_std=cfg.init_log_std,
            log_std_bounds=(cfg.log_std_min, cfg.log_std_max),
        )
        return head, None

    @staticmethod
    def _mean_log_std(module, hidden, mask, index) -> tuple[Tensor, Tensor]:
        mean, log_std = module.head(hidden, mask)
        index = index.to(mean.device)
        return mean.index_select(0, index), log_std.index_select(0, index)

    def sample(self, module, hidden, mask, index, seeds, *, greedy, exec_mask, dim_mask):
        mean, log_std = self._mean_log_std(module, hidden, mask, index)
        if greedy:
            actions, logp = mean, torch.zeros(mean.shape[0], device=mean.device)
        else:
            eps = _row_normal(row_generators(seeds), tuple(mean.shape[1:]), mean.device)
            actions = sde_math.gaussian_step(mean, torch.exp(log_std), noise=eps).prev_sample
            logp = gaussian_head.log_prob(actions, mean, log_std, exec_mask, dim_mask)
        return actions, logp, {"actions": actions.cpu()}

    def distribution(self, module, hidden, mask, index, record, *, exec_mask, dim_mask):
        return self._mean_log_std(module, hidden, mask, index)

    def log_prob(self, module, hidden, mask, index, record, *, exec_mask, dim_mask, entropy, reference=None):
        mean, log_std = self._mean_log_std(module, hidden, mask, index)
        logp = gaussian_head.log_prob(record["actions"].to(mean.device), mean, log_std, exec_mask, dim_mask)
        ent = gaussian_head.entropy(log_std, exec_mask, dim_mask) if entropy else None
        kl = gaussian_head.kl(mean, log_std, *reference, exec_mask, dim_mask) if reference is not None else None
        return logp, ent, kl

    def sft_loss(self, module, hidden, mask, index, actions, *, dim_mask, generator):
        mean, _ = self._mean_log_std(module, hidden, mask, index)
        return gaussian_head.l1_loss(mean, actions, None, dim_mask)
