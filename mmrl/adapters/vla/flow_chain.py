"""Sampling, likelihoods and the warm-start loss of a flow-matching action expert (π0 / πRL).

Pure functions over an expert with ``velocity(x_t, t, kv)`` (and ``velocity_and_features`` for Flow-Noise), e.g.
``mmrl.adapters.vla.flow_expert.FlowActionExpert``. Time convention (π0 / rectified flow, σ = t in
``mmrl.rollout.sde_math``): ``x_t = t · noise + (1 - t) · action``, t = 1 is noise, t = 0 is data, the velocity
target is ``u = noise - action``. Sampling integrates K Euler steps on the grid ``t_k = 1 - k / K``
(``x ← x + v (t_{k+1} - t_k) = x - v / K``); the chain ``x_{t_0}, ..., x_{t_K}`` is the MDP of RL fine-tuning.

Modes (``MODES``):

* ``"ode"``: the deterministic Euler sampler (evaluation); no density.
* ``"flow_sde"``: Flow-GRPO's reverse SDE at every step (``sde_math.flow_sde_step``, noise level a); the step
  to t = 0 is deterministic (std 0), so the stochastic steps are 0..K-2. This is πRL's Flow-SDE.
* ``"flow_sde_one"``: the same SDE at one step per chunk, drawn uniformly from 0..K-2 per row, the ODE
  elsewhere (πRL's cheaper variant: one expert pass per chunk to recompute the log-prob).
* ``"flow_noise"``: πRL's Flow-Noise: a Gaussian around the ODE mean (``sde_math.ode_step``) with a per-element
  std from a learned ``FlowNoiseHead`` bounded to [min_std, max_std]; every step, including the last, is
  stochastic (``sde_math.gaussian_step``).

Every Gaussian step and its log density come from ``mmrl.rollout.sde_math`` (one copy shared with the diffusion
adapter). A chunk's log-prob is the sum, over the stochastic steps, of the per-element log density summed over
the executed actions (``exec_mask [B, H]``: the first ``n_action_steps`` of the chunk) and the environment's real
action dims (``dim_mask [A]``: padding dims excluded). Padding dims and unexecuted actions are still sampled
(they are part of the chain the expert sees) but add nothing to the log-prob.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from mmrl.adapters.vla.flow_expert import ActionHeadError, PrefixKV
from mmrl.rollout import sde_math

__all__ = [
    "MODES",
    "TIME_SAMPLINGS",
    "FlowChunkSample",
    "FlowNoiseHead",
    "ChainStep",
    "action_element_mask",
    "chain_steps",
    "chunk_log_prob",
    "executed_steps_mask",
    "flow_matching_loss",
    "flow_timesteps",
    "gaussian_kl",
    "sample_chunk",
    "sample_flow_time",
    "steps_kl",
    "steps_log_prob",
]

MODES = ("ode", "flow_sde", "flow_sde_one", "flow_noise")
TIME_SAMPLINGS = ("beta", "uniform")
_SDE_MODES = ("flow_sde", "flow_sde_one")
# π0: t = 0.999 · Beta(1.5, 1) + 0.001
_BETA_ALPHA = 1.5
_BETA_SCALE = 0.999
_BETA_OFFSET = 0.001


class FlowNoiseHead(nn.Module):
    """Flow-Noise's learned noise: expert features ``[B, H, F]`` -> per-element log-std ``[B, H, A]``, bounded.

    ``log_std = log(min_std) + (log(max_std) - log(min_std)) · sigmoid(MLP(features))``, so the std lies in
    [min_std, max_std] (πRL uses [0.08, 0.16]). The features are the expert's final per-action features at the
    current (x_t, t), so the std depends on the observation, the noisy chunk and the time.
    """

    def __init__(
        self, feature_dim: int, action_dim: int, *, min_std: float = 0.08, max_std: float = 0.16, hidden: int = 64
    ) -> None:
        super().__init__()
        if not 0.0 < min_std < max_std:
            raise ActionHeadError(f"FlowNoiseHead: need 0 < min_std < max_std, got {min_std} and {max_std}")
        self.min_std = float(min_std)
        self.max_std = float(max_std)
        self.net = nn.Sequential(nn.Linear(feature_dim, hidden), nn.SiLU(), nn.Linear(hidden, action_dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Per-element log-std ``[B, H, A]`` float32 in [log(min_std), log(max_std)]."""
        squashed = torch.sigmoid(self.net(features).to(torch.float32))
        low, high = math.log(self.min_std), math.log(self.max_std)
        return low + (high - low) * squashed


@dataclass
class FlowChunkSample:
    """One sampled chunk and what is needed to recompute its log-prob in training.

    Attributes:
        actions: the final chunk x_{t_K} ``[B, H, A]`` float32 (unclipped; the environment clips).
        chain: every state of the denoising chain ``[K + 1, B, H, A]`` float32, chain[0] = the initial noise.
        stochastic: ``[K, B]`` bool, True where step k of row b was a Gaussian step with a density.
        step_log_probs: ``[K, B]`` float32 masked log densities of each step (0 where not stochastic).
        log_prob: ``[B]`` float32, the chunk log-prob (sum of ``step_log_probs`` over steps).
        mode: the sampling mode; noise_level: Flow-SDE's a (unused by the other modes).
    """

    actions: torch.Tensor
    chain: torch.Tensor
    stochastic: torch.Tensor
    step_log_probs: torch.Tensor
    log_prob: torch.Tensor
    mode: str
    noise_level: float


# ----------------------------------------------------------------------------------------------
# masks and schedules


def flow_timesteps(num_steps: int) -> torch.Tensor:
    """The sampling grid ``t_k = 1 - k / K`` for k = 0..K: float32 ``[K + 1]`` from 1 (noise) to 0 (data)."""
    _check_num_steps(num_steps, "flow_timesteps")
    return torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float32)


def executed_steps_mask(n_action_steps: int | torch.Tensor, batch_size: int, chunk_size: int) -> torch.Tensor:
    """``[B, H]`` bool, True for the first ``n_action_steps`` actions of each chunk (the ones executed).

    ``n_action_steps`` is one int for all rows or a ``[B]`` tensor; each must be in [1, H].
    """
    n = torch.as_tensor(n_action_steps, dtype=torch.long)
    if n.ndim == 0:
        n = n.expand(batch_size)
    if n.shape != (batch_size,):
        raise ActionHeadError(f"executed_steps_mask: n_action_steps must be an int or a [B={batch_size}] tensor")
    if bool((n < 1).any()) or bool((n > chunk_size).any()):
        raise ActionHeadError(f"executed_steps_mask: n_action_steps must be in [1, {chunk_size}], got {n.tolist()}")
    return torch.arange(chunk_size)[None, :] < n[:, None]


def action_element_mask(
    exec_mask: torch.Tensor | None, dim_mask: torch.Tensor | None, shape: torch.Size | tuple[int, ...], where: str
) -> torch.Tensor:
    """``[B, H, A]`` bool: executed chunk step AND real action dim. None means all True.

    Raises ActionHeadError when a mask has the wrong shape, ``dim_mask`` has no real dim, or a row of
    ``exec_mask`` executes no action (such a row would have no log-prob at all).
    """
    batch, horizon, action_dim = shape
    if dim_mask is None:
        dims = torch.ones(action_dim, dtype=torch.bool)
    else:
        if dim_mask.shape != (action_dim,):
            raise ActionHeadError(f"{where}: dim_mask must be [A={action_dim}], got {tuple(dim_mask.shape)}")
        dims = dim_mask.to(torch.bool)
        if not bool(dims.any()):
            raise ActionHeadError(f"{where}: dim_mask masks every action dim; at least one must be real (True)")
    if exec_mask is None:
        steps = torch.ones(batch, horizon, dtype=torch.bool)
    else:
        if exec_mask.shape != (batch, horizon):
            raise ActionHeadError(
                f"{where}: exec_mask must be [B, H] = {(batch, horizon)}, got {tuple(exec_mask.shape)}"
            )
        steps = exec_mask.to(torch.bool)
        if not bool(steps.any(dim=1).all()):
            raise ActionHeadError(f"{where}: every row of exec_mask needs at least one executed (True) chunk step")
    return steps.to(dims.device)[:, :, None] & dims[None, None, :]


def _check_num_steps(num_steps: int, where: str) -> int:
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise ActionHeadError(f"{where}: num_steps must be an int >= 1, got {num_steps!r}")
    return num_steps


def _check_mode(mode: str, where: str) -> str:
    if mode not in MODES:
        raise ActionHeadError(f"{where}: mode must be one of {MODES}, got {mode!r}")
    return mode


def _check_chunk(x: torch.Tensor, name: str, where: str) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ActionHeadError(f"{where}: {name} must be a [B, H, A] tensor, got {shape}")


# ----------------------------------------------------------------------------------------------
# warm start


def sample_flow_time(
    batch_size: int,
    *,
    time_sampling: str = "beta",
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Training times t ``[B]`` float32: π0's ``0.999 · Beta(1.5, 1) + 0.001`` ("beta") or U(0, 1) ("uniform").

    Beta(α, 1) has CDF t^α, so it is drawn as ``U^(1/α)`` from one uniform draw of ``generator``. It puts more
    weight near t = 1 (high noise), as π0 does.
    """
    if time_sampling not in TIME_SAMPLINGS:
        raise ActionHeadError(f"sample_flow_time: time_sampling must be one of {TIME_SAMPLINGS}, got {time_sampling!r}")
    u = torch.rand(batch_size, generator=generator, dtype=torch.float32, device=device)
    if time_sampling == "uniform":
        return u
    return _BETA_SCALE * u.pow(1.0 / _BETA_ALPHA) + _BETA_OFFSET


def flow_matching_loss(
    expert: nn.Module,
    kv: PrefixKV,
    actions: torch.Tensor,
    dim_mask: torch.Tensor,
    *,
    step_mask: torch.Tensor | None = None,
    time_sampling: str = "beta",
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    time: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flow-matching loss of demo chunks: mean of ``(v(x_t, t) - (noise - actions))²`` over real elements.

    ``x_t = t · noise + (1 - t) · actions``. The mean runs over the real action dims (``dim_mask [A]``) and the
    valid chunk steps (``step_mask [B, H]``, e.g. a chunk cut by the episode's end; None = all valid) of every
    row. ``noise`` (default: standard normal from ``generator``) and ``time`` ``[B]`` (default:
    ``sample_flow_time``) can be given to make the loss deterministic. Returns a float32 scalar.
    """
    where = "flow_matching_loss"
    _check_chunk(actions, "actions", where)
    actions32 = actions.to(torch.float32)
    mask = action_element_mask(step_mask, dim_mask, actions32.shape, where).to(actions32.device)
    batch = actions32.shape[0]
    if noise is None:
        noise = torch.randn(actions32.shape, generator=generator, dtype=torch.float32, device=actions32.device)
    elif noise.shape != actions32.shape:
        raise ActionHeadError(f"{where}: noise has shape {tuple(noise.shape)}, actions {tuple(actions32.shape)}")
    if time is None:
        time = sample_flow_time(batch, time_sampling=time_sampling, generator=generator, device=actions32.device)
    elif time.shape != (batch,):
        raise ActionHeadError(f"{where}: time must be [B={batch}], got {tuple(time.shape)}")
    noise32 = noise.to(torch.float32)
    t = time.to(torch.float32)[:, None, None]
    x_t = t * noise32 + (1.0 - t) * actions32
    target = noise32 - actions32
    velocity = expert.velocity(x_t, time.to(torch.float32), kv).to(torch.float32)
    squared = torch.where(mask, (velocity - target) ** 2, torch.zeros_like(velocity))
    return squared.sum() / mask.sum()


# ----------------------------------------------------------------------------------------------
# one denoising step (shared by sampling and by the log-prob recomputation)


def _velocity(
    mode: str, expert: nn.Module, kv: PrefixKV, x: torch.Tensor, sigma: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The expert's velocity at (x, t = sigma), and its per-action features when Flow-Noise needs them."""
    if mode == "flow_noise":
        return expert.velocity_and_features(x, sigma, kv)
    return expert.velocity(x, sigma, kv), None


def _gaussian_step(
    mode: str,
    v: torch.Tensor,
    features: torch.Tensor | None,
    x: torch.Tensor,
    sigma: float,
    sigma_next: float,
    *,
    noise_level: float,
    noise_head: nn.Module | None,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
) -> sde_math.StepOutput:
    """The stochastic step of ``mode`` from t = sigma to t = sigma_next (sde_math), sampling or re-evaluating.

    Flow-SDE: ``sde_math.flow_sde_step`` (deterministic when its std is 0). Flow-Noise: ``sde_math.gaussian_step``
    around the ODE mean ``sde_math.ode_step(...).mean`` with std ``exp(noise_head(features))``.
    """
    if mode == "flow_noise":
        mean = sde_math.ode_step(v, x, sigma, sigma_next).mean
        std = torch.exp(noise_head(features))
        return sde_math.gaussian_step(mean, std, noise=noise, prev_sample=prev_sample)
    return sde_math.flow_sde_step(
        v, x, sigma, sigma_next, noise_level=noise_level, noise=noise, prev_sample=prev_sample
    )


def _masked_log_density(step: sde_math.StepOutput, mask: torch.Tensor) -> torch.Tensor:
    """Sum over the masked elements of the step's per-element log density: ``[B]`` float32."""
    density = sde_math.gaussian_log_density(step.prev_sample.detach(), step.mean, step.std)
    return torch.where(mask, density, torch.zeros_like(density)).sum(dim=(1, 2))


def _check_mode_inputs(mode: str, num_steps: int, noise_head: nn.Module | None, where: str) -> None:
    if mode in _SDE_MODES and num_steps < 2:
        raise ActionHeadError(
            f"{where}: {mode} needs num_steps >= 2 (the step to t = 0 is deterministic, so K = 1 has no density)"
        )
    if mode == "flow_noise" and noise_head is None:
        raise ActionHeadError(f"{where}: mode 'flow_noise' needs a noise_head (FlowNoiseHead)")


# ----------------------------------------------------------------------------------------------
# sampling and recomputation


@torch.no_grad()
def sample_chunk(
    expert: nn.Module,
    kv: PrefixKV,
    noise: torch.Tensor,
    *,
    mode: str,
    num_steps: int | None = None,
    noise_level: float = 0.5,
    generator: torch.Generator | None = None,
    sde_step_index: torch.Tensor | None = None,
    noise_head: nn.Module | None = None,
    step_noise: torch.Tensor | None = None,
    exec_mask: torch.Tensor | None = None,
    dim_mask: torch.Tensor | None = None,
) -> FlowChunkSample:
    """Denoise ``noise [B, H, A]`` (the chain's x at t = 1) in K steps with ``mode``; see the module docstring.

    ``num_steps`` defaults to ``expert.config.num_steps``. ``noise_level`` is Flow-SDE's a (πRL ≈ 0.5; 0 makes
    every step deterministic, reproducing the ODE sampler exactly). The per-step Gaussian noise is drawn from
    ``generator`` unless ``step_noise [K, B, H, A]`` is given. ``sde_step_index [B]`` fixes the stochastic step of
    "flow_sde_one" (default: uniform in 0..K-2 from ``generator``). ``exec_mask [B, H]`` and ``dim_mask [A]``
    select the elements that count in the recorded log-prob (None = all). Runs without gradients.
    """
    where = "sample_chunk"
    _check_mode(mode, where)
    _check_chunk(noise, "noise", where)
    if num_steps is None:
        num_steps = expert.config.num_steps
    _check_num_steps(num_steps, where)
    _check_mode_inputs(mode, num_steps, noise_head, where)
    x = noise.to(torch.float32)
    batch, device = x.shape[0], x.device
    mask = action_element_mask(exec_mask, dim_mask, x.shape, where).to(device)
    if step_noise is not None and step_noise.shape != (num_steps, *x.shape):
        raise ActionHeadError(f"{where}: step_noise must be [K, B, H, A] = {(num_steps, *x.shape)}")
    planned = _planned_stochastic(mode, num_steps, batch, sde_step_index, generator, device, where)
    times = flow_timesteps(num_steps).tolist()
    chain = [x]
    stochastic = torch.zeros(num_steps, batch, dtype=torch.bool, device=device)
    step_log_probs = torch.zeros(num_steps, batch, dtype=torch.float32, device=device)
    for k in range(num_steps):
        sigma, sigma_next = times[k], times[k + 1]
        rows = planned[k]
        v, features = _velocity(mode, expert, kv, x, sigma)
        if not bool(rows.any()):  # the ODE step ("ode"; the last step of Flow-SDE; unchosen steps of one-step)
            x = sde_math.ode_step(v, x, sigma, sigma_next).prev_sample
            chain.append(x)
            continue
        if step_noise is not None:
            eps = step_noise[k].to(device=device, dtype=torch.float32)
        else:
            eps = torch.randn(x.shape, generator=generator, dtype=torch.float32, device=device)
        step = _gaussian_step(
            mode, v, features, x, sigma, sigma_next, noise_level=noise_level, noise_head=noise_head, noise=eps
        )
        if step.deterministic:  # noise level 0: the Euler step of flow_sde_step, no density
            x = step.prev_sample
            chain.append(x)
            continue
        x_next = step.prev_sample
        if not bool(rows.all()):  # flow_sde_one: the ODE step for the rows not drawn at this step
            x_next = torch.where(rows[:, None, None], x_next, sde_math.ode_step(v, x, sigma, sigma_next).prev_sample)
        step_log_probs[k] = torch.where(rows, _masked_log_density(step, mask), torch.zeros_like(step_log_probs[k]))
        stochastic[k] = rows
        x = x_next
        chain.append(x)
    chain_t = torch.stack(chain, dim=0)
    return FlowChunkSample(
        actions=chain_t[-1],
        chain=chain_t,
        stochastic=stochastic,
        step_log_probs=step_log_probs,
        log_prob=step_log_probs.sum(dim=0),
        mode=mode,
        noise_level=float(noise_level),
    )


def _planned_stochastic(
    mode: str,
    num_steps: int,
    batch: int,
    sde_step_index: torch.Tensor | None,
    generator: torch.Generator | None,
    device: torch.device,
    where: str,
) -> torch.Tensor:
    """``[K, B]`` bool: the steps the mode makes stochastic (before a zero std turns one deterministic)."""
    planned = torch.zeros(num_steps, batch, dtype=torch.bool, device=device)
    if mode == "flow_noise":
        planned[:] = True
    elif mode == "flow_sde":
        planned[: num_steps - 1] = True
    elif mode == "flow_sde_one":
        if sde_step_index is None:
            sde_step_index = torch.randint(0, num_steps - 1, (batch,), generator=generator, device=device)
        index = torch.as_tensor(sde_step_index, dtype=torch.long, device=device)
        if index.shape != (batch,) or bool((index < 0).any()) or bool((index > num_steps - 2).any()):
            raise ActionHeadError(
                f"{where}: sde_step_index must be a [B={batch}] tensor with values in [0, K - 2 = {num_steps - 2}]"
            )
        planned[index, torch.arange(batch, device=device)] = True
    elif sde_step_index is not None:
        raise ActionHeadError(f"{where}: sde_step_index is only used by mode 'flow_sde_one', not {mode!r}")
    return planned


@dataclass
class ChainStep:
    """One stochastic step ``k`` of recorded chains re-evaluated: the Gaussian of ``chain[k + 1]`` given ``chain[k]``
    (``step.mean``, ``step.std``, ``step.prev_sample``) for the rows in ``index`` (None: every row), and those rows'
    element mask ``[rows, H, A]`` (executed chunk steps, real action dims)."""

    k: int
    index: torch.Tensor | None
    step: sde_math.StepOutput
    mask: torch.Tensor


def chain_steps(
    expert: nn.Module,
    kv: PrefixKV,
    chain: torch.Tensor,
    stochastic: torch.Tensor,
    *,
    mode: str,
    exec_mask: torch.Tensor | None,
    dim_mask: torch.Tensor | None,
    noise_level: float = 0.5,
    noise_head: nn.Module | None = None,
    where: str = "chain_steps",
) -> list[ChainStep]:
    """The stochastic steps of the stored ``chain [K + 1, B, H, A]`` (``stochastic [K, B]``) under the current expert
    (and noise head): one :class:`ChainStep` per step k with at least one stochastic row, the expert run on those rows
    only, with the element mask of ``exec_mask [B, H]`` and ``dim_mask [A]``. Gradients reach the expert, the noise
    head and, through ``kv``, the prefix; the chain is data."""
    _check_mode(mode, where)
    if mode == "ode":
        raise ActionHeadError(f"{where}: mode 'ode' is deterministic and has no log-prob to train")
    if not isinstance(chain, torch.Tensor) or chain.ndim != 4 or chain.shape[0] < 2:
        raise ActionHeadError(
            f"{where}: chain must be [K + 1, B, H, A] with K >= 1, got {getattr(chain, 'shape', None)}"
        )
    num_steps, batch = chain.shape[0] - 1, chain.shape[1]
    _check_mode_inputs(mode, num_steps, noise_head, where)
    if stochastic.shape != (num_steps, batch):
        raise ActionHeadError(
            f"{where}: stochastic must be [K, B] = {(num_steps, batch)}, got {tuple(stochastic.shape)}"
        )
    if kv.batch_size != batch:
        raise ActionHeadError(f"{where}: the chain has {batch} rows but the prefix cache has {kv.batch_size}")
    chain32 = chain.detach().to(torch.float32)
    mask = action_element_mask(exec_mask, dim_mask, chain32.shape[1:], where).to(chain32.device)
    stochastic = stochastic.to(device=chain32.device, dtype=torch.bool)
    times = flow_timesteps(num_steps).tolist()
    steps = []
    for k in range(num_steps):
        rows = stochastic[k]
        if not bool(rows.any()):
            continue
        if bool(rows.all()):
            index, kv_rows = None, kv
        else:
            index = rows.nonzero(as_tuple=True)[0]
            kv_rows = kv.index_select(index)
        x, x_next, mask_rows = chain32[k], chain32[k + 1], mask
        if index is not None:
            x, x_next, mask_rows = x[index], x_next[index], mask[index]
        v, features = _velocity(mode, expert, kv_rows, x, times[k])
        step = _gaussian_step(
            mode,
            v,
            features,
            x,
            times[k],
            times[k + 1],
            noise_level=noise_level,
            noise_head=noise_head,
            prev_sample=x_next,
        )
        if step.deterministic:
            raise ActionHeadError(
                f"{where}: step {k} is marked stochastic but is deterministic under mode {mode!r} "
                f"(noise_level={noise_level}); it has no density"
            )
        steps.append(ChainStep(k, index, step, mask_rows))
    return steps


def _sum_over_steps(steps: list[ChainStep], per_step, batch: int, device) -> torch.Tensor:
    """``[batch]``: for each row, the sum over its stochastic steps of ``per_step(step)`` over the step's mask."""
    total = torch.zeros(batch, dtype=torch.float32, device=device)
    for s in steps:
        value = per_step(s.step)
        value = torch.where(s.mask, value, torch.zeros_like(value)).sum(dim=(1, 2))
        total = total + (value if s.index is None else torch.zeros_like(total).index_add(0, s.index, value))
    return total


def chunk_log_prob(
    expert: nn.Module,
    kv: PrefixKV,
    chain: torch.Tensor,
    stochastic: torch.Tensor,
    *,
    mode: str,
    exec_mask: torch.Tensor | None,
    dim_mask: torch.Tensor | None,
    noise_level: float = 0.5,
    noise_head: nn.Module | None = None,
) -> torch.Tensor:
    """Recompute a chunk's log-prob ``[B]`` (with gradients) from its stored chain, as in training.

    Sums, over the steps k with ``stochastic[k, b]``, the log density of ``chain[k + 1]`` given ``chain[k]``
    under the current expert (and noise head), over executed chunk steps and real action dims only. With
    unchanged weights it equals ``FlowChunkSample.log_prob``. Each step runs the expert on the rows stochastic at
    that step only (one pass per chunk in total for "flow_sde_one"). Gradients reach the expert, the noise head
    and, through ``kv``, the prefix.
    """
    steps = chain_steps(
        expert,
        kv,
        chain,
        stochastic,
        mode=mode,
        exec_mask=exec_mask,
        dim_mask=dim_mask,
        noise_level=noise_level,
        noise_head=noise_head,
        where="chunk_log_prob",
    )
    return steps_log_prob(steps, chain.shape[1], chain.device)


def steps_log_prob(steps: list[ChainStep], batch: int, device) -> torch.Tensor:
    """The chunk log-prob ``[batch]`` of :func:`chain_steps`' output: each step's log density of ``chain[k + 1]``,
    summed over the executed chunk steps and real action dims."""
    return _sum_over_steps(
        steps, lambda st: sde_math.gaussian_log_density(st.prev_sample.detach(), st.mean, st.std), batch, device
    )


def gaussian_kl(mean: torch.Tensor, std: torch.Tensor, mean_ref: torch.Tensor, std_ref: torch.Tensor) -> torch.Tensor:
    """Per-element KL(N(mean, std²) || N(mean_ref, std_ref²)), float32, broadcast shape:
    ``log(std_ref / std) + (std² + (mean - mean_ref)²) / (2 std_ref²) - 1/2``.

    The closed form of two Gaussians (no sample, no clamp): >= 0, 0 only when they are equal, finite for positive
    stds, with gradients to ``mean`` and ``std`` (the reference is detached)."""
    mean, std = mean.to(torch.float32), torch.as_tensor(std, dtype=torch.float32, device=mean.device)
    mean_ref = mean_ref.detach().to(torch.float32)
    std_ref = torch.as_tensor(std_ref, dtype=torch.float32, device=mean.device).detach()
    var, var_ref = std * std, std_ref * std_ref
    return torch.log(std_ref) - torch.log(std) + (var + (mean - mean_ref) ** 2) / (2.0 * var_ref) - 0.5


def steps_kl(steps: list[ChainStep], ref_steps: list[ChainStep], batch: int, device) -> torch.Tensor:
    """KL ``[B]`` of the chain's stochastic transitions to the reference's, on the recorded chain: for each row, the
    sum over its stochastic steps k of KL(p(x_{k+1} | x_k) || p_ref(x_{k+1} | x_k)) (both Gaussian, :func:`gaussian_kl`)
    over the executed chunk steps and real action dims. ``ref_steps``: :func:`chain_steps` of the same chain under the
    reference weights (same chain, steps and rows)."""
    if [(s.k, None if s.index is None else s.index.tolist()) for s in steps] != [
        (s.k, None if s.index is None else s.index.tolist()) for s in ref_steps
    ]:
        raise ActionHeadError("steps_kl: the reference's stochastic steps differ from the policy's (another chain?)")
    ref = iter(ref_steps)

    def kl(st: sde_math.StepOutput) -> torch.Tensor:
        r = next(ref).step
        return gaussian_kl(st.mean, st.std, r.mean, r.std).expand_as(st.mean)

    return _sum_over_steps(steps, kl, batch, device)
