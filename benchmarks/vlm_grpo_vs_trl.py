"""One GRPO step on a tiny Qwen-VL: mmrl's Trainer vs TRL's GRPOTrainer vs the bare model compute.

    python benchmarks/vlm_grpo_vs_trl.py [--family qwen2_5_vl|qwen2_vl|qwen3_vl] [--steps 20] [--quick]

Setting (identical on every side): the tiny offline model of ``--family``
(:func:`mmrl.models.tiny_vlm.build_tiny_vlm`, the same saved folder and initial weights), the
synthetic grounding scenes of ``task=vqa_grounding`` (same prompts, same images), 8 prompts x G=4
samples = 32 completions per step, at most 32 new tokens, temperature 1 sampling (top-p 1, no
top-k), the vision special tokens suppressed, fp32, 1 torch thread, no KL (beta = 0), one PPO epoch
with one minibatch and no gradient accumulation, GRPO advantages with group std scaling, the
sequence-mean-token-mean loss, grad clip 1.0, AdamW, the same learning rate, the vision tower frozen
(mmrl's default; TRL's optimizer is built after the script freezes the same parameters).

What each side does per step:

* **mmrl** (``Trainer.train_step()`` + the tracker's metrics line): sample 8 prompts, prepare items,
  chat template + one processor call per prompt, the vision tower once per prompt (features reused
  by the G samples and by training), HF ``generate`` with seeded Gumbel sampling that records the
  behaviour log-probs, rewards (grounding + format + duplicate penalty, in original-image pixels),
  group advantages, then one forward/backward/AdamW over prompt + completion where the old
  log-probs are the current ones detached (``algo.old_logp=auto`` -> no extra forward; the behaviour
  log-probs are only compared for the ``rollout/*`` mismatch metrics).
* **TRL** (the time between two consecutive ``on_step_end`` callbacks, so data loading, logging and
  the callback-free trainer loop are all in): chat template + processor over the 32 repeated prompts
  (the vision tower runs on all 32 copies of the images in ``generate``), HF ``generate`` (multinomial
  sampling, no log-probs), a second processor call over the 32 prompts for the training forward,
  the same three reward functions through an adapter (same weights 1.0 / 0.2 / -0.5), group
  advantages, and one forward/backward/AdamW (``gradient_accumulation_steps=1 =
  steps_per_generation``, ``num_iterations=1``: TRL skips its old-log-prob forward too; the training
  forward re-runs the frozen vision tower on the 32 images).
* **bare compute** (what any implementation must do at least, written with plain transformers):
  one processor call over the 8 prompts, inputs repeated G times, HF ``generate`` with
  ``do_sample=True``, then one forward (``logits_to_keep`` = completion length + 1) / backward /
  AdamW over prompt + completion; no rewards, advantages or bookkeeping.

A random-init tiny model rarely writes a parseable answer, so rewards and advantages are mostly 0 on
both sides; neither trainer skips a zero-advantage batch (both run the full forward/backward), so the
per-step work is that of a learning run with the same completion lengths.

The three are interleaved in one run (one TRL step, then one mmrl step, then one bare step; the
machines are noisy), warm-up steps excluded, and the medians are printed with the ratios
mmrl/TRL (target <= 0.7) and mmrl/bare (target <= 1.15). Mean completion lengths are printed too,
since a model that stops earlier does less work. Both trainers start from the same weights with a
small learning rate, so their completion lengths stay comparable.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from typing import Any, Callable, Sequence

import torch

FAMILIES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")
REWARD_WEIGHTS = {"grounding": 1.0, "format": 0.2, "duplicate": -0.5}
"""The task's default weights (``task.iou_weight``, ``format_weight``, ``-duplicate_penalty_weight``)."""


# ============================================================================ mmrl side


def mmrl_overrides(family: str, out_dir: str, *, batch: int, group: int, new_tokens: int, lr: float,
                   max_steps: int) -> list[str]:
    """The config overrides of the mmrl run (shared settings in the module docstring)."""
    return [
        "task=vqa_grounding", f"model=tiny_{family}", f"trainer.batch_size={batch}", f"algo.group_size={group}",
        f"model.max_new_tokens={new_tokens}", "trainer.sft_steps=0", f"trainer.lr={lr}", "trainer.threads=1",
        f"trainer.max_steps={max_steps}", "trainer.device=cpu", "trainer.eval_every=0", "trainer.eval_at_end=false",
        "trainer.progress=false", "trainer.tensorboard=false", "algo.kl_coef=0.0", "algo.ppo_epochs=1",
        "algo.num_minibatches=1", "trainer.grad_accum=1", "model.temperature=1.0", "model.top_p=1.0",
        "model.dtype=float32", f"trainer.output_dir={out_dir}", "trainer.run_name=mmrl",
    ]


def mmrl_timed_step(trainer) -> tuple[float, float]:
    """One ``train_step`` plus its metrics line; returns (seconds, mean completion length)."""
    t0 = time.perf_counter()
    metrics = trainer.train_step()
    trainer.step += 1
    trainer.tracker.log(metrics, trainer.step)
    return time.perf_counter() - t0, float(metrics.get("response/length", float("nan")))


# ============================================================================ bare compute


def _repeat_images(pixel_values: torch.Tensor, grid: torch.Tensor, group: int) -> torch.Tensor:
    """Processor pixel rows of each image repeated ``group`` times, image by image."""
    chunks = torch.split(pixel_values, grid.prod(-1).tolist())
    return torch.cat([c for c in chunks for _ in range(group)])


def bare_step(lm, processor, items: Sequence[dict], group: int, max_new_tokens: int, eos_ids: list[int],
              pad_id: int, suppress_ids: list[int], optimizer: torch.optim.Optimizer) -> tuple[float, float]:
    """Plain-transformers generate + forward/backward/AdamW for the same batch; (seconds, mean length)."""
    from mmrl.policies.vlm import build_messages

    t0 = time.perf_counter()
    texts = [processor.apply_chat_template(build_messages(it, 1), add_generation_prompt=True, tokenize=False)
             for it in items]
    enc = processor(text=texts, images=[it["image"] for it in items], padding=True, return_tensors="pt")
    grid = enc["image_grid_thw"]
    inputs = {
        "input_ids": enc["input_ids"].repeat_interleave(group, 0),
        "attention_mask": enc["attention_mask"].repeat_interleave(group, 0),
        "pixel_values": _repeat_images(enc["pixel_values"], grid, group),
        "image_grid_thw": grid.repeat_interleave(group, 0),
    }
    if "mm_token_type_ids" in enc:
        inputs["mm_token_type_ids"] = enc["mm_token_type_ids"].repeat_interleave(group, 0)
    lm.eval()
    with torch.no_grad():
        out = lm.generate(**inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                          eos_token_id=eos_ids, pad_token_id=pad_id, suppress_tokens=suppress_ids)
    P = inputs["input_ids"].shape[1]
    comp = out[:, P:]
    is_eos = torch.isin(comp, torch.tensor(eos_ids))
    mask = ((is_eos.int().cumsum(1) - is_eos.int()) == 0).long()
    T = comp.shape[1]
    fwd = dict(inputs, input_ids=out, attention_mask=torch.cat([inputs["attention_mask"], mask], 1))
    if "mm_token_type_ids" in inputs:
        fwd["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(comp)], 1)
    lm.train()
    logits = lm(**fwd, logits_to_keep=T + 1, use_cache=False).logits[:, :-1]
    logp = logits.float().log_softmax(-1).gather(-1, comp[..., None]).squeeze(-1)
    m = mask.float()
    loss = -(logp * m).sum() / m.sum().clamp(min=1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
    optimizer.step()
    lm.eval()
    return time.perf_counter() - t0, float(m.sum(1).mean())


# ============================================================================ TRL side


def trl_dataset(task, policy, items: Sequence[dict]):
    """A ``datasets.Dataset`` of the task's items for TRL: a conversational prompt, the image and the
    reward columns (plus the processor's model-input size, which mmrl's samples carry for box-frame
    conversion). The images stay in memory, as in mmrl's task (no PNG round trip per access)."""
    from datasets import Dataset

    rows, images = [], []
    for it in items:
        prepared = task.prepare_item(it)
        meta = policy.sample_meta([prepared])[0]
        row = {
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prepared["prompt"]}]}],
            "image_index": len(images),
            "input_size": meta["input_size"],
            "orig_size": meta["orig_size"],
        }
        row.update({k: v[0] for k, v in task.reward_columns([prepared]).items()})
        images.append(prepared["image"])
        rows.append(row)

    def attach_images(batch: dict) -> dict:
        return {**batch, "image": [images[i] for i in batch["image_index"]]}

    ds = Dataset.from_list(rows)
    ds.set_transform(attach_images)
    return ds


def trl_reward_funcs(task, family: str, box_frame: str, eos_ids: Sequence[int]) -> list[Callable]:
    """mmrl's grounding / format / duplicate rewards behind TRL's ``fn(prompts, completions, **columns)``.

    Each TRL completion becomes the sample dict mmrl's rewards read (text, truncated, sizes, frame).
    """
    eos = set(int(e) for e in eos_ids)

    def to_samples(completions, completion_ids, input_size, orig_size) -> list[dict]:
        out = []
        for c, ids, isz, osz in zip(completions, completion_ids, input_size, orig_size):
            text = c[0]["content"] if isinstance(c, list) else c
            out.append({"text": text, "truncated": not (ids and int(ids[-1]) in eos), "input_size": isz,
                        "orig_size": osz, "family": family, "box_frame": box_frame})
        return out

    funcs = []
    for spec in task.reward_specs():
        def fn(prompts, completions, completion_ids, input_size, orig_size, _inner=spec.fn, **cols):
            cols = {k: v for k, v in cols.items() if k in ("gt_boxes", "gt_labels", "answer_frame", "image_size", "id")}
            return _inner(prompts, to_samples(completions, completion_ids, input_size, orig_size), **cols)

        fn.__name__ = spec.name
        funcs.append(fn)
    return funcs


class _Interleave:
    """TRL callback: times each TRL step (end of previous callback -> this ``on_step_end``) and runs
    the other measurements between TRL steps."""

    def __init__(self, between: Callable[[int], None]) -> None:
        self.between = between
        self.times: list[float] = []
        self.lengths: list[float] = []
        self._resume = time.perf_counter()
        self._trainer = None

    def make(self):
        from transformers import TrainerCallback

        outer = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                outer._resume = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                outer.times.append(time.perf_counter() - outer._resume)
                m = outer._trainer._metrics["train"].get("completions/mean_length") if outer._trainer else None
                outer.lengths.append(float(m[-1]) if m else float("nan"))
                outer.between(state.global_step)
                outer._resume = time.perf_counter()

        return Callback()


def build_trl(model_path: str, dataset, reward_funcs: list[Callable], out_dir: str, *, group: int,
              batch: int, new_tokens: int, lr: float, max_steps: int, suppress_ids: list[int], callback):
    """TRL's GRPOTrainer on the saved tiny model, with the same settings as the mmrl run."""
    from transformers import AutoProcessor
    from trl import GRPOConfig, GRPOTrainer

    processor = AutoProcessor.from_pretrained(model_path, local_files_only=True)
    processor.tokenizer.padding_side = "left"
    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=batch * group, num_generations=group,
        gradient_accumulation_steps=1, max_completion_length=new_tokens, beta=0.0, temperature=1.0, top_p=1.0,
        top_k=0, learning_rate=lr, max_steps=max_steps, use_cpu=True, bf16=False, fp16=False, report_to="none",
        logging_steps=1, save_strategy="no", use_vllm=False, dataloader_num_workers=0, loss_type="grpo",
        scale_rewards="group", max_grad_norm=1.0, weight_decay=0.0, remove_unused_columns=False, disable_tqdm=True,
        reward_weights=[REWARD_WEIGHTS[f.__name__] for f in reward_funcs],
        generation_kwargs={"suppress_tokens": list(suppress_ids)}, seed=0,
    )
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward_funcs, args=args, train_dataset=dataset,
                          processing_class=processor, callbacks=[callback])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # no metrics dict printed per step
    return trainer


def freeze_vision(model) -> int:
    """Freeze a Qwen-VL vision tower (as mmrl's ``model.freeze_vision_tower=true``); returns #params frozen."""
    from mmrl.policies.vlm import vision_tower

    n = 0
    for p in vision_tower(model).parameters():
        p.requires_grad_(False)
        n += p.numel()
    return n


# ============================================================================ driver


def run(family: str, steps: int, warmup: int, *, batch: int = 8, group: int = 4, new_tokens: int = 32,
        lr: float = 1e-5) -> dict[str, Any]:
    """Interleave TRL, mmrl and bare steps; return the medians and ratios."""
    torch.set_num_threads(1)
    from mmrl.config import load_config
    from mmrl.models.presets import resolve_vlm
    from mmrl.trainer import Trainer

    total = warmup + steps
    out = tempfile.mkdtemp(prefix=f"bench-vlm-{family}-")
    cfg = load_config(mmrl_overrides(family, out, batch=batch, group=group, new_tokens=new_tokens, lr=lr,
                                     max_steps=total))
    tr = Trainer(cfg)
    tr.setup_run_dir()
    pol = tr.policy
    model_path = resolve_vlm(cfg.model.path)

    bare_opt = torch.optim.AdamW(pol.trainable_parameters(), lr=1e-8)
    prepared = [tr.task.prepare_item(it) for it in tr.train_items[: 8 * batch]]
    rows = trl_dataset(tr.task, pol, tr.train_items)
    funcs = trl_reward_funcs(tr.task, pol.family, pol.box_frame, pol.eos_ids)

    mm_t, mm_len, bare_t, bare_len = [], [], [], []

    def between(step: int) -> None:
        t, n = mmrl_timed_step(tr)
        items = [prepared[(step * batch + k) % len(prepared)] for k in range(batch)]
        tb, nb = bare_step(pol.module.lm, pol.processor, items, group, new_tokens, pol.eos_ids, pol.pad_id,
                           pol.suppress_ids, bare_opt)
        if step > warmup:
            mm_t.append(t)
            mm_len.append(n)
            bare_t.append(tb)
            bare_len.append(nb)

    inter = _Interleave(between)
    trl = build_trl(model_path, rows, funcs, tempfile.mkdtemp(prefix="bench-trl-"), group=group, batch=batch,
                    new_tokens=new_tokens, lr=lr, max_steps=total, suppress_ids=pol.suppress_ids,
                    callback=inter.make())
    inter._trainer = trl
    freeze_vision(trl.model)
    trl.train()
    trl_t, trl_len = inter.times[warmup:], inter.lengths[warmup:]
    res = {
        "family": family, "steps": len(mm_t),
        "mmrl_s": statistics.median(mm_t), "trl_s": statistics.median(trl_t), "bare_s": statistics.median(bare_t),
        "mmrl_len": statistics.fmean(mm_len), "trl_len": statistics.fmean(trl_len), "bare_len": statistics.fmean(bare_len),
    }
    res["mmrl_over_trl"] = res["mmrl_s"] / res["trl_s"]
    res["mmrl_over_bare"] = res["mmrl_s"] / res["bare_s"]
    return res


def report(r: dict[str, Any], batch: int, group: int, new_tokens: int) -> str:
    """Human-readable lines of one family's result."""
    return "\n".join([
        f"{r['family']}: {batch} prompts x G={group}, <= {new_tokens} new tokens, fp32, 1 thread, "
        f"median of {r['steps']} interleaved steps",
        f"  mmrl Trainer.train_step : {r['mmrl_s'] * 1000:8.1f} ms   (mean completion {r['mmrl_len']:.1f} tokens)",
        f"  TRL GRPOTrainer step    : {r['trl_s'] * 1000:8.1f} ms   (mean completion {r['trl_len']:.1f} tokens)",
        f"  bare compute            : {r['bare_s'] * 1000:8.1f} ms   (mean completion {r['bare_len']:.1f} tokens)",
        f"  ratio mmrl/TRL : {r['mmrl_over_trl']:.3f}   (target <= 0.7)",
        f"  ratio mmrl/bare: {r['mmrl_over_bare']:.3f}   (target <= 1.15)",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=(*FAMILIES, "all"), default="qwen2_5_vl")
    ap.add_argument("--steps", type=int, default=20, help="measured steps per side (after warm-up)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="3 measured steps after 1 warm-up (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup = 3, 1
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    for fam in FAMILIES if args.family == "all" else (args.family,):
        print(report(run(fam, args.steps, args.warmup), 8, 4, 32), flush=True)


if __name__ == "__main__":
    main()
