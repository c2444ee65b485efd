"""One GRPO step on a tiny Qwen-VL: mmrl's Trainer vs TRL's GRPOTrainer (two settings) vs the bare-compute floor.

    python benchmarks/vlm_grpo_vs_trl.py [--family qwen2_5_vl|qwen2_vl|qwen3_vl|all] [--group 8] [--prompts 8]
                                         [--steps 10] [--warmup 2] [--repeats 3] [--quick]

Setting (identical on every side): the tiny offline model of ``--family``
(:func:`mmrl.models.tiny_vlm.build_tiny_vlm`, the same saved folder and initial weights), the synthetic
grounding scenes of ``task=vqa_grounding`` (same prompts, same images), ``--prompts`` prompts x G = ``--group``
samples per step (default 8 x 8 = 64 completions), at most 32 new tokens, temperature 1 sampling (top-p 1, no
top-k), the vision special tokens suppressed, fp32, 1 torch thread, no KL (beta = 0), one PPO epoch with one
minibatch and no gradient accumulation, GRPO advantages with group std scaling, the sequence-mean-token-mean loss,
grad clip 1.0, AdamW, the same learning rate, the vision tower frozen (mmrl's default; TRL's optimizer is built
after the script freezes the same parameters), the same three rewards (grounding + format + duplicate penalty,
weights 1.0 / 0.2 / -0.5, in original-image pixels).

What each side does per step:

* **mmrl** (``Trainer.train_step()`` + the tracker's metrics line), mmrl's defaults: ``model.shared_prefix=true``,
  ``model.gradient_checkpointing=false``. Sample the prompts, prepare items, chat template + one processor call
  per prompt, the vision tower once per prompt (features reused by the G samples and by training), HF ``generate``
  with seeded Gumbel sampling that records the behaviour log-probs, rewards, group advantages, then one
  forward/backward/AdamW where the old log-probs are the current ones detached (``algo.old_logp=auto`` -> no extra
  forward). The training forward is the shared-prefix forward (:mod:`mmrl.policies.shared_prefix`): one row per
  prompt holding the prompt once and its G completions, ``P + G T`` tokens per prompt.
* **TRL** (the time between two consecutive ``on_step_end`` callbacks, so data loading, logging and the trainer
  loop are all in), run in two settings, each its own ``GRPOTrainer`` on the same saved model:

  - **TRL default**: ``GRPOConfig``'s own default ``gradient_checkpointing=True`` (TRL's documented change of the
    ``TrainingArguments`` default), everything else as below.
  - **TRL matched**: ``gradient_checkpointing=False``, as mmrl's default. This is the line mmrl is judged against.

  Both: chat template + processor over the G-times repeated prompts (the vision tower runs on all G copies of each
  image in ``generate``), HF ``generate`` (multinomial sampling, no log-probs), a second processor call for the
  training forward, the rewards through an adapter, group advantages, and one forward/backward/AdamW
  (``gradient_accumulation_steps=1 = steps_per_generation``, ``num_iterations=1``: TRL skips its old-log-prob
  forward too; its training forward re-runs the frozen vision tower on every copy of the images and holds
  ``G (P + T)`` tokens per prompt).
* **floor** (the least work any implementation must do to produce and train on these completions, written with
  plain transformers on mmrl's model): one chat-template pass + ONE processor call over the prompts, the vision
  tower ONCE per distinct image (``get_image_features`` under ``no_grad``; the tower is frozen), the features
  repeated (not the pixels) to the G samples; the KV cache of every prompt but its last token computed ONCE per
  prompt (images once) and repeated to its G samples with the multimodal rotary offsets (``rope_deltas``), from
  which HF ``generate(do_sample=True)`` continues (as mmrl's rollout does with ``model.shared_prefix=true``); then, over those same completions, one forward/backward/grad-clip/AdamW of the token-mean
  log-likelihood loss with the features reused again (no vision tower in training) in the shared-prefix layout:
  one packed row per prompt, the prompt once and its G completions after it under the shared-prefix attention
  mask, ``P + G T`` tokens per prompt (mmrl's pure index helpers ``plan_layout`` / ``pack_rows`` /
  ``pack_positions`` / ``model_attention_mask`` / ``prediction_index`` / ``unpack`` lay the rows out; positions
  from the model's own ``get_rope_index``), the LM head only from the prompts' last column on. No rewards,
  advantages, behaviour log-probs, metrics or bookkeeping. ``floor = generate + shared training``.
* **floor without sharing**: HF ``generate`` over the G copies of each prompt (features still reused, every copy
  prefilled; timed on its own, its samples are not used) plus the plain training forward over the floor's
  completions: G copies of each prompt, ``G (P + T)`` tokens per prompt, features reused (still no vision
  tower in training), ``logits_to_keep = T + 1``. ``floor without sharing = plain generate + plain training``; it is the
  floor of an implementation that does not share prompts (such as TRL).

A floor must never read as slower than the thing it floors: mmrl below the floor would mean the floor does more
work than it must (a wrong floor), not that mmrl is fast, and the script says so when it happens. The script also
prints, once, the largest log-prob difference between the floor's shared and plain forwards over the same
completions (they must agree up to float summation order) and the tokens each forward holds.

A random-init tiny model rarely writes a parseable answer, so rewards and advantages are mostly 0 on all sides;
no side skips a zero-advantage batch (all run the full forward/backward), so the per-step work is that of a
learning run with the printed completion lengths (mean tokens per completion, EOS included, every side), since a
model that stops earlier does less work. mmrl and the floor share one model (the floor's AdamW has lr 1e-8, so it
does not move it); the TRL trainers start from the same weights with the same small learning rate.

Measurement: all sides are interleaved step by step in one process (both TRL trainers' ``train()`` loops run in
their own threads that take turns with the main thread: exactly one side computes at any time; the order of the
sides rotates every step, so none always runs first after another). ``--warmup`` steps of every side are dropped,
then ``--repeats`` blocks of ``--steps`` steps each are measured; for every block the script takes each side's
median step time and the ratios of those medians, and prints, per side and per ratio, the median across blocks
and the spread (min-max). Targets at G=8: mmrl / TRL matched <= 0.4, mmrl / floor <= 1.15.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Sequence

import torch
from _stats import spread, timed_train_step

FAMILIES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")
REWARD_WEIGHTS = {"grounding": 1.0, "format": 0.2, "duplicate": -0.5}
"""The task's default weights (``task.iou_weight``, ``format_weight``, ``-duplicate_penalty_weight``)."""
SIDES = ("mmrl", "trl_default", "trl_matched", "floor", "floor_plain")
LABELS = {
    "mmrl": "mmrl Trainer.train_step (shared prefix, no grad ckpt)",
    "trl_default": "TRL default (gradient_checkpointing=True)",
    "trl_matched": "TRL matched (gradient_checkpointing=False)",
    "floor": "floor (images once, shared prefix)",
    "floor_plain": "floor without sharing (G prompt copies)",
}
RATIOS = (  # (numerator, denominator, target or None)
    ("mmrl", "trl_matched", 0.4),
    ("mmrl", "trl_default", None),
    ("mmrl", "floor", 1.15),
    ("mmrl", "floor_plain", None),
    ("floor", "floor_plain", None),
    ("trl_matched", "trl_default", None),
)


# ============================================================================ mmrl side


def mmrl_overrides(
    family: str, out_dir: str, *, batch: int, group: int, new_tokens: int, lr: float, max_steps: int
) -> list[str]:
    """The config overrides of the mmrl run (shared settings in the module docstring)."""
    return [
        "task=vqa_grounding",
        f"model=tiny_{family}",
        f"trainer.batch_size={batch}",
        f"algo.group_size={group}",
        f"model.max_new_tokens={new_tokens}",
        "trainer.warm_start.steps=0",
        f"trainer.optim.lr={lr}",
        "trainer.threads=1",
        f"trainer.max_steps={max_steps}",
        "trainer.device=cpu",
        "trainer.eval.every=0",
        "trainer.eval.at_end=false",
        "trainer.logging.progress=false",
        "trainer.logging.tensorboard=false",
        "algo.kl_coef=0.0",
        "algo.ppo_epochs=1",
        "algo.num_minibatches=1",
        "trainer.grad_accum=1",
        "model.temperature=1.0",
        "model.top_p=1.0",
        "model.dtype=float32",
        "model.shared_prefix=true",
        "model.gradient_checkpointing=false",
        f"trainer.output_dir={out_dir}",
        "trainer.run_name=mmrl",
    ]


# ============================================================================ floor (bare compute)


def _features_object(out, per_image: Sequence[int]):
    """The ``mm_encoder_outputs["image"]`` object whose features are ``out``'s images in the order ``per_image``."""
    embeds = list(out.pooler_output)
    kw: dict[str, Any] = {"pooler_output": [embeds[i] for i in per_image]}
    deep = getattr(out, "deepstack_features", None)
    if deep:
        kw["deepstack_features"] = [[list(layer)[i] for i in per_image] for layer in deep]
    return type(out)(**kw)


def _train_update(
    lm, logits: torch.Tensor, comp: torch.Tensor, mask: torch.Tensor, optimizer: torch.optim.Optimizer
) -> torch.Tensor:
    """Token-mean log-likelihood loss of ``comp`` under ``logits`` [B, T, V], backward, clip 1.0, AdamW."""
    logp = logits.float().log_softmax(-1).gather(-1, comp[..., None]).squeeze(-1)
    m = mask.float()
    loss = -(logp * m).sum() / m.sum().clamp(min=1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
    optimizer.step()
    return logp.detach()


def floor_step(
    lm,
    processor,
    items: Sequence[dict],
    group: int,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    suppress_ids: list[int],
    optimizer: torch.optim.Optimizer,
) -> dict[str, Any]:
    """Generate once, then train on the same completions with the shared-prefix and the plain forward.

    Returns the seconds of the four parts (``gen`` with each prompt prefilled once, ``gen_plain`` prefilling every
    copy, ``shared``, ``plain`` training), the mean completion length, the tokens
    of each training forward and the largest |log-prob| difference between the two forwards."""
    from mmrl.policies import shared_prefix as sp
    from mmrl.policies.vlm import _base_model, build_messages

    base = _base_model(lm)
    n, G = len(items), group
    t0 = time.perf_counter()
    texts = [
        processor.apply_chat_template(build_messages(it, 1), add_generation_prompt=True, tokenize=False) for it in items
    ]
    enc = processor(text=texts, images=[it["image"] for it in items], padding=True, return_tensors="pt")
    grid = enc["image_grid_thw"]
    lm.eval()
    with torch.no_grad():
        vis = base.get_image_features(enc["pixel_values"], grid, return_dict=True)  # each image once
    rep = [i for i in range(n) for _ in range(G)]
    feats_rep = _features_object(vis, rep)
    inputs = {
        "input_ids": enc["input_ids"].repeat_interleave(G, 0),
        "attention_mask": enc["attention_mask"].repeat_interleave(G, 0),
        "mm_token_type_ids": enc["mm_token_type_ids"].repeat_interleave(G, 0),
        "image_grid_thw": grid.repeat_interleave(G, 0),
    }
    sampling = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        suppress_tokens=suppress_ids,
    )
    t_vis = time.perf_counter() - t0
    # ---- generate without prefix sharing (timed for the floor without sharing; its completions are not used)
    t_g = time.perf_counter()
    with torch.no_grad():
        lm.generate(**inputs, mm_encoder_outputs={"image": feats_rep}, **sampling)
    t_gen_plain = t_vis + time.perf_counter() - t_g
    # ---- generate with each prompt prefilled once: the KV cache of prompt[:-1] computed on the n distinct prompts
    # (images once), repeated to the G samples with the multimodal rotary offsets; generate continues from it
    from transformers import DynamicCache

    from mmrl.rollout.token_sampler import cache_kwarg

    t_g = time.perf_counter()
    cache = DynamicCache(config=base.config)
    base.model.rope_deltas = None
    with torch.no_grad():
        lm(
            input_ids=enc["input_ids"][:, :-1],
            attention_mask=enc["attention_mask"][:, :-1],
            mm_token_type_ids=enc["mm_token_type_ids"][:, :-1],
            image_grid_thw=grid,
            mm_encoder_outputs={"image": _features_object(vis, range(n))},
            use_cache=True,
            logits_to_keep=1,
            **{cache_kwarg(lm): cache},
        )
        index = torch.tensor(rep)
        cache.batch_select_indices(index)
        base.model.rope_deltas = base.model.rope_deltas[index]
        out = lm.generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            mm_token_type_ids=inputs["mm_token_type_ids"],
            **{cache_kwarg(lm): cache},
            **sampling,
        )
    P = inputs["input_ids"].shape[1]
    comp = out[:, P:]
    is_eos = torch.isin(comp, torch.tensor(eos_ids))
    mask = ((is_eos.int().cumsum(1) - is_eos.int()) == 0).long()  # up to and including the first EOS
    T = comp.shape[1]
    lengths = mask.sum(1).tolist()
    t_gen = t_vis + time.perf_counter() - t_g

    # ---- plain training forward: G rows of prompt + completion per prompt, features reused
    t1 = time.perf_counter()
    fwd = dict(
        inputs,
        input_ids=out,
        attention_mask=torch.cat([inputs["attention_mask"], mask], 1),
        mm_token_type_ids=torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(comp)], 1),
    )
    lm.train()
    logits = lm(**fwd, mm_encoder_outputs={"image": feats_rep}, logits_to_keep=T + 1, use_cache=False).logits[:, :-1]
    logp_plain = _train_update(lm, logits, comp, mask, optimizer)
    del logits
    lm.eval()
    t_plain = time.perf_counter() - t1

    # ---- shared-prefix training forward: one row per prompt, the prompt once, its G completions after it
    t2 = time.perf_counter()
    att = enc["attention_mask"].bool()
    prompt_ids = [enc["input_ids"][i][att[i]] for i in range(n)]
    prompt_mm = [enc["mm_token_type_ids"][i][att[i]] for i in range(n)]
    layout = sp.plan_layout(
        [list(range(i * G, (i + 1) * G)) for i in range(n)], [p.numel() for p in prompt_ids], lengths
    )
    ids = sp.pack_rows(layout, prompt_ids, comp, pad_id)
    mm = sp.pack_rows(layout, prompt_mm, None, 0)
    E, R = layout.prefix_end, layout.num_rows
    prompt_cols = sp.segment_ids(layout)[:, :E] == sp.PREFIX_SEGMENT
    one = torch.ones(R, 1, dtype=torch.long)
    pos, _ = base.model.get_rope_index(
        input_ids=torch.cat([ids[:, :E], one * pad_id], 1),
        mm_token_type_ids=torch.cat([mm[:, :E], one * 0], 1),
        attention_mask=torch.cat([prompt_cols.long(), one], 1),
        image_grid_thw=grid,
    )
    positions = sp.pack_positions(layout, pos[:, :, :E], pos[:, :, E])
    text_config = lm.config.get_text_config()
    amask = sp.model_attention_mask(text_config, sp.segment_ids(layout), torch.float32)
    lm.train()
    logits = lm(
        input_ids=ids,
        attention_mask=amask,
        position_ids=positions,
        mm_token_type_ids=mm,
        image_grid_thw=grid,
        mm_encoder_outputs={"image": _features_object(vis, range(n))},
        logits_to_keep=layout.width - E + 1,
        use_cache=False,
    ).logits
    logits = sp.unpack(logits, sp.prediction_index(layout, T), first_col=layout.width - logits.shape[1])
    logp_shared = _train_update(lm, logits, comp, mask, optimizer)
    del logits
    lm.eval()
    t_shared = time.perf_counter() - t2
    m = mask.bool()
    return {
        "gen": t_gen,
        "gen_plain": t_gen_plain,
        "shared": t_shared,
        "plain": t_plain,
        "len": float(mask.float().sum(1).mean()),
        "tokens_shared": layout.tokens,
        "tokens_plain": int(out.shape[0] * out.shape[1]),
        "width_shared": R * layout.width,
        "logp_diff": float((logp_plain - logp_shared)[m].abs().max()) if bool(m.any()) else 0.0,
    }


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
            out.append(
                {
                    "text": text,
                    "truncated": not (ids and int(ids[-1]) in eos),
                    "input_size": isz,
                    "orig_size": osz,
                    "family": family,
                    "box_frame": box_frame,
                }
            )
        return out

    funcs = []
    for spec in task.reward_specs():

        def fn(prompts, completions, completion_ids, input_size, orig_size, _inner=spec.fn, **cols):
            cols = {k: v for k, v in cols.items() if k in ("gt_boxes", "gt_labels", "answer_frame", "image_size", "id")}
            return _inner(prompts, to_samples(completions, completion_ids, input_size, orig_size), **cols)

        fn.__name__ = spec.name
        funcs.append(fn)
    return funcs


class TRLRunner:
    """One ``GRPOTrainer.train()`` in its own thread that computes one optimizer step per :meth:`step` call and
    waits otherwise (the main thread waits meanwhile: one side computes at a time). A step's time runs from the
    resume to the next ``on_step_end`` (data loading, generation, rewards, forward/backward/optimizer, the
    previous step's logging)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.times: list[float] = []
        self.lengths: list[float] = []
        self.trainer = None
        self._go, self._done = threading.Event(), threading.Event()
        self._resume = time.perf_counter()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _handoff(self) -> None:
        self._done.set()
        self._go.wait()
        self._go.clear()
        self._resume = time.perf_counter()

    def callback(self):
        from transformers import TrainerCallback

        outer = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                outer._handoff()

            def on_step_end(self, args, state, control, **kw):
                outer.times.append(time.perf_counter() - outer._resume)
                m = outer.trainer._metrics["train"].get("completions/mean_length")
                outer.lengths.append(float(m[-1]) if m else float("nan"))
                if state.global_step < state.max_steps:
                    outer._handoff()

        return Callback()

    def _main(self) -> None:
        torch.set_num_threads(1)
        try:
            self.trainer.train()
        except BaseException as e:  # re-raised in the main thread
            self._error = e
        finally:
            self._done.set()

    def start(self) -> None:
        """Start ``train()``; returns when it reached its first step."""
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        self._wait()

    def _wait(self) -> None:
        self._done.wait()
        self._done.clear()
        if self._error is not None:
            raise RuntimeError(f"{self.name} failed") from self._error

    def step(self) -> tuple[float, float]:
        """One TRL step; (seconds, mean completion length). After the last step ``train()`` is joined."""
        n = len(self.times)
        self._go.set()
        self._wait()
        if len(self.times) != n + 1:
            raise RuntimeError(f"{self.name}: train() ended before its step {n + 1}")
        if self.trainer.state.global_step >= self.trainer.state.max_steps:
            self._thread.join()
        return self.times[-1], self.lengths[-1]


def build_trl(
    model_path: str,
    dataset,
    reward_funcs: list[Callable],
    out_dir: str,
    *,
    group: int,
    batch: int,
    new_tokens: int,
    lr: float,
    max_steps: int,
    suppress_ids: list[int],
    callback,
    gradient_checkpointing: bool | None,
):
    """TRL's GRPOTrainer on the saved tiny model, with the same settings as the mmrl run;
    ``gradient_checkpointing=None`` keeps ``GRPOConfig``'s own default."""
    from transformers import AutoProcessor
    from trl import GRPOConfig, GRPOTrainer

    processor = AutoProcessor.from_pretrained(model_path, local_files_only=True)
    processor.tokenizer.padding_side = "left"
    extra = {} if gradient_checkpointing is None else {"gradient_checkpointing": gradient_checkpointing}
    args = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=batch * group,
        num_generations=group,
        gradient_accumulation_steps=1,
        max_completion_length=new_tokens,
        beta=0.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=lr,
        max_steps=max_steps,
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        use_vllm=False,
        dataloader_num_workers=0,
        loss_type="grpo",
        scale_rewards="group",
        max_grad_norm=1.0,
        weight_decay=0.0,
        remove_unused_columns=False,
        disable_tqdm=True,
        reward_weights=[REWARD_WEIGHTS[f.__name__] for f in reward_funcs],
        generation_kwargs={"suppress_tokens": list(suppress_ids)},
        seed=0,
        **extra,
    )
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=processor,
        callbacks=[callback],
    )
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


def run(
    family: str,
    steps: int,
    warmup: int,
    repeats: int,
    *,
    batch: int = 8,
    group: int = 8,
    new_tokens: int = 32,
    lr: float = 1e-5,
) -> dict[str, Any]:
    """Interleave all sides step by step; per-side times and lengths of every measured step, by repeat."""
    torch.set_num_threads(1)
    from mmrl.config import load_config
    from mmrl.models.presets import resolve_vlm
    from mmrl.trainer import Trainer

    total = warmup + repeats * steps
    out = tempfile.mkdtemp(prefix=f"bench-vlm-{family}-")
    cfg = load_config(
        mmrl_overrides(family, out, batch=batch, group=group, new_tokens=new_tokens, lr=lr, max_steps=total)
    )
    tr = Trainer(cfg)
    tr.setup_run_dir()
    pol = tr.policy
    model_path = resolve_vlm(cfg.model.path)

    floor_opt = torch.optim.AdamW(pol.trainable_parameters(), lr=1e-8)
    prepared = [tr.task.prepare_item(it) for it in tr.train_items[: 8 * batch]]
    rows = trl_dataset(tr.task, pol, tr.train_items)
    funcs = trl_reward_funcs(tr.task, pol.family, pol.box_frame, pol.eos_ids)

    runners: dict[str, TRLRunner] = {}
    trl_settings: dict[str, dict[str, Any]] = {}
    for name, gc in (("trl_default", None), ("trl_matched", False)):
        r = TRLRunner(name)
        r.trainer = build_trl(
            model_path,
            rows,
            funcs,
            tempfile.mkdtemp(prefix=f"bench-{name}-"),
            group=group,
            batch=batch,
            new_tokens=new_tokens,
            lr=lr,
            max_steps=total,
            suppress_ids=pol.suppress_ids,
            callback=r.callback(),
            gradient_checkpointing=gc,
        )
        freeze_vision(r.trainer.model)
        runners[name] = r
    for name, r in runners.items():
        r.start()  # train() has set the model up (checkpointing is switched on there)
        trl_settings[name] = {
            "gradient_checkpointing": r.trainer.args.gradient_checkpointing,
            "model_gc": bool(getattr(r.trainer.model, "is_gradient_checkpointing", False)),
        }
    if trl_settings["trl_default"]["gradient_checkpointing"] is not True:
        raise RuntimeError("expected GRPOConfig's default gradient_checkpointing=True; this TRL differs")

    data: dict[str, list[list[tuple[float, float]]]] = {s: [[] for _ in range(repeats)] for s in SIDES}
    floor_info: dict[str, list[float]] = {"tokens_shared": [], "tokens_plain": [], "width_shared": [], "logp_diff": []}
    floor_step_no = [0]

    def floor_side() -> dict[str, tuple[float, float]]:
        k = floor_step_no[0]
        floor_step_no[0] += 1
        items = [prepared[(k * batch + j) % len(prepared)] for j in range(batch)]
        f = floor_step(
            pol.module.lm, pol.processor, items, group, new_tokens, pol.eos_ids, pol.pad_id, pol.suppress_ids, floor_opt
        )
        for key in floor_info:
            floor_info[key].append(f[key])
        return {"floor": (f["gen"] + f["shared"], f["len"]), "floor_plain": (f["gen_plain"] + f["plain"], f["len"])}

    def mmrl_side() -> dict[str, tuple[float, float]]:
        return {"mmrl": timed_train_step(tr)}

    def trl_side(name: str) -> Callable[[], dict[str, tuple[float, float]]]:
        return lambda: {name: runners[name].step()}

    order = [trl_side("trl_default"), trl_side("trl_matched"), mmrl_side, floor_side]
    for step in range(total):
        k = step % len(order)
        results: dict[str, tuple[float, float]] = {}
        for fn in order[k:] + order[:k]:  # rotate the order every step
            results.update(fn())
        if step >= warmup:
            rep = (step - warmup) // steps
            for s in SIDES:
                data[s][rep].append(results[s])
    mm_guard = pol.shared_prefix
    return {
        "family": family,
        "batch": batch,
        "group": group,
        "new_tokens": new_tokens,
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "data": data,
        "floor_info": floor_info,
        "trl_settings": trl_settings,
        "mmrl_shared": dict(mm_guard.metrics()),
        "mmrl_shared_enabled": bool(mm_guard.enabled),
    }


def report(r: dict[str, Any]) -> str:
    """Human-readable lines of one family's result."""
    data, R = r["data"], r["repeats"]
    med = {s: [statistics.median(t for t, _ in data[s][k]) for k in range(R)] for s in SIDES}
    lines = [
        f"{r['family']}: {r['batch']} prompts x G={r['group']}, <= {r['new_tokens']} new tokens, fp32, 1 thread; "
        f"{r['warmup']} warm-up steps, then {R} repeats x {r['steps']} interleaved steps per side",
        f"  TRL settings: default -> gradient_checkpointing={r['trl_settings']['trl_default']['gradient_checkpointing']}"
        f" (model checkpointing on: {r['trl_settings']['trl_default']['model_gc']}); matched -> "
        f"gradient_checkpointing={r['trl_settings']['trl_matched']['gradient_checkpointing']} (model checkpointing on:"
        f" {r['trl_settings']['trl_matched']['model_gc']}); mmrl: gradient_checkpointing=False, shared_prefix="
        f"{r['mmrl_shared_enabled']}",
        "  step time, ms: median across repeats [min-max] of the per-repeat medians; mean completion tokens",
    ]
    for s in SIDES:
        lens = [n for rep in data[s] for _, n in rep]
        lines.append(
            f"  {LABELS[s]:<54}: {spread(med[s], 1000):>26}   (completion {statistics.fmean(lens):.1f}"
            f" tokens, min {min(lens):.1f}, max {max(lens):.1f})"
        )
    lines.append("  ratios (per repeat: ratio of the medians), median [min-max]:")
    ratios: dict[str, float] = {}
    for a, b, target in RATIOS:
        xs = [x / y for x, y in zip(med[a], med[b])]
        ratios[f"{a}/{b}"] = statistics.median(xs)
        tgt = f"   (target <= {target})" if target is not None else ""
        lines.append(f"    {a + ' / ' + b:<26}: {spread(xs, 1, '{:.3f}')}{tgt}")
    fi = r["floor_info"]
    lines.append(
        f"  floor training tokens per step (mean): shared {statistics.fmean(fi['tokens_shared']):.0f} "
        f"(packed width incl. padding {statistics.fmean(fi['width_shared']):.0f}), plain "
        f"{statistics.fmean(fi['tokens_plain']):.0f} (incl. padding); max |logp shared - plain| "
        f"{max(fi['logp_diff']):.2e}"
    )
    lines.append(f"  mmrl shared-prefix guard: {r['mmrl_shared']}")
    if ratios["mmrl/floor"] < 1.0:
        lines.append(
            "  WARNING: mmrl is below the floor: the floor does more work than it must (a wrong floor), "
            "not a real speed-up"
        )
    for s in ("trl_default", "trl_matched"):
        if statistics.median(med[s]) < statistics.median(med["floor_plain"]):
            lines.append(f"  WARNING: {s} is below the floor without sharing: that floor is wrong")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=(*FAMILIES, "all"), default="qwen2_5_vl")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per side in each repeat")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps per side (dropped)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the interleaved measurement")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="smoke run: G=4, 4 prompts, 1 warm-up, 2 repeats x 2 steps")
    args = ap.parse_args()
    if args.quick:
        args.group, args.prompts, args.warmup, args.repeats, args.steps = 4, 4, 1, 2, 2
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore")
    for fam in FAMILIES if args.family == "all" else (args.family,):
        res = run(
            fam, args.steps, args.warmup, args.repeats, batch=args.prompts, group=args.group, new_tokens=args.new_tokens
        )
        print(report(res), flush=True)


if __name__ == "__main__":
    main()
