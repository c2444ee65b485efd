"""Every key of the continuous VLA action heads reaches the likelihood (issue 26; the ``algo.*`` keys are in
tests/wiring/test_knobs_reach_math.py).

Each run is built through the public entry point, ``Trainer.from_config([...overrides...])``, on ``task=vla_reach``
(tiny Qwen-VL backbone, tabletop simulator, one env worker), collects one rollout with ``Trainer.collect()`` and
compares what the trainer trains on with a reference written out below in plain torch/math:

- the recorded chunk log-prob (``Rollout.rollout_logp``, the PPO ratio's old log-prob) and the training-time
  recomputation (``policy.log_probs``, the new one) equal :func:`ref_flow_logp` / :func:`ref_gaussian_logp`: a sum of
  Gaussian log densities ``-(x - mu)^2 / (2 s^2) - log s - log sqrt(2 pi)`` over exactly the stochastic denoising
  steps, executed actions and real action dims the key implies, with the means / stds computed here from the
  recorded chain and the model's raw outputs (the expert's velocity, the noise head's and the log-std layer's
  pre-activations); the gradient of the recomputed log-prob with respect to the head's parameters equals the
  gradient of the reference (:func:`_check_logp`);
- the flow warm-start loss (``policy.sft_loss``) equals :func:`ref_flow_sft_loss`, drawn from the same seed.

Nothing of :mod:`mmrl.rollout.sde_math`, :mod:`mmrl.adapters.vla.flow_chain` or :mod:`mmrl.adapters.vla.gaussian_head`
is called here. Each row of a table names one key, a value and an alternative: the run of each value must match the
reference of its own settings, *and* the reference of the alternative, evaluated on the value's recorded data, must
not (where the alternative describes data of another shape, e.g. another ``num_steps``, the two runs' records must
differ), so a key that is read but not passed on fails. Keys covered (grep the tables):

- flow head (``model.action_head=flow``, :data:`FLOW_KNOBS`): ``model.likelihood`` (flow_sde: K - 1 stochastic steps,
  flow_sde_one: 1, flow_noise: K; the other steps must be Euler ODE steps of the chain), ``model.noise_level``
  (flow_sde / flow_sde_one), ``model.num_steps``, ``model.n_action_steps`` (also: actions executed per policy call),
  ``model.head_action_dim`` (padding dims contribute nothing), ``model.noise_min_std``, ``model.noise_max_std``
  (flow_noise)
- flow warm start (:data:`SFT_KNOBS`): ``model.time_sampling``, ``model.head_action_dim``
- Gaussian head (``model.action_head=gaussian``, :data:`GAUSSIAN_KNOBS`): ``model.log_std`` (learned / state),
  ``model.init_log_std`` (both kinds), ``model.log_std_min``, ``model.log_std_max``

The state-dependent log-std layer starts with zero weights (its log-std is ``init_log_std`` everywhere, whatever the
bounds), so the test gives it random weights (:func:`_perturb`) for the bounds to matter; its bias stays the one the
config implies, which the reference computes itself. Each configuration is built once (:class:`Runs`); the trainers'
env workers are closed as soon as their rollout is collected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("mujoco")

from mmrl.policies.base import PromptBatch  # noqa: E402
from mmrl.rollout.noise import mix_seed  # noqa: E402
from mmrl.trainer import Trainer  # noqa: E402

BASE = [
    "task=vla_reach",
    "task.tasks=[reach_red,reach_blue]",
    "task.train_init_states=2",
    "task.demo_episodes=2",
    "task.max_steps=3",
    "task.eval_videos=0",
    "task.image_size=32",
    "trainer.warm_start.steps=0",
    "trainer.batch_size=2",
    "trainer.logging.progress=false",
    "trainer.logging.tensorboard=false",
    "trainer.logging.plot=false",
    "trainer.eval.at_end=false",
    "algo.group_size=2",
    "algo.filter_groups=false",
    "model.num_workers=1",
    "model.chunk=2",
    "model.expert_width=32",
    "model.expert_depth=1",
    "model.expert_heads=2",
]
"""Two tasks x two initial states; episodes of at most 3 env steps in chunks of H = 2 actions."""
CHUNK = 2
ENV_DIM = 4  # vla_reach: xyz + gripper

FLOW = {
    "model.action_head": "flow",
    "model.likelihood": "flow_sde",
    "model.noise_level": 0.5,
    "model.num_steps": 3,
    "model.n_action_steps": None,
    "model.head_action_dim": None,
    "model.noise_min_std": 0.08,
    "model.noise_max_std": 0.16,
    "model.time_sampling": "beta",
}
GAUSSIAN = {
    "model.action_head": "gaussian",
    "model.log_std": "learned",
    "model.init_log_std": -1.0,
    "model.log_std_min": -5.0,
    "model.log_std_max": 1.0,
    "model.n_action_steps": None,
    "model.head_action_dim": None,
}
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
SFT_SALT = 0x5F7
"""The policy's warm-start generator is seeded with ``mix_seed(*batch.seeds, SFT_SALT)`` and draws the noise, then
the times (the fixed seed the SFT reference reproduces)."""


class Mismatch(Exception):
    """The settings describe data of another shape than the recorded one (another K, A, likelihood, head kind)."""


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# ----------------------------------------------------------------------------------------------- the runs
@dataclass
class Run:
    """One configuration built through ``Trainer.from_config`` and (lazily) its rollout."""

    settings: dict
    trainer: Trainer
    _rollout: object = None
    checked: dict = field(default_factory=dict)

    @property
    def policy(self):
        return self.trainer.policy

    @property
    def rollout(self):
        if self._rollout is None:
            self._rollout, _ = self.trainer.collect()
            self.policy.close()  # the env worker is not needed any more (log_probs / sft_loss never step an env)
        return self._rollout


class Runs:
    """Each configuration built once per module (rows share their base configurations)."""

    def __init__(self, root) -> None:
        self.root = root
        self.cache: dict[tuple, Run] = {}

    def get(self, settings: dict) -> Run:
        key = tuple(sorted(settings.items()))
        if key not in self.cache:
            name = f"run{len(self.cache)}"
            overrides = [
                *BASE,
                f"task.demos_path={self.root / 'demos'}",  # collected by the first build, loaded by the others
                f"trainer.output_dir={self.root / name}",
                *(f"{k}={_fmt(v)}" for k, v in settings.items()),
            ]
            tr = Trainer.from_config(overrides)
            for k, v in settings.items():
                assert getattr(tr.cfg.model, k.split(".", 1)[1]) == v, k
            _perturb(tr.policy, settings)
            self.cache[key] = Run(settings, tr)
        return self.cache[key]

    def close(self) -> None:
        for run in self.cache.values():
            run.policy.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    r = Runs(tmp_path_factory.mktemp("vla_head_knobs"))
    yield r
    r.close()
    torch.set_num_threads(threads)


def _perturb(policy, settings: dict) -> None:
    """Random weights for the state-dependent log-std layer (zero at init: a constant log-std hides the bounds)."""
    if settings.get("model.log_std") == "state":
        layer = policy.module.head.log_std_out
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) * 1.5 / math.sqrt(layer.in_features))


# ----------------------------------------------------------------------------------------------- recorded data
@dataclass
class Recorded:
    """The rollout's policy calls, one row per (episode, call): ``where`` the [B, T] position of each row."""

    where: tuple[torch.Tensor, torch.Tensor]
    record: dict[str, torch.Tensor]
    frames: torch.Tensor
    instructions: list[str]
    states: torch.Tensor | None


def recorded(ro, keys: tuple[str, ...]) -> Recorded:
    pay = ro.payload
    calls = [int(f.shape[0]) for f in pay["frames"]]
    live = [k for k, n in enumerate(calls) if n]
    rows = [k for k in live for _ in range(calls[k])]
    cols = [c for k in live for c in range(calls[k])]
    return Recorded(
        where=(torch.tensor(rows), torch.tensor(cols)),
        record={key: torch.cat([pay[key][k] for k in live]) for key in keys},
        frames=torch.cat([torch.as_tensor(pay["frames"][k]) for k in live]),
        instructions=[pay["instruction"][k] for k in rows],
        states=torch.cat([pay["state"][k] for k in live]) if pay.get("state") is not None else None,
    )


def prefix(policy, rec: Recorded):
    """The backbone's prefix (hidden states, mask) of every recorded row, through the policy's backbone forward.
    (The prefix is the model's input to the head: no key of this file acts on it.)"""
    prompts, index, states = policy._distinct_observations(rec.frames, rec.instructions, None, rec.states)
    module, hidden, mask = policy._prefix_forward(prompts, None, states, lambda m, h, k: (m, h, k))
    index = index.to(hidden.device)
    return module, hidden.index_select(0, index), mask.index_select(0, index)


def element_mask(n_rows: int, s: dict, *, head_dim: int, count_padding: bool = False) -> torch.Tensor:
    """[N, H, A] True for the executed actions (the first n_action_steps) and the env's real action dims."""
    n_exec = s["model.n_action_steps"] or CHUNK
    m = torch.zeros(n_rows, CHUNK, head_dim, dtype=torch.bool)
    m[:, :n_exec, : (head_dim if count_padding else ENV_DIM)] = True
    return m


def log_density(x, mean, std):
    """Per-element log N(x; mean, std^2), float64."""
    x, mean, std = x.double(), mean.double(), std.double()
    return -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - LOG_SQRT_2PI


# ----------------------------------------------------------------------------------------------- flow reference
def planned_steps(s: dict, stochastic: torch.Tensor) -> torch.Tensor:
    """[N, K] the steps the likelihood makes stochastic: flow_sde every step but the last (to t = 0, std 0), flow_noise
    every step, flow_sde_one exactly one of 0..K-2 per chunk (which one is drawn at random: the recorded one)."""
    K = s["model.num_steps"]
    N = stochastic.shape[0]
    if stochastic.shape != (N, K):
        raise Mismatch(f"stochastic marks {tuple(stochastic.shape)}, K = {K}")
    like = s["model.likelihood"]
    planned = torch.zeros(N, K, dtype=torch.bool)
    if like == "flow_sde":
        planned[:, : K - 1] = True
    elif like == "flow_noise":
        planned[:] = True
    else:
        assert like == "flow_sde_one"
        if not (stochastic.sum(1) == 1).all() or stochastic[:, K - 1].any():
            raise Mismatch("flow_sde_one: not exactly one stochastic step in 0..K-2 per chunk")
        planned = stochastic.clone()
    return planned


def ref_flow_logp(module, hidden, mask, rec: Recorded, s: dict, *, count_padding: bool = False) -> torch.Tensor:
    """[N] chunk log-probs of the recorded chains under the settings ``s``, float64 (differentiable in the model)."""
    chain, stochastic = rec.record["chain"], rec.record["stochastic"]
    K = s["model.num_steps"]
    head_dim = s["model.head_action_dim"] or ENV_DIM
    N = chain.shape[0]
    if tuple(chain.shape[1:]) != (K + 1, CHUNK, head_dim):
        raise Mismatch(f"chain {tuple(chain.shape)} for K = {K}, H = {CHUNK}, A = {head_dim}")
    steps = planned_steps(s, stochastic)
    if not torch.equal(steps, stochastic):
        raise Mismatch(f"stochastic steps {stochastic.tolist()}, the likelihood implies {steps.tolist()}")
    like = s["model.likelihood"]
    if like == "flow_noise" and module.noise_head is None:
        raise Mismatch("flow_noise without a noise head")
    elem = element_mask(N, s, head_dim=head_dim, count_padding=count_padding)
    kv = module.head.prefix_kv(hidden, mask)
    total = torch.zeros(N, dtype=torch.float64)
    for k in range(K):
        t, t_next = 1.0 - k / K, 1.0 - (k + 1) / K
        x, x_next = chain[:, k], chain[:, k + 1]
        v, features = module.head.velocity_and_features(x, t, kv)
        dt = t_next - t
        ode = ~steps[:, k]
        if ode.any():  # a deterministic step is the Euler step of the ODE
            euler = (x + v.detach() * dt)[ode]
            torch.testing.assert_close(x_next[ode], euler, rtol=1e-5, atol=1e-5, msg=f"ODE step {k}")
        if not steps[:, k].any():
            continue
        xd, vd = x.double(), v.double()
        if like == "flow_noise":
            mean = xd + vd * dt
            raw = module.noise_head.net(features).double()
            lo, hi = math.log(s["model.noise_min_std"]), math.log(s["model.noise_max_std"])
            std = torch.exp(lo + (hi - lo) * torch.sigmoid(raw))
        else:  # Flow-GRPO's reverse SDE; at t = 1 the diffusion coefficient is taken at t_next
            a = s["model.noise_level"]
            root = t_next if t >= 1.0 else t
            g = a * math.sqrt(root / (1.0 - root))
            mean = xd + (vd + g * g / (2.0 * t) * (xd + (1.0 - t) * vd)) * dt
            std = torch.full_like(mean, g * math.sqrt(t - t_next))
        dens = log_density(x_next, mean, std)
        keep = elem & steps[:, k, None, None]
        total = total + torch.where(keep, dens, torch.zeros_like(dens)).sum((1, 2))
    return total


# ----------------------------------------------------------------------------------------------- Gaussian reference
def ref_gaussian_logp(module, hidden, mask, rec: Recorded, s: dict, **_) -> torch.Tensor:
    """[N] log-probs of the recorded unclipped chunks under N(mean, exp(log_std)^2) with the log-std the settings
    imply: learned = ``init_log_std`` (at the start of training), state = ``lo + (hi - lo) sigmoid(W f + b)`` with
    ``sigmoid(b) = (init - lo) / (hi - lo)``. Values come from the settings; gradients reach the parameters."""
    actions = rec.record["actions"]
    head = module.head
    head_dim = s["model.head_action_dim"] or ENV_DIM
    N = actions.shape[0]
    if tuple(actions.shape[1:]) != (CHUNK, head_dim):
        raise Mismatch(f"actions {tuple(actions.shape)} for H = {CHUNK}, A = {head_dim}")
    init = s["model.init_log_std"]
    seen = {}
    hook = None
    if s["model.log_std"] == "state":
        if not hasattr(head, "log_std_out"):
            raise Mismatch("log_std=state but the head has no state-dependent log-std")
        hook = head.log_std_out.register_forward_hook(lambda m, args, out: seen.setdefault("f", args[0]))
    try:
        mean, _ = head(hidden, mask)
    finally:
        if hook is not None:
            hook.remove()
    if s["model.log_std"] == "learned":
        param = head.log_std if isinstance(getattr(head, "log_std", None), torch.nn.Parameter) else None
        log_std = torch.full((head_dim,), init, dtype=torch.float64)
        if param is not None:  # the value from the settings, the gradient to the parameter
            log_std = log_std + (param.double() - param.double().detach())
        log_std = log_std.expand(N, CHUNK, head_dim)
    else:
        lo, hi = s["model.log_std_min"], s["model.log_std_max"]
        layer = head.log_std_out
        p = (init - lo) / (hi - lo)
        bias = torch.full((head_dim,), math.log(p / (1 - p)), dtype=torch.float64)
        bias = bias + (layer.bias.double() - layer.bias.double().detach())
        raw = seen["f"].double() @ layer.weight.double().T + bias
        log_std = lo + (hi - lo) * torch.sigmoid(raw)
    dens = log_density(actions, mean, torch.exp(log_std))
    elem = element_mask(N, s, head_dim=head_dim)
    return torch.where(elem, dens, torch.zeros_like(dens)).sum((1, 2))


# ----------------------------------------------------------------------------------------------- the checks
def _reference(run: Run, s: dict, **kw) -> torch.Tensor:
    flow = s["model.action_head"] == "flow"
    rec = recorded(run.rollout, ("chain", "stochastic") if flow else ("actions",))
    with torch.no_grad():
        module, hidden, mask = prefix(run.policy, rec)
        return (ref_flow_logp if flow else ref_gaussian_logp)(module, hidden, mask, rec, s, **kw)


def _own(fn, *args, **kw):
    """A reference of the run's own settings: data of another shape than they imply is a failure of the run."""
    try:
        return fn(*args, **kw)
    except Mismatch as e:
        pytest.fail(f"the recorded data do not fit the run's own settings: {e}")


def _check_logp(run: Run) -> torch.Tensor:
    """The run's recorded and recomputed log-probs (and the recomputed one's gradient) equal its reference; returns
    the recorded log-probs [N]."""
    if "logp" in run.checked:
        return run.checked["logp"]
    s, policy, ro = run.settings, run.policy, run.rollout
    flow = s["model.action_head"] == "flow"
    rec = recorded(ro, ("chain", "stochastic") if flow else ("actions",))
    recorded_logp = ro.rollout_logp[rec.where]
    assert ro.valid.all() and torch.equal(ro.mask[rec.where], torch.ones(len(rec.instructions)))
    assert float(ro.mask.sum()) == len(rec.instructions)  # one log-prob per policy call, no other column
    params = [p for p in policy.module.head_modules().parameters() if p.requires_grad]
    # the reference, with gradients into the head
    module, hidden, mask = prefix(policy, rec)
    ref = _own(ref_flow_logp if flow else ref_gaussian_logp, module, hidden, mask, rec, s)
    ref_grads = torch.autograd.grad(ref.sum(), params, allow_unused=True)
    # what the trainer trains on: the old log-prob (rollout) and the new one (recomputed, with gradients)
    new = policy.log_probs(ro).logp
    new_rows = new[rec.where]
    grads = torch.autograd.grad((new * ro.mask).sum(), params, allow_unused=True)
    # float32 (policy) vs float64 (reference) arithmetic: ~1e-5 relative on the values, ~1e-4 of each gradient's scale
    torch.testing.assert_close(recorded_logp.double(), ref.detach(), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(new_rows.detach().double(), ref.detach(), rtol=1e-4, atol=1e-3)
    for p, g, r in zip(params, grads, ref_grads):
        g = torch.zeros_like(p) if g is None else g
        r = torch.zeros_like(p) if r is None else r.float()
        torch.testing.assert_close(g, r, rtol=0.0, atol=2e-3 * max(float(r.abs().max()), 1e-6))
    assert any(float(g.abs().max()) > 0 for g in grads if g is not None)  # not vacuous
    run.checked["logp"] = recorded_logp
    return recorded_logp


def _differs(value_run: Run, alt_run: Run, alt: dict) -> None:
    """The alternative's reference on the value's data is not the value's log-prob (or, where the alternative
    describes other shapes, the two runs recorded different things)."""
    mine = _check_logp(value_run)
    try:
        other = _reference(value_run, alt)
    except Mismatch:
        theirs = _check_logp(alt_run)
        assert mine.shape != theirs.shape or float((mine - theirs).abs().max()) > 0.05
        return
    assert float((other - mine.double()).abs().max()) > 0.05, "the alternative gives the same log-prob"


def _ids(table):
    return [
        f"{k}={_fmt(v)}_vs_{_fmt(alt)}" + ("+" + ",".join(f"{a}={_fmt(b)}" for a, b in extra.items()) if extra else "")
        for k, v, alt, extra in table
    ]


# ----------------------------------------------------------------------------------------------- the tables
# (key, value, alternative, other settings of the row)
FLOW_KNOBS = [
    ("model.likelihood", "flow_sde_one", "flow_sde", {}),
    ("model.likelihood", "flow_noise", "flow_sde", {}),
    ("model.noise_level", 0.9, 0.5, {}),
    ("model.num_steps", 4, 3, {}),
    ("model.n_action_steps", 1, None, {}),
    ("model.head_action_dim", 6, None, {}),
    ("model.noise_min_std", 0.12, 0.08, {"model.likelihood": "flow_noise"}),
    ("model.noise_max_std", 0.3, 0.16, {"model.likelihood": "flow_noise"}),
]
GAUSSIAN_KNOBS = [
    ("model.log_std", "state", "learned", {}),
    ("model.init_log_std", -0.5, -1.0, {}),
    ("model.init_log_std", -0.5, -1.0, {"model.log_std": "state"}),
    ("model.log_std_min", -3.0, -5.0, {"model.log_std": "state"}),
    ("model.log_std_max", 0.0, 1.0, {"model.log_std": "state"}),
]


@pytest.mark.parametrize("key, value, alt, extra", FLOW_KNOBS, ids=_ids(FLOW_KNOBS))
def test_flow_knob_reaches_the_log_prob(runs, key, value, alt, extra):
    _knob_reaches_the_log_prob(runs, FLOW, key, value, alt, extra)


@pytest.mark.parametrize("key, value, alt, extra", GAUSSIAN_KNOBS, ids=_ids(GAUSSIAN_KNOBS))
def test_gaussian_knob_reaches_the_log_prob(runs, key, value, alt, extra):
    _knob_reaches_the_log_prob(runs, GAUSSIAN, key, value, alt, extra)


def _knob_reaches_the_log_prob(runs, base, key, value, alt, extra):
    s_value, s_alt = {**base, **extra, key: value}, {**base, **extra, key: alt}
    value_run, alt_run = runs.get(s_value), runs.get(s_alt)
    _check_logp(value_run)
    _check_logp(alt_run)
    _differs(value_run, alt_run, s_alt)
    if key == "model.head_action_dim":  # the padding dims are sampled (in the chain) but would change the log-prob
        padded = _reference(value_run, s_value, count_padding=True)
        assert float((padded - _check_logp(value_run).double()).abs().max()) > 1e-3
    if key == "model.n_action_steps":  # the env executes n_action_steps actions per policy call
        for run in (value_run, alt_run):
            n_exec = run.settings[key] or CHUNK
            for sample in run.rollout.samples:
                assert sample["policy_calls"] == math.ceil(sample["length"] / n_exec), sample


# ----------------------------------------------------------------------------------------------- the warm start
def ref_flow_sft_loss(policy, items, targets, seeds, seen, s: dict, *, count_padding=False) -> torch.Tensor:
    """Flow matching on the demo chunks ``a`` (normalised, padding dims 0): noise ``n ~ N(0, 1)`` then ``u ~ U(0, 1)``
    from the seeded generator, ``t = u`` (uniform) or ``0.999 u^(1 / 1.5) + 0.001`` (beta, pi0), ``x_t = t n + (1 - t)
    a``; the loss is the mean over executed real elements of ``(v(x_t, t) - (n - a))^2``. ``seen``: the (x_t, t, v)
    the expert was called with, checked against the reference's x_t and t."""
    a = torch.stack([policy.target_chunk(t) for t in targets]).double()
    head_dim = s["model.head_action_dim"] or ENV_DIM
    if tuple(a.shape[1:]) != (CHUNK, head_dim):
        raise Mismatch(f"targets {tuple(a.shape)}")
    g = torch.Generator().manual_seed(mix_seed(*seeds, SFT_SALT))
    noise = torch.randn(a.shape, generator=g, dtype=torch.float32).double()
    u = torch.rand(a.shape[0], generator=g, dtype=torch.float32).double()
    t = u if s["model.time_sampling"] == "uniform" else 0.999 * u ** (1 / 1.5) + 0.001
    x_t, t_seen, v = seen
    if not torch.allclose(t_seen.double(), t, atol=1e-6):
        raise Mismatch(f"times {t_seen.tolist()}, the reference draws {t.tolist()}")
    tt = t[:, None, None]
    torch.testing.assert_close(x_t.double(), tt * noise + (1 - tt) * a, rtol=1e-5, atol=1e-5)
    elem = torch.zeros(a.shape, dtype=torch.bool)
    elem[:, :, : (head_dim if count_padding else ENV_DIM)] = True  # every chunk step of a demo chunk is trained
    return ((v.double() - (noise - a)) ** 2)[elem].mean()


def _sft(run: Run):
    """The policy's warm-start loss on two demo observations with fixed seeds, and the expert's inputs/output."""
    policy, task = run.policy, run.trainer.task
    items = task.sft_items()[:4:3]  # two observations of the first demo
    meta = policy.sample_meta(items)
    targets = [task.sft_target(it, m) for it, m in zip(items, meta)]
    seeds = [11, 23]
    head = policy.module.head
    seen = []

    def spy(x_t, t, kv):
        v = type(head).velocity(head, x_t, t, kv)
        seen.append((x_t.detach(), torch.as_tensor(t).detach(), v.detach()))
        return v

    head.velocity = spy  # an instance attribute over the method, removed below
    try:
        with torch.no_grad():
            loss = policy.sft_loss(PromptBatch(items=items, indices=[0, 1], seeds=seeds), targets)
    finally:
        del head.velocity
    assert len(seen) == 1
    return float(loss), (policy, items, targets, seeds, seen[0])


SFT_KNOBS = [
    ("model.time_sampling", "uniform", "beta", {}),
    ("model.head_action_dim", 6, None, {}),
]


@pytest.mark.parametrize("key, value, alt, extra", SFT_KNOBS, ids=_ids(SFT_KNOBS))
def test_flow_knob_reaches_the_warm_start_loss(runs, key, value, alt, extra):
    s_value, s_alt = {**FLOW, **extra, key: value}, {**FLOW, **extra, key: alt}
    losses = {}
    for s in (s_value, s_alt):
        run = runs.get(s)
        loss, args = _sft(run)
        assert loss == pytest.approx(float(_own(ref_flow_sft_loss, *args, s)), rel=1e-5)
        losses[s[key]] = (loss, args)
    loss, args = losses[value]
    try:
        other = float(ref_flow_sft_loss(*args, s_alt))
    except Mismatch:
        other = losses[alt][0]
    assert abs(other - loss) > 1e-4 * abs(loss), "the alternative gives the same warm-start loss"
    if key == "model.head_action_dim":  # the padding dims (target 0) would change the loss
        assert abs(float(_own(ref_flow_sft_loss, *args, s_value, count_padding=True)) - loss) > 1e-4 * abs(loss)
