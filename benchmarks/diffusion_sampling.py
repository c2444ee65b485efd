"""Diffusion adapter overhead on the tiny pipelines: sampling and one RL training step vs bare diffusers/torch.

    python benchmarks/diffusion_sampling.py [--model tiny_sd3|tiny_flux|tiny_sd_unet] [--reps 20] [--quick]

Two ratios, each from interleaved runs (the machines are noisy), medians after a warm-up, one torch thread:

1. **sampling**: the plain diffusers pipeline call ``pipe(prompt=..., num_images_per_prompt=G,
   latents=x0, num_inference_steps=N, output_type="pil")`` (prompt encoding, N denoiser calls, its own
   Euler/DDIM scheduler, VAE decode, PIL) vs mmrl's ``DiffusionPolicy.rollout`` for the same prompts,
   the same initial noise ``x0`` and the same N (encoding, N denoiser calls, SDE steps with per-step
   log-probs, decode, PIL). Target <= 1.1.
2. **training step**: ``Trainer.train_step()`` (rollout, colour reward, advantages, ``log_probs`` over
   the trained steps, loss, backward, clip, AdamW, metrics) vs the bare compute any such step needs:
   the diffusers call above (keeping the intermediate latents through ``callback_on_step_end``), one
   denoiser forward per trained step over the batch + backward + AdamW. Target <= 1.15.

Before timing, the script checks that the two samplers compute the same thing: mmrl's deterministic
(greedy, ODE/DDIM-eta-0) sampling with N steps from ``x0`` must land on diffusers' final latent.
The tiny model is used untrained (``task.pretrain_steps=0``): timings do not depend on the weights.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any, Callable

import torch

#: Models this benchmark knows (the tiny offline presets).
MODELS = ("tiny_sd3", "tiny_flux", "tiny_sd_unet")


def build_trainer(model: str, prompts_per_step: int, group: int):
    """A t2i_color trainer on an untrained tiny pipeline (no pre-training, no eval, no plots)."""
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    out = tempfile.mkdtemp(prefix="bench-diffusion-")
    cfg = load_config(
        [
            "task=t2i_color",
            f"model={model}",
            "task.pretrain_steps=0",
            "task.pretrain_vae_steps=0",
            f"trainer.output_dir={out}",
            "trainer.run_name=b",
            f"trainer.batch_size={prompts_per_step}",
            f"algo.group_size={group}",
            "trainer.logging.progress=false",
            "trainer.eval.at_end=false",
            "trainer.eval.every=0",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
        ]
    )
    tr = Trainer(cfg)
    tr.setup_run_dir()
    return tr


def prompt_batch(items: list[dict], start: int, count: int, seed: int):
    """``count`` task items from ``start`` (wrapping) as a PromptBatch with fixed seeds."""
    from mmrl.policies.base import PromptBatch
    from mmrl.rollout.noise import mix_seed

    idx = [(start + k) % len(items) for k in range(count)]
    return PromptBatch(
        items=[items[i] for i in idx], indices=idx, seeds=[mix_seed(seed, start, k) for k in range(count)]
    )


def initial_noise(policy, batch, group: int) -> torch.Tensor:
    """The initial latents the policy draws for ``batch`` (sample j of seed s: ``mix_seed(s, j)``)."""
    from mmrl.rollout.noise import mix_seed

    if policy.cfg.same_noise_per_group:
        seeds = [s for s in batch.seeds for _ in range(group)]
    else:
        seeds = [mix_seed(s, j) for s in batch.seeds for j in range(group)]
    return torch.stack([policy.backend.initial_noise(s) for s in seeds])


def diffusers_call(
    policy,
    prompts: list[str],
    group: int,
    x0: torch.Tensor,
    num_steps: int,
    *,
    output_type: str = "pil",
    prompt_embeds: dict[str, torch.Tensor] | None = None,
    callback: Callable | None = None,
) -> Any:
    """The plain pipeline call: ``prompts`` (or pre-encoded, already expanded embeds) x ``group`` from ``x0``."""
    pipe = policy.pipe
    be = policy.backend
    kw: dict[str, Any] = {
        "latents": x0,
        "num_inference_steps": num_steps,
        "output_type": output_type,
        "height": be.height,
        "width": be.width,
    }
    if prompt_embeds is None:
        kw.update(prompt=prompts, num_images_per_prompt=group)
    else:
        kw["prompt_embeds"] = prompt_embeds["prompt_embeds"]
        if "pooled" in prompt_embeds:
            kw["pooled_prompt_embeds"] = prompt_embeds["pooled"]
    if policy.kind in ("sd3", "flux"):
        kw["max_sequence_length"] = policy.cfg.max_sequence_length
    if policy.kind in ("sd3", "sd"):
        kw["guidance_scale"] = 1.0  # no classifier-free guidance, as the policy's default
    if policy.kind == "sd":
        kw["eta"] = 0.0
    if callback is not None:
        kw["callback_on_step_end"] = callback
    return pipe(**kw)


def check_same_computation(policy, batch, group: int, num_steps: int) -> float:
    """Max |diffusers final latent - mmrl greedy final latent| for the same prompts, noise and steps."""
    x0 = initial_noise(policy, batch, group)
    ref = diffusers_call(policy, [it["prompt"] for it in batch.items], group, x0, num_steps, output_type="latent")
    ref_lat = ref.images if hasattr(ref, "images") else ref[0]
    saved = policy.cfg.eval_num_steps
    policy.cfg.eval_num_steps = num_steps
    try:
        with torch.no_grad():
            ro = policy.rollout(batch, group, greedy=True)
    finally:
        policy.cfg.eval_num_steps = saved
    ours = ro.payload.latents[:, -1]
    return float((ours.float() - ref_lat.float().reshape(ours.shape)).abs().max())


def bare_train_step(policy, optimizer, batch, group: int, num_steps: int, trained: list[int]) -> float:
    """Encode + diffusers sampling (keeping the chain) + one forward per trained step + backward + AdamW."""
    t0 = time.perf_counter()
    prompts = [it["prompt"] for it in batch.items]
    with torch.no_grad():
        cond_p = policy.backend.encode(prompts, policy.device)
    cond = {k: v.repeat_interleave(group, 0) for k, v in cond_p.items()}
    x0 = initial_noise(policy, batch, group)
    chain = [x0]

    def keep(pipe, i, t, kwargs):
        chain.append(kwargs["latents"])
        return kwargs

    diffusers_call(policy, prompts, group, x0, num_steps, prompt_embeds=cond, callback=keep)
    timesteps = policy.pipe.scheduler.timesteps
    optimizer.zero_grad(set_to_none=True)
    for i in trained:
        t = timesteps[i].expand(x0.shape[0])
        v = policy.backend.forward(policy.model, chain[i], t, cond).float()
        (v.square().mean() / len(trained)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def interleaved_medians(fns: dict[str, Callable[[int], float]], reps: int, warmup: int) -> dict[str, float]:
    """Run each ``fn(rep) -> seconds`` once per rep, alternating the order; medians after ``warmup`` reps."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(warmup + reps):
        order = names if rep % 2 == 0 else names[::-1]
        for n in order:
            dt = fns[n](rep)
            if rep >= warmup:
                times[n].append(dt)
    return {n: statistics.median(v) for n, v in times.items()}


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny_sd3", choices=MODELS)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step (t2i_color default: 4)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (t2i_color default: 8)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="5 reps, 1 warm-up")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.warmup = 5, 1
    torch.set_num_threads(1)
    tr = build_trainer(args.model, args.prompts, args.group)
    policy = tr.policy
    G = args.group
    N = policy.cfg.num_steps
    items = tr.train_items

    gap = check_same_computation(policy, prompt_batch(items, 0, args.prompts, 7), G, N)

    # 1. sampling -----------------------------------------------------------------------------
    def run_diffusers(rep: int) -> float:
        b = prompt_batch(items, rep * args.prompts, args.prompts, 11)
        x0 = initial_noise(policy, b, G)  # outside the timed region: diffusers gets it as input
        return timed(lambda: diffusers_call(policy, [it["prompt"] for it in b.items], G, x0, N))

    def run_mmrl(rep: int) -> float:
        b = prompt_batch(items, rep * args.prompts, args.prompts, 11)
        return timed(lambda: policy.rollout(b, G))

    sample = interleaved_medians({"diffusers": run_diffusers, "mmrl": run_mmrl}, args.reps, args.warmup)

    # 2. training step ------------------------------------------------------------------------
    trained = (
        [i for i in range(N) if policy.sampler.is_trainable(i)] if policy.cfg.train_steps == "all_but_last" else None
    )
    if trained is None:
        raise SystemExit("the bare step mirrors model.train_steps=all_but_last only")
    bare_opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-8)

    def run_trainer(rep: int) -> float:
        t0 = time.perf_counter()
        m = tr.train_step()
        tr.step += 1
        tr.tracker.log(m, tr.step)
        return time.perf_counter() - t0

    def run_bare(rep: int) -> float:
        b = prompt_batch(items, rep * args.prompts, args.prompts, 13)
        return bare_train_step(policy, bare_opt, b, G, N, trained)

    train = interleaved_medians({"trainer": run_trainer, "bare": run_bare}, args.reps, args.warmup)
    tr.tracker.close()

    res = {
        "sample_diffusers_s": sample["diffusers"],
        "sample_mmrl_s": sample["mmrl"],
        "sample_ratio": sample["mmrl"] / sample["diffusers"],
        "train_trainer_s": train["trainer"],
        "train_bare_s": train["bare"],
        "train_ratio": train["trainer"] / train["bare"],
        "latent_gap": gap,
    }
    print(
        f"{args.model}: {args.prompts} prompts x G={G}, {N} steps, {len(trained)} trained, 1 thread, "
        f"{args.reps} reps (medians)"
    )
    print(f"  same computation: max |mmrl deterministic sampling - diffusers| final latent = {gap:.2e}")
    print(f"  sampling  diffusers pipe(): {res['sample_diffusers_s'] * 1000:8.1f} ms")
    print(f"  sampling  mmrl rollout    : {res['sample_mmrl_s'] * 1000:8.1f} ms   (SDE + per-step log-probs)")
    print(f"  sampling ratio mmrl/diffusers: {res['sample_ratio']:.3f}   (target <= 1.1)")
    print(f"  train step trainer       : {res['train_trainer_s'] * 1000:8.1f} ms")
    print(
        f"  train step bare compute  : {res['train_bare_s'] * 1000:8.1f} ms   (pipe() + fwd/bwd on trained steps + AdamW)"
    )
    print(f"  training overhead ratio trainer/bare: {res['train_ratio']:.3f}   (target <= 1.15)")
    return res


if __name__ == "__main__":
    main()
