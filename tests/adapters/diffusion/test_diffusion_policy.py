"""Diffusion policy on real (tiny, offline) diffusers pipelines: exact on-policy ratios, seeds, noise
sharing, LoRA reference, latent KL, train-step plans, bad samples, prompts, checkpoints, a trainer step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from mmrl.adapters.diffusion import (  # noqa: E402
    DiffusionPayload,
    DiffusionPolicy,
    DiffusionPromptError,
    ParamEMA,
    train_step_plan,
)
from mmrl.adapters.diffusion.config import DiffusionConfig  # noqa: E402
from mmrl.config import ConfigError  # noqa: E402
from mmrl.policies.base import PromptBatch, Rollout  # noqa: E402

PRESETS = {"sd3": ("tiny_sd3", "flow_sde"), "flux": ("tiny_flux", "flow_sde"), "sd": ("tiny_sd_unet", "ddim")}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MMRL_CACHE", str(tmp_path_factory.mktemp("mmrl_cache")))
    yield
    mp.undo()


def make_policy(kind="sd3", **kw) -> DiffusionPolicy:
    from mmrl.adapters.diffusion.tiny_model import load_diffusion_pipeline

    path, sampler = PRESETS[kind]
    base = dict(path=path, pipeline=kind, sampler=sampler, num_steps=4, eval_num_steps=3, max_sequence_length=8)
    base.update(kw)
    kl_coef = base.pop("kl_coef", 0.0)
    cfg = DiffusionConfig(**base)
    cfg.validate()
    torch.manual_seed(0)
    return DiffusionPolicy(
        load_diffusion_pipeline(path, expected_kind=kind), cfg, kl_coef=kl_coef, reference=kl_coef > 0
    )


def batch(prompts=("a red circle on a blue background", "a green square"), seeds=(11, 22)) -> PromptBatch:
    return PromptBatch(items=[{"prompt": p} for p in prompts], indices=list(range(len(prompts))), seeds=list(seeds))


def perturb_lora(policy, scale=0.5):
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for n, p in policy.module.named_parameters():
            if "lora_B" in n:
                p.add_(scale * torch.randn(p.shape, generator=g))


# ---------------------------------------------------------------- on-policy ratio


@pytest.mark.parametrize("kind", ["sd3", "flux", "sd"])
def test_first_ratio_is_exactly_one(cache, kind):
    pol = make_policy(kind, guidance_scale=2.0)  # with CFG
    ro = pol.rollout(batch(), 3)
    T = pol.cfg.num_steps
    assert ro.rollout_logp.shape == ro.mask.shape == (6, T)
    out = pol.log_probs(ro)
    m = ro.mask > 0
    assert float((out.logp.detach().cpu() - ro.rollout_logp).abs()[m].max()) < 1e-5
    assert pol.first_logp_gap is not None and pol.first_logp_gap < 1e-5
    assert torch.all(out.logp.detach().cpu()[~m] == 0)
    if kind == "sd":  # DDIM with set_alpha_to_one=False: every step is stochastic (DDPO trains all)
        assert ro.mask.sum(1).tolist() == [T] * 6
    else:  # flow: the deterministic last step is never trained
        assert ro.mask[:, -1].sum() == 0 and ro.mask[:, :-1].sum() == 6 * (T - 1)
        assert torch.all(ro.rollout_logp[:, -1] == 0)
    assert ro.samples[0]["image"].size == (32, 32) and ro.samples[0]["prompt"].startswith("a red")


def test_flat_layout_matches_per_step(cache):
    pol = make_policy("sd3", logprob_layout="flat", logprob_chunk=5)
    ro = pol.rollout(batch(), 2)
    out = pol.log_probs(ro)
    assert float((out.logp.detach().cpu() - ro.rollout_logp).abs()[ro.mask > 0].max()) < 1e-5


def test_chunked_rollout_matches_micro_batches(cache):
    # rollout in forwards of 2 samples; training micro-batches of the same 2 samples: same shapes, same numbers
    pol = make_policy("sd3", sample_batch_size=2)
    ro = pol.rollout(batch(), 2)
    for rows in ([0, 1], [2, 3]):
        out = pol.log_probs(ro.index(torch.tensor(rows)))
        assert torch.allclose(out.logp.detach().cpu(), ro.rollout_logp[rows], atol=1e-5)


def test_sub_batch_log_probs_and_gradient(cache):
    pol = make_policy("sd3")
    ro = pol.rollout(batch(), 2)
    sub = ro.index(torch.tensor([3, 1]))  # samples of both prompts, reordered
    out = pol.log_probs(sub)
    assert torch.allclose(out.logp.detach().cpu(), ro.rollout_logp[[3, 1]], atol=1e-5)
    perturb_lora(pol)  # B != 0, so A gets gradients too
    out = pol.log_probs(sub)
    out.logp.sum().backward()
    grads = [p.grad for p in pol.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    with pytest.raises(Exception, match="no critic"):
        pol.log_probs(sub, values=True)


# ---------------------------------------------------------------- seeds and noise


def test_same_seeds_same_images_and_layout_independence(cache):
    pol = make_policy("sd3")
    a = pol.rollout(batch(), 2)
    b = pol.rollout(batch(), 2)
    for sa, sb in zip(a.samples, b.samples):
        assert np.array_equal(np.asarray(sa["image"]), np.asarray(sb["image"]))
    assert torch.equal(a.payload.latents, b.payload.latents)
    c = pol.rollout(batch(seeds=(11, 23)), 2)
    assert torch.equal(c.payload.latents[:2], a.payload.latents[:2])  # prompt 0 unchanged
    assert not torch.allclose(c.payload.latents[2:], a.payload.latents[2:])
    # the second prompt alone (another batch layout) draws the same noise and nearly the same chain
    alone = pol.rollout(batch(prompts=("a green square",), seeds=(22,)), 2)
    assert torch.equal(alone.payload.latents[:, 0], a.payload.latents[2:, 0])
    assert torch.allclose(alone.payload.latents, a.payload.latents[2:], atol=1e-5)


def test_same_noise_per_group(cache):
    pol = make_policy("sd3", same_noise_per_group=True)
    ro = pol.rollout(batch(), 3)
    x0 = ro.payload.latents[:, 0]
    assert torch.equal(x0[0], x0[1]) and torch.equal(x0[0], x0[2])
    assert not torch.equal(x0[0], x0[3])
    xT = ro.payload.latents[:, -1]  # the SDE noise still differs within the group
    assert not torch.allclose(xT[0], xT[1])
    # and the shared noise is the prompt seed's draw, whatever the group size
    ro1 = pol.rollout(batch(), 1)
    assert torch.equal(ro1.payload.latents[0, 0], x0[0])
    other = make_policy("sd3")  # default: per-sample initial noise
    x0b = other.rollout(batch(), 3).payload.latents[:, 0]
    assert not torch.equal(x0b[0], x0b[1])


# ---------------------------------------------------------------- reference and KL


def test_lora_reference_equals_pre_training_log_probs(cache):
    pol = make_policy("sd3", kl_coef=0.1)
    ro = pol.rollout(batch(), 2)
    with torch.no_grad():
        pre = pol.log_probs(ro).logp.clone()
    perturb_lora(pol)
    with torch.no_grad():
        changed = pol.log_probs(ro).logp
        with pol.reference():
            ref = pol.log_probs(ro).logp
    assert (changed - pre).abs().max() > 1e-4
    assert torch.allclose(ref, pre, atol=1e-6)
    # the adapters are back on after the context
    with torch.no_grad():
        assert torch.allclose(pol.log_probs(ro).logp, changed, atol=1e-6)


def test_latent_kl_against_hand_formula(cache):
    pol = make_policy("sd3", kl_coef=0.1)
    ro = pol.rollout(batch(), 2)
    out0 = pol.log_probs(ro)  # grad on + latent KL configured -> returned automatically
    assert out0.kl is not None and float(out0.kl.abs().max()) == 0.0  # LoRA B = 0 at init
    perturb_lora(pol)
    out = pol.log_probs(ro, kl=True)
    # independent: step 1 of sample 0, means with adapters on and off
    pl, i = ro.payload, 1
    x, cond = pl.latents[:1, i], {k: v[:1] for k, v in pl.cond.items()}
    t = pol.sampler.timesteps[i].expand(1)
    with torch.no_grad():
        v_on = pol._predict(pol.module, x, t, cond)
        pol.module.disable_adapters()
        v_off = pol._predict(pol.module, x, t, cond)
        pol.module.enable_adapters()
    s_on = pol.sampler.step(v_on, i, x, prev_sample=pl.latents[:1, i + 1])
    s_off = pol.sampler.step(v_off, i, x, prev_sample=pl.latents[:1, i + 1])
    expected = ((s_on.mean - s_off.mean) ** 2).mean() / (2 * s_on.std**2)
    assert float(out.kl[0, i]) == pytest.approx(float(expected), rel=1e-4)
    assert float(out.kl[0, -1]) == 0.0  # untrained last step
    with torch.no_grad():  # no-grad passes (old / reference log-probs) skip the extra forward
        assert pol.log_probs(ro).kl is None


# ---------------------------------------------------------------- train-step plans (pure)


def test_train_step_plans():
    stoch = [True] * 9 + [False]  # 10 steps, last deterministic
    sde, train = train_step_plan("all_but_last", stoch, [1, 2])
    assert sde.all() and train[:, :9].all() and not train[:, 9].any()
    sde, train = train_step_plan("random_fraction", stoch, [1, 2, 1], fraction=0.6)
    assert train.sum(1).tolist() == [5, 5, 5]  # round(0.6 * 9) = 5 per group
    assert torch.equal(train[0], train[2]) and not train[:, 9].any()  # drawn from the group seed only
    sde, train = train_step_plan("sde_window", stoch, list(range(20)), window_size=2, window_max_start=3)
    assert torch.equal(sde, train) and train.sum(1).tolist() == [2] * 20
    starts = train.float().argmax(1)
    assert starts.max() <= 3 and len(set(starts.tolist())) > 1
    assert all(train[g, s + 1] for g, s in enumerate(starts.tolist()))  # contiguous
    for step, start in [(0, 0), (24, 0), (25, 1), (50, 2), (25 * 8, 0)]:  # 8 possible starts, wraps
        _, train = train_step_plan("sliding_window", stoch, [5], window_size=2, train_step=step, shift_every=25)
        assert torch.nonzero(train[0]).flatten().tolist() == [start, start + 1], step
    with pytest.raises(Exception, match="unknown"):
        train_step_plan("bogus", stoch, [1])


def test_sde_window_rollout_uses_ode_outside(cache):
    pol = make_policy("sd3", num_steps=6, train_steps="sde_window", window_size=2, window_max_start=2)
    ro = pol.rollout(batch(), 2)
    assert ro.mask.sum(1).tolist() == [2.0] * 4
    assert torch.all(ro.rollout_logp[ro.mask == 0] == 0) and torch.all(ro.rollout_logp[ro.mask > 0] != 0)
    out = pol.log_probs(ro)
    assert torch.allclose(out.logp.detach().cpu(), ro.rollout_logp, atol=1e-5)


# ---------------------------------------------------------------- bad samples and prompts


def test_nonfinite_latents_mark_sample_invalid(cache):
    pol = make_policy("sd3")
    fwd = pol.backend.forward

    def poisoned(model, x, t, cond):
        out = fwd(model, x, t, cond)
        out = out.clone()
        out[1] = float("nan")
        return out

    pol.backend.forward = poisoned
    ro = pol.rollout(batch(), 2)
    pol.backend.forward = fwd
    assert ro.valid.tolist() == [True, False, True, True]
    assert ro.metrics["count/nonfinite_latents"] == 1.0
    assert ro.mask[1].sum() == 0 and torch.isfinite(ro.rollout_logp).all()
    assert torch.isfinite(ro.payload.latents).all() and ro.samples[1]["valid"] is False
    assert torch.isfinite(pol.log_probs(ro).logp).all()
    merged = Rollout.concat([ro, ro])
    assert merged.metrics["count/nonfinite_latents"] == 2.0


def test_empty_and_long_prompts(cache):
    pol = make_policy("sd3")
    with pytest.raises(DiffusionPromptError, match="prompt 1 is empty"):
        pol.rollout(batch(prompts=("a red circle", "  ")), 1)
    with pytest.raises(DiffusionPromptError):
        pol.rollout(PromptBatch(items=[{"prompt": None}], indices=[0], seeds=[0]), 1)
    long = " ".join(["red circle"] * 30)  # far over the tiny CLIP's 16 tokens: truncated, counted
    ro = pol.rollout(batch(prompts=(long, "a green square")), 1)
    assert ro.metrics["count/truncated_prompts"] == 1.0 and ro.valid.all()


# ---------------------------------------------------------------- greedy, payload, EMA, checkpoints


def test_greedy_rollout_is_deterministic_and_untrained(cache):
    pol = make_policy("sd3")
    a, b = pol.rollout(batch(), 1, greedy=True), pol.rollout(batch(), 1, greedy=True)
    assert a.mask.shape == (2, 3) and a.mask.sum() == 0 and torch.all(a.rollout_logp == 0)
    assert torch.equal(a.payload.latents, b.payload.latents)


def test_payload_index_and_concat(cache):
    pol = make_policy("sd3")
    ro = pol.rollout(batch(), 2)
    sub = ro.index(torch.tensor([2, 3]))  # only prompt 1 -> one conditioning row
    assert sub.payload.prompt_of.tolist() == [0, 0]
    assert next(iter(sub.payload.cond.values())).shape[0] == 1
    both = Rollout.concat([ro.index(torch.tensor([0])), sub])
    assert both.payload.prompt_of.tolist() == [0, 1, 1]
    assert torch.equal(both.payload.latents, ro.payload.latents[[0, 2, 3]])
    out = pol.log_probs(both)
    assert torch.allclose(out.logp.detach().cpu(), ro.rollout_logp[[0, 2, 3]], atol=1e-5)
    bad = dataclasses.replace(sub.payload, num_steps=7)
    with pytest.raises(Exception, match="cannot concatenate"):
        DiffusionPayload.concat_samples([sub.payload, bad])


def test_param_ema_by_hand():
    p = torch.nn.Parameter(torch.tensor([2.0, 4.0]))
    ema = ParamEMA([p], decay=0.5)
    with torch.no_grad():
        p.copy_(torch.tensor([4.0, 0.0]))
    ema.update()  # 0.5 * [2, 4] + 0.5 * [4, 0] = [3, 2]
    assert ema.shadow[0].tolist() == [3.0, 2.0]
    with ema.swapped_in():
        assert p.tolist() == [3.0, 2.0]
    assert p.tolist() == [4.0, 0.0]


def test_save_and_load_lora_round_trip(cache, tmp_path):
    pol = make_policy("sd3", ema=True)
    assert pol.keeps_ema  # Policy.keeps_ema: data parallel refuses to shard it (tests/trainer/test_fsdp.py)
    perturb_lora(pol)
    ro = pol.rollout(batch(), 1)
    pol.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "adapter_model.safetensors").exists()
    with torch.no_grad():
        before = pol.log_probs(ro).logp.clone()
    perturb_lora(pol)
    pol.load_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        assert torch.equal(pol.log_probs(ro).logp, before)


def test_config_validation():
    with pytest.raises(ConfigError, match="ddim"):
        DiffusionConfig(pipeline="sd3", sampler="ddim").validate()
    with pytest.raises(ConfigError, match="train_steps"):
        DiffusionConfig(train_steps="everything").validate()
    with pytest.raises(ConfigError, match="train_fraction"):
        DiffusionConfig(train_fraction=0.0).validate()


# ---------------------------------------------------------------- a trainer step


def test_trainer_step_changes_lora_params(cache, tmp_path):
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    cfg = load_config(
        [
            "task=t2i_color",
            "task.pretrain_steps=0",
            "task.pretrain_vae_steps=0",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=t",
            "trainer.max_steps=1",
            "trainer.batch_size=2",
            "trainer.eval.at_end=false",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
            "algo.group_size=2",
            "model.num_steps=3",
            "algo.kl_coef=0.01",
            "trainer.optim.lr=0.01",
        ]
    )
    tr = Trainer(cfg)
    before = [p.detach().clone() for p in tr.policy.trainable_parameters()]
    metrics = tr.train_step()
    after = tr.policy.trainable_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    assert np.isfinite(metrics["loss/policy"]) and np.isfinite(metrics["policy/kl"])
    assert metrics["rollout/logp_abs_diff"] < 1e-5 and "reward/color" in metrics
    assert "monitor/group_diversity" in metrics
