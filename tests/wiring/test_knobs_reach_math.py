"""Every config key that changes what is optimised reaches the math (issue 26).

Each run is built through the public entry point, ``Trainer.from_config([...overrides...])``, on a fixed rollout
(:mod:`tests.fixed_policy`: the log-prob of every action is one free parameter ``theta[i, t]``, the critic value
another, ``v[i, t]``), takes one ``train_step()``, and the gradient the optimizer sees is compared with the gradient
of a loss written out below in plain Python/torch (:func:`reference`): group statistics with :mod:`statistics`,
the clipped surrogate case by case, GAE as a loop. Nothing here calls :mod:`mmrl.algos`.

Each row of :data:`KNOBS` names one key, a value and an alternative: the test checks that the trainer matches the
reference at both values *and* that the two gradients differ, so a key that is read but not passed on (e.g.
``clip_high=cfg.clip_low``) fails. Keys covered (grep the tables):

- policy loss: ``algo.clip_low``, ``algo.clip_high``, ``algo.dual_clip``, ``algo.policy_loss``, ``algo.old_logp``
- aggregation: ``algo.loss_agg``, ``algo.loss_max_len``
- KL: ``algo.kl_coef``, ``algo.kl_estimator``, ``algo.kl_in_reward``
- ``algo.entropy_coef``; truncated IS / decoupled PPO: ``algo.truncated_is``, ``algo.is_cap``, ``algo.is_mode``
- advantages: ``algo.advantage`` (grpo, drgrpo, rloo, reinforce_pp, gae), ``algo.adv_scale``, ``algo.adv_eps``,
  ``algo.adv_clip``, ``algo.reinforce_baseline``, ``algo.gamma``, ``algo.lam``
- critic: ``algo.vf_coef``, ``algo.value_clip`` (:func:`test_value_clip_reaches_the_value_loss`)
- group filtering: ``algo.filter_groups``, ``algo.max_resample`` (:data:`FILTER_KNOBS`)
- T-GRPO: ``algo.tgrpo.shuffled_group``, ``.alpha``, ``.mu``, ``.threshold``, ``.correct_reward`` (:data:`TGRPO_KNOBS`)
- rewards: ``reward.fns``, ``reward.weights``, ``reward.mode`` (:data:`REWARD_KNOBS`)
- ``trainer.grad_accum``: micro-batches give the one-batch gradient (:func:`test_gradient_accumulation_gives_the_one_batch_gradient`)

Masking of invalid samples is in tests/wiring/test_masking_end_to_end.py.
"""

from __future__ import annotations

import functools
import math
import statistics

import pytest
import torch

from mmrl.config import load_config
from tests.fixed_policy import FMT_WEIGHT, FixedData, Round, build, ratios, record_grads, train_step

# ----------------------------------------------------------------------------------------------- the fixed rollout
# Two prompts x four samples, three actions each (lengths 3, 2, 3, 1, 3, 3, 2, 3). Rewards r = a + 0.5 f:
# group 0: 1.0, 0.5, 1.0, 0.0 (mean 0.625: advantage signs + - + -); group 1: 0.7, 0.9, 1.4, 0.9 (mean 0.975: - - + -).
# Importance ratios exp(theta - behaviour) are chosen so each clip setting bites somewhere: 1.25 with A > 0 (inside
# clip_high 0.28, outside 0.2), 0.75 with A < 0 (outside clip_low 0.2, inside 0.3), 5.0 and 4.0 with A < 0 (dual clip 3).
MAIN = Round(
    a=[1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.9, 0.4],
    f=[0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0],
    b=[0.5, 1.5, 0.0, 2.0, 1.0, 0.5, 0.25, 3.0],
    groups=[0, 0, 0, 0, 1, 1, 1, 1],
    lengths=[3, 2, 3, 1, 3, 3, 2, 3],
    log_ratio=[
        ratios(1.25, 1.0, 0.9),
        ratios(0.75, 5.0),
        ratios(1.6, 1.1, 1.25),
        ratios(5.0),
        ratios(0.75, 1.1, 0.5),
        ratios(0.9, 2.5, 1.25),
        ratios(0.5, 1.25),
        ratios(1.0, 0.75, 4.0),
    ],
)

ALGO_DEFAULTS = {  # every algo key the reference reads, given explicitly (no preset default is relied on)
    "algo.advantage": "grpo",
    "algo.adv_scale": "group",
    "algo.adv_eps": 1e-6,
    "algo.adv_clip": None,
    "algo.reinforce_baseline": "none",
    "algo.policy_loss": "ppo_clip",
    "algo.clip_low": 0.2,
    "algo.clip_high": 0.2,
    "algo.dual_clip": None,
    "algo.loss_agg": "token_mean",
    "algo.loss_max_len": None,
    "algo.kl_coef": 0.0,
    "algo.kl_estimator": "k3",
    "algo.kl_in_reward": False,
    "algo.entropy_coef": 0.0,
    "algo.old_logp": "rollout",
    "algo.truncated_is": False,
    "algo.is_cap": 2.0,
    "algo.is_mode": "truncate",
    "algo.gamma": 1.0,
    "algo.lam": 0.95,
    "algo.vf_coef": 0.5,
    "algo.value_clip": 0.2,
    "algo.filter_groups": False,
    "algo.max_resample": 2,
    "algo.ppo_epochs": 1,
    "algo.num_minibatches": 1,
}


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v)


@functools.lru_cache(maxsize=1)
def _preset():
    from tests.fixed_policy import BASE

    return load_config(list(BASE))


def _configured(cfg, key: str):
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    return obj


def overrides_of(settings: dict) -> list[str]:
    """``key=value`` overrides for the settings that differ from the preset (Hydra parses every override, and the
    fewer there are the faster a run builds); :func:`assert_configured` checks that the built run has all of them."""
    preset = _preset()
    given = ("algo.clip_low", "algo.clip_high")  # unset, they follow algo.policy_loss (gspo: 3e-4 / 4e-4): always given
    return [
        f"{k}={_fmt(v)}"
        for k, v in settings.items()
        if k.startswith("reward.") or k in given or _configured(preset, k) != v
    ]


def assert_configured(cfg, settings: dict) -> None:
    for k, v in settings.items():
        if not k.startswith("reward."):
            assert _configured(cfg, k) == v, (k, _configured(cfg, k), v)


# ----------------------------------------------------------------------------------------------- the reference
def ref_rewards(data: FixedData, s: dict) -> list[float]:
    """Total reward of each sample: task rewards (accuracy weight 1, fmt weight 0.5) and the user's b reward."""

    def num(x):  # None / "raise" (masked samples: their reward is never read)
        return float(x) if isinstance(x, (int, float)) else math.nan

    a = [num(x) for r in data.rounds for x in r.a]
    f = [num(x) for r in data.rounds for x in r.f]
    b = [x for r in data.rounds for x in r.b]
    w = s.get("reward.weights") or [1.0]
    user = [w[0] * bi for bi in b] if s.get("reward.fns") else [0.0] * len(b)
    if s.get("reward.mode") == "replace":
        return user
    return [ai + FMT_WEIGHT * fi + ui for ai, fi, ui in zip(a, f, user)]


def kl_value(logp, ref, kind):
    x = logp - ref
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x * x
    return torch.exp(-x) + x - 1.0  # k3: exp(ref - logp) - (ref - logp) - 1


def ref_outcome_advantages(r: list[float], groups: list[int], valid: list[bool], s: dict) -> list[float]:
    kind, eps = s["algo.advantage"], s["algo.adv_eps"]
    idx = [i for i in range(len(r)) if valid[i]]
    members = {g: [r[i] for i in idx if groups[i] == g] for g in {groups[i] for i in idx}}
    adv = [0.0] * len(r)
    if kind == "reinforce_pp":
        group_base = s["algo.reinforce_baseline"] == "group"
        raw = {i: r[i] - (statistics.mean(members[groups[i]]) if group_base else 0.0) for i in idx}
        centre = 0.0 if group_base else statistics.mean(raw.values())
        sd = statistics.stdev(raw.values()) if len(idx) > 1 else 0.0
        for i in idx:
            adv[i] = (raw[i] - centre) / (sd + eps) if sd > 0 else 0.0
    else:
        batch_sd = statistics.stdev([r[i] for i in idx])
        for i in idx:
            xs = members[groups[i]]
            K = len(xs)
            if K < 2:
                continue
            others_mean = (sum(xs) - r[i]) / (K - 1)
            centred = r[i] - statistics.mean(xs)
            if kind == "rloo":
                adv[i] = r[i] - others_mean
            elif kind == "drgrpo" or s["algo.adv_scale"] == "none":
                adv[i] = centred
            elif s["algo.adv_scale"] == "batch":
                adv[i] = centred / (batch_sd + eps)
            else:
                sd = statistics.stdev(xs)
                adv[i] = centred / (sd + eps) if sd > 0 else 0.0
    return adv


def ref_gae(tok_r, values, mask, gamma, lam):
    """Per row, backwards over the valid positions: delta = r + gamma V' - V, A = delta + gamma lam A'."""
    B, T = mask.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    ret = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        next_v, next_a = 0.0, 0.0
        for t in reversed([t for t in range(T) if mask[i, t] > 0]):
            delta = tok_r[i][t] + gamma * next_v - float(values[i, t])
            next_a = delta + gamma * lam * next_a
            next_v = float(values[i, t])
            adv[i, t] = next_a
            ret[i, t] = next_a + next_v
    toks = [float(adv[i, t]) for i in range(B) for t in range(T) if mask[i, t] > 0]
    mean, var = statistics.mean(toks), statistics.variance(toks)
    white = torch.where(mask > 0, (adv - mean) / math.sqrt(var + 1e-8), torch.zeros_like(adv))
    return white, ret


def _val(x) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def reference(data: FixedData, s: dict, *, valid: list[bool] | None = None, bonus: list[float] | None = None):
    """Gradients of the loss with respect to theta and v, and the loss terms, written out by hand.

    ``valid``: samples that train (default: all but probes and the rollout's own invalid ones); ``bonus``: T-GRPO's
    per-sample advantage bonus, added after normalisation."""
    rounds = data.rounds
    groups = [g for r in rounds for g in r.groups]
    if valid is None:
        valid = [
            (v if r.valid is not None else True) and not (r.probe is not None and r.probe[k])
            for r in rounds
            for k, v in enumerate(r.valid or [True] * r.n)
        ]
    n, T = len(groups), rounds[0].T
    mask = torch.cat([r.mask() for r in rounds]).double() * torch.tensor(valid, dtype=torch.float64)[:, None]
    theta = data.theta0.double().clone().requires_grad_(True)
    v = data.v0.double().clone().requires_grad_(True)
    theta0, beh, ref = data.theta0.double(), data.behaviour.double(), data.ref.double()
    rewards = ref_rewards(data, s)
    kl_coef, kind = s["algo.kl_coef"], s["algo.kl_estimator"]
    kl_in_reward = kl_coef > 0 and s["algo.kl_in_reward"]

    # old log-probs: the rollout engine's (old_logp=rollout), or the current ones (auto with one epoch/minibatch)
    old = beh if s["algo.old_logp"] == "rollout" else theta0
    # advantages
    if s["algo.advantage"] == "gae":
        tok_r = [[0.0] * T for _ in range(n)]
        for i in range(n):
            ts = [t for t in range(T) if mask[i, t] > 0]
            if ts:
                tok_r[i][ts[-1]] = rewards[i]
            if kl_in_reward:
                for t in ts:
                    tok_r[i][t] -= kl_coef * float(kl_value(old[i, t], ref[i, t], kind))
        adv_tok, returns = ref_gae(tok_r, data.v0.double(), mask, s["algo.gamma"], s["algo.lam"])
        adv = [[float(adv_tok[i, t]) for t in range(T)] for i in range(n)]
    else:
        if kl_in_reward:
            rewards = [
                rewards[i]
                - kl_coef * sum(float(kl_value(old[i, t], ref[i, t], kind)) for t in range(T) if mask[i, t] > 0)
                for i in range(n)
            ]
        a = ref_outcome_advantages(rewards, groups, valid, s)
        if bonus is not None:
            a = [ai + bi * vi for ai, bi, vi in zip(a, bonus, valid)]
        adv = [[a[i]] * T for i in range(n)]
    if s["algo.adv_clip"] is not None:
        c = s["algo.adv_clip"]
        adv = [[min(max(x, -c), c) for x in row] for row in adv]

    # aggregation weights
    lengths = [int(mask[i].sum()) for i in range(n)]
    n_tok, n_seq = sum(lengths), sum(1 for x in lengths if x > 0)
    agg = s["algo.loss_agg"]
    L_max = s["algo.loss_max_len"] or T

    def weight(i):
        if agg == "token_mean":
            return 1.0 / n_tok
        if agg == "seq_mean_token_mean":
            return 1.0 / (lengths[i] * n_seq)
        return 1.0 / (L_max * n_seq)  # seq_mean_token_sum_norm

    lo, hi, dual = 1 - s["algo.clip_low"], 1 + s["algo.clip_high"], s["algo.dual_clip"]
    pg = kl_term = ent_term = v_term = 0.0
    for i in range(n):
        ts = [t for t in range(T) if mask[i, t] > 0]
        if s["algo.policy_loss"] == "gspo":  # sequence ratio (a constant) times exp(theta - sg(theta))
            seq = math.exp(statistics.mean(float(theta0[i, t] - old[i, t]) for t in ts)) if ts else 1.0
        for t in ts:
            w = weight(i)
            A = adv[i][t]
            if s["algo.policy_loss"] == "gspo":
                ratio = seq * torch.exp(theta[i, t] - theta[i, t].detach())
            else:
                ratio = torch.exp(theta[i, t] - old[i, t])
            # pessimistic clipped surrogate, case by case: a clipped ratio is a constant (no gradient)
            if A >= 0:
                loss = -A * (ratio if _val(ratio) <= hi else hi)
            else:
                loss = -A * (ratio if _val(ratio) >= lo else lo)
                if dual is not None and _val(loss) > -A * dual:
                    loss = -A * dual
            if s["algo.truncated_is"]:  # pi_prox / pi_behaviour: capped (truncate) or the token dropped (mask)
                is_w = math.exp(float(old[i, t] - beh[i, t]))
                if s["algo.is_mode"] == "mask":
                    loss = loss * (is_w if is_w <= s["algo.is_cap"] else 0.0)
                else:
                    loss = loss * min(is_w, s["algo.is_cap"])
            pg = pg + w * loss
            if kl_coef > 0 and not kl_in_reward:
                kl_term = kl_term + w * kl_value(theta[i, t], ref[i, t], kind)
            ent_term = ent_term + w * (-torch.exp(theta[i, t]) * theta[i, t])
            if s["algo.advantage"] == "gae":
                err = (v[i, t] - returns[i, t]) ** 2  # first pass: v equals the rollout-time value, clip inactive
                v_term = v_term + w * 0.5 * err
    total = pg + kl_coef * kl_term - s["algo.entropy_coef"] * ent_term + s["algo.vf_coef"] * v_term
    total.backward()
    terms = {
        "loss/policy": _val(pg),
        "policy/entropy": _val(ent_term),
        "policy/adv_abs_mean": sum(abs(adv[i][t]) for i in range(n) for t in range(T) if mask[i, t] > 0) / n_tok,
    }
    if kl_coef > 0 and not kl_in_reward:
        terms["policy/kl"] = _val(kl_term)
    if s["algo.advantage"] == "gae":
        terms["loss/value"] = _val(v_term)
    zero = torch.zeros_like(theta)
    return (theta.grad if theta.grad is not None else zero), (v.grad if v.grad is not None else zero), terms


# ----------------------------------------------------------------------------------------------- the table
# (key, value, alternative, other settings of the row)
KNOBS = [
    ("algo.clip_low", 0.3, 0.2, {}),
    ("algo.clip_high", 0.28, 0.2, {}),
    ("algo.dual_clip", 3.0, None, {}),
    ("algo.dual_clip", 3.0, 4.5, {}),
    ("algo.policy_loss", "gspo", "ppo_clip", {}),
    ("algo.dual_clip", 3.0, None, {"algo.policy_loss": "gspo"}),
    ("algo.old_logp", "auto", "rollout", {}),
    ("algo.old_logp", "recompute", "rollout", {}),
    ("algo.loss_agg", "seq_mean_token_mean", "token_mean", {}),
    ("algo.loss_agg", "seq_mean_token_sum_norm", "seq_mean_token_mean", {}),
    ("algo.loss_max_len", 8, None, {"algo.loss_agg": "seq_mean_token_sum_norm"}),
    ("algo.kl_coef", 0.1, 0.0, {}),
    ("algo.kl_estimator", "k1", "k3", {"algo.kl_coef": 0.1}),
    ("algo.kl_estimator", "k2", "k3", {"algo.kl_coef": 0.1}),
    ("algo.kl_in_reward", True, False, {"algo.kl_coef": 0.1}),
    ("algo.kl_in_reward", True, False, {"algo.kl_coef": 0.1, "algo.kl_estimator": "k1"}),
    ("algo.entropy_coef", 0.05, 0.0, {}),
    ("algo.truncated_is", True, False, {"algo.old_logp": "auto"}),
    ("algo.is_cap", 1.5, 2.0, {"algo.old_logp": "auto", "algo.truncated_is": True}),
    ("algo.is_mode", "mask", "truncate", {"algo.old_logp": "auto", "algo.truncated_is": True}),
    ("algo.is_cap", 1.5, 2.0, {"algo.old_logp": "auto", "algo.truncated_is": True, "algo.is_mode": "mask"}),
    (
        "algo.is_mode",
        "mask",
        "truncate",
        {"algo.old_logp": "recompute", "algo.truncated_is": True, "algo.dual_clip": 3.0},
    ),
    ("algo.advantage", "drgrpo", "grpo", {}),
    ("algo.advantage", "rloo", "drgrpo", {}),
    ("algo.advantage", "reinforce_pp", "grpo", {}),
    ("algo.advantage", "gae", "grpo", {}),
    ("algo.adv_scale", "batch", "group", {}),
    ("algo.adv_scale", "none", "group", {}),
    ("algo.adv_eps", 0.5, 1e-6, {}),
    ("algo.adv_eps", 0.5, 1e-6, {"algo.advantage": "reinforce_pp"}),
    ("algo.adv_clip", 0.5, None, {}),
    ("algo.adv_clip", 0.5, None, {"algo.advantage": "gae"}),
    ("algo.reinforce_baseline", "group", "none", {"algo.advantage": "reinforce_pp"}),
    ("algo.gamma", 0.8, 1.0, {"algo.advantage": "gae"}),
    ("algo.lam", 0.5, 0.95, {"algo.advantage": "gae"}),
    ("algo.vf_coef", 1.5, 0.5, {"algo.advantage": "gae"}),
    ("algo.kl_in_reward", True, False, {"algo.kl_coef": 0.1, "algo.advantage": "gae"}),
]


def _ids(table):
    return [
        f"{k}={_fmt(v)}_vs_{_fmt(alt)}" + ("+" + ",".join(f"{a}={_fmt(b)}" for a, b in extra.items()) if extra else "")
        for k, v, alt, extra, *_ in table
    ]


def _check(data, settings, tmp_path, name, *, extra_overrides=(), ref_extra=None, **ref_kw):
    res = train_step(data, [*overrides_of(settings), *extra_overrides, f"trainer.run_name={name}"], tmp_path)
    assert_configured(res.trainer.cfg, settings)
    g_theta, g_v, terms = reference(data, {**settings, **(ref_extra or {})}, **ref_kw)
    torch.testing.assert_close(res.theta_grad.double(), g_theta, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(res.v_grad.double(), g_v, rtol=1e-4, atol=1e-7)
    for key, value in terms.items():
        assert res.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    return res


def _differs(a, b) -> bool:
    return float((a.theta_grad - b.theta_grad).abs().max() + (a.v_grad - b.v_grad).abs().max()) > 1e-4


@pytest.mark.parametrize("key, value, alt, extra", KNOBS, ids=_ids(KNOBS))
def test_knob_reaches_the_gradient(key, value, alt, extra, tmp_path):
    data = FixedData([MAIN])
    runs = []
    for k, val in enumerate((value, alt)):
        settings = {**ALGO_DEFAULTS, **extra, key: val}
        runs.append(_check(data, settings, tmp_path, f"r{k}"))
    assert _differs(*runs), f"{key}={value} and {key}={alt} gave the same gradient"


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_gradient_accumulation_gives_the_one_batch_gradient(agg, tmp_path):
    """``trainer.grad_accum`` splits the minibatch into micro-batches whose weights carry the whole minibatch's token /
    sequence counts: the accumulated gradient is the reference gradient of the one big batch."""
    data = FixedData([MAIN])
    for k in (2, 3):
        settings = {**ALGO_DEFAULTS, "algo.loss_agg": agg, "algo.entropy_coef": 0.05, "trainer.grad_accum": k}
        _check(data, settings, tmp_path, f"r{k}")


# ----------------------------------------------------------------------------------------------- hand-worked cases
def test_clip_higher_and_dual_clip_by_hand(tmp_path):
    """Two tokens worked out on paper. Sample 0 (reward 1.0 in group 0: 1.0, 0.5, 1.0, 0.0, mean 0.625, std 0.4787)
    has A = 0.375 / 0.4787 = 0.7833 and its first action has ratio 1.25. With token_mean over 20 tokens its loss is
    -A * ratio / 20 while the ratio is inside the band, so d loss / d theta = -A * 1.25 / 20 = -0.04896; with
    clip_high = 0.2 the ratio is clipped at 1.2 and the gradient is 0. Sample 3 (reward 0.0: A = -1.3056) has ratio
    5.0: without dual clip the gradient is -A * 5 / 20 = 0.3264; with dual_clip = 3 the loss is the constant -A * 3 / 20."""
    data = FixedData([MAIN])
    std0 = statistics.stdev([1.0, 0.5, 1.0, 0.0])
    a0, a3 = (1.0 - 0.625) / (std0 + 1e-6), (0.0 - 0.625) / (std0 + 1e-6)
    assert a0 == pytest.approx(0.7833, abs=1e-4) and a3 == pytest.approx(-1.3056, abs=1e-4)
    base = {**ALGO_DEFAULTS}
    higher = train_step(data, overrides_of({**base, "algo.clip_high": 0.28}), tmp_path)
    assert float(higher.theta_grad[0, 0]) == pytest.approx(-a0 * 1.25 / 20, rel=1e-5)
    symmetric = train_step(data, overrides_of({**base, "algo.clip_high": 0.2}), tmp_path)
    assert float(symmetric.theta_grad[0, 0]) == 0.0
    assert float(symmetric.theta_grad[3, 0]) == pytest.approx(-a3 * 5.0 / 20, rel=1e-5)
    dual = train_step(data, overrides_of({**base, "algo.dual_clip": 3.0}), tmp_path)
    assert float(dual.theta_grad[3, 0]) == 0.0
    assert float(dual.metrics["loss/policy"]) < float(symmetric.metrics["loss/policy"])  # the bound lowers the loss


# ----------------------------------------------------------------------------------------------- critic value clip
def test_value_clip_reaches_the_value_loss(tmp_path):
    """``algo.value_clip`` and ``algo.vf_coef`` in the critic loss, through ``Trainer._update``: old values that
    differ from the current ones (as in a later PPO epoch) and given returns; the policy advantage is 0, so only the
    value loss has a gradient: vf_coef * w * d/dv 0.5 max((v - R)^2, (v_old + clip(v - v_old, -c, c) - R)^2)."""
    data = FixedData([MAIN])
    shift = torch.tensor([0.5, -0.05, -0.4]).repeat(8, 1)  # v - v_old: outside, inside, outside a 0.2 band
    old_values = data.v0 - shift
    returns = data.v0 + torch.tensor([0.3, 0.2, -0.6]).repeat(8, 1)
    grads = {}
    for clip in (0.2, None, 0.45):
        settings = {**ALGO_DEFAULTS, "algo.advantage": "gae", "algo.value_clip": clip, "algo.vf_coef": 0.7}
        tr, policy = build(data, overrides_of(settings), tmp_path)
        seen = record_grads(tr, policy)
        ro, _ = tr.collect()
        ro.values = old_values.clone()
        mask = ro.mask * ro.valid[:, None].float()
        stats = tr._update(ro, mask, torch.zeros_like(mask), returns.clone(), None, anchor="current")
        assert len(seen) == 1
        # by hand
        v = data.v0.double().clone().requires_grad_(True)
        n_tok = float(mask.sum())
        total = 0.0
        for i in range(8):
            for t in range(3):
                if mask[i, t] == 0:
                    continue
                R, v_old = float(returns[i, t]), float(old_values[i, t])
                err = (v[i, t] - R) ** 2
                if clip is not None:
                    d = _val(v[i, t]) - v_old
                    v_clipped = v_old + d if abs(d) <= clip else v_old + math.copysign(clip, d)  # constant if clipped
                    err_c = (v_clipped - R) ** 2 if abs(d) <= clip else torch.tensor((v_clipped - R) ** 2)
                    if _val(err_c) > _val(err):
                        err = err_c
                total = total + 0.5 * err / n_tok
        (0.7 * total).backward()
        torch.testing.assert_close(seen[0][1].double(), v.grad, rtol=1e-4, atol=1e-7)
        assert stats["loss/value"] == pytest.approx(_val(total), rel=1e-5)
        assert float(seen[0][0].abs().max()) == 0.0  # zero advantage: no policy gradient
        grads[clip] = seen[0][1]
    assert not torch.allclose(grads[0.2], grads[None]) and not torch.allclose(grads[0.2], grads[0.45])


# ----------------------------------------------------------------------------------------------- group filtering
# Round 1: group 0 all-equal (r = 1.0 each), group 1 varied. Round 2 (drawn only by resampling): group 2 varied,
# group 3 all-equal. With filter_groups the all-equal groups leave the batch (and the token_mean normaliser).
FILTER_R1 = Round(
    a=[1.0, 1.0, 1.0, 1.0, 0.2, 0.9, 0.9, 0.4],
    f=[0.0] * 4 + [1.0, 0.0, 1.0, 1.0],
    b=[0.0] * 8,
    groups=[0, 0, 0, 0, 1, 1, 1, 1],
    lengths=[3, 2, 3, 1, 3, 3, 2, 3],
    log_ratio=MAIN.log_ratio,
)
FILTER_R2 = Round(
    a=[0.0, 1.0, 0.0, 0.5, 0.3, 0.3, 0.3, 0.3],
    f=[0.0] * 8,
    b=[0.0] * 8,
    groups=[2, 2, 2, 2, 3, 3, 3, 3],
    lengths=[1, 2, 3, 3, 2, 2, 3, 1],
    log_ratio=list(reversed(MAIN.log_ratio)),
)
FILTER_KNOBS = [
    # key, value, alternative, other settings, rows kept at (value, alternative)
    ("algo.filter_groups", True, False, {"algo.max_resample": 0}, (range(4, 8), range(0, 8))),
    ("algo.max_resample", 1, 0, {"algo.filter_groups": True}, (range(4, 12), range(4, 8))),
]


@pytest.mark.parametrize("key, value, alt, extra, kept", FILTER_KNOBS, ids=_ids(FILTER_KNOBS))
def test_group_filter_knob_reaches_the_gradient(key, value, alt, extra, kept, tmp_path):
    data = FixedData([FILTER_R1, FILTER_R2])
    runs = []
    for k, (val, rows) in enumerate(zip((value, alt), kept)):
        settings = {**ALGO_DEFAULTS, **extra, key: val}
        valid = [i in rows for i in range(16)]
        res = _check(data, settings, tmp_path, f"r{k}", valid=valid)
        assert res.metrics["update/samples"] == len(rows)
        runs.append(res)
    assert _differs(*runs)


# ----------------------------------------------------------------------------------------------- T-GRPO
# 8 ordered samples and 4 shuffled-frame probes (valid=False). accuracy: group 0 ordered 1.0, 0.0, 0.4, 0.0
# (p = 0.35), probes 1.0, 0.0 (p~ = 0.5); group 1 ordered 1.0, 1.0, 0.0, 1.0 (p = 0.75), probes 1.0, 1.0 (p~ = 1.0).
TGRPO_ROUND = Round(
    a=[1.0, 0.0, 0.4, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0],
    f=[1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0],
    b=[0.0] * 12,
    groups=[0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1],
    lengths=[3, 2, 3, 1, 3, 3, 2, 3, 3, 3, 3, 3],
    log_ratio=MAIN.log_ratio + [ratios(1.0, 1.0, 1.0)] * 4,
    probe=[False] * 8 + [True] * 4,
    valid=[True] * 8 + [False] * 4,
)
TGRPO_DEFAULTS = {
    "algo.tgrpo.shuffled_group": 2,
    "algo.tgrpo.alpha": 0.3,
    "algo.tgrpo.mu": 0.6,
    "algo.tgrpo.threshold": 0.1,
    "algo.tgrpo.correct_reward": "accuracy",
}
TGRPO_KNOBS = [
    ("algo.tgrpo.shuffled_group", 2, 0, {}),
    ("algo.tgrpo.alpha", 0.6, 0.3, {}),
    ("algo.tgrpo.mu", 0.8, 0.6, {}),
    ("algo.tgrpo.threshold", 0.5, 0.1, {}),
    ("algo.tgrpo.correct_reward", "fmt", "accuracy", {}),
]


def ref_tgrpo_bonus(round_: Round, t: dict) -> list[float]:
    """alpha for ordered samples with c > threshold in groups whose ordered mean >= mu * shuffled mean."""
    if t["algo.tgrpo.shuffled_group"] == 0:
        return [0.0] * round_.n
    c = round_.a if t["algo.tgrpo.correct_reward"] == "accuracy" else round_.f
    out = []
    for i in range(round_.n):
        g = round_.groups[i]
        ordered = [c[j] for j in range(round_.n) if round_.groups[j] == g and not round_.probe[j]]
        shuffled = [c[j] for j in range(round_.n) if round_.groups[j] == g and round_.probe[j]]
        granted = statistics.mean(ordered) >= t["algo.tgrpo.mu"] * statistics.mean(shuffled)
        correct = c[i] > t["algo.tgrpo.threshold"]
        out.append(t["algo.tgrpo.alpha"] if granted and correct and not round_.probe[i] else 0.0)
    return out


@pytest.mark.parametrize("key, value, alt, extra", TGRPO_KNOBS, ids=_ids(TGRPO_KNOBS))
def test_tgrpo_knob_reaches_the_gradient(key, value, alt, extra, tmp_path):
    data = FixedData([TGRPO_ROUND])
    runs = []
    for k, val in enumerate((value, alt)):
        t = {**TGRPO_DEFAULTS, **extra, key: val}
        bonus = ref_tgrpo_bonus(TGRPO_ROUND, t)
        settings = {**ALGO_DEFAULTS, "algo.advantage": "drgrpo"}
        res = _check(data, settings, tmp_path, f"r{k}", extra_overrides=overrides_of(t), bonus=bonus)
        if t["algo.tgrpo.shuffled_group"]:  # the logged T-GRPO statistics, by hand
            for name, value in ref_tgrpo_metrics(TGRPO_ROUND, t, bonus).items():
                assert res.metrics[name] == pytest.approx(value), name
        runs.append(res)
    assert _differs(*runs)


def ref_tgrpo_metrics(round_: Round, t: dict, bonus: list[float]) -> dict:
    c = round_.a if t["algo.tgrpo.correct_reward"] == "accuracy" else round_.f
    p_ord, p_shuf, granted = [], [], 0
    for g in sorted(set(round_.groups)):
        o = statistics.mean(c[j] for j in range(round_.n) if round_.groups[j] == g and not round_.probe[j])
        s = statistics.mean(c[j] for j in range(round_.n) if round_.groups[j] == g and round_.probe[j])
        p_ord.append(o)
        p_shuf.append(s)
        granted += o >= t["algo.tgrpo.mu"] * s
    n_ordered = sum(not p for p in round_.probe)
    return {
        "tgrpo/compared_groups": 2.0,
        "tgrpo/p_ordered": statistics.mean(p_ord),
        "tgrpo/p_shuffled": statistics.mean(p_shuf),
        "tgrpo/granted_frac": granted / 2,
        "tgrpo/bonus_frac": sum(b > 0 for b in bonus) / n_ordered,
    }


# ----------------------------------------------------------------------------------------------- user rewards
USER_REWARD = """
def bonus(prompts, completions, **kwargs):
    texts = [c["text"] if isinstance(c, dict) else c for c in completions]
    return [float(t.split("=")[1]) for t in texts]
"""
REWARD_KNOBS = [
    ("reward.fns", ["USER"], [], {}),
    ("reward.weights", [3.0], [1.0], {"reward.fns": ["USER"]}),
    ("reward.mode", "replace", "add", {"reward.fns": ["USER"], "reward.weights": [2.0]}),
]


@pytest.mark.parametrize("key, value, alt, extra", REWARD_KNOBS, ids=_ids(REWARD_KNOBS))
def test_reward_knob_reaches_the_gradient(key, value, alt, extra, tmp_path):
    path = tmp_path / "user_rewards.py"
    path.write_text(USER_REWARD)
    data = FixedData([MAIN])
    settings = {**ALGO_DEFAULTS, "algo.advantage": "drgrpo"}  # no std division: reward scales show
    runs = []
    for k, val in enumerate((value, alt)):
        r = {**extra, key: val}
        if "reward.fns" in r:
            r["reward.fns"] = [f"{path}:bonus" if x == "USER" else x for x in r["reward.fns"]]
        ov = [f"{k2}=[{','.join(repr(x) for x in v)}]" if isinstance(v, list) else f"{k2}={v}" for k2, v in r.items()]
        runs.append(_check(data, settings, tmp_path, f"r{k}", extra_overrides=ov, ref_extra=r))
    assert _differs(*runs)
