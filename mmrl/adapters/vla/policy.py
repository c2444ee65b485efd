"""Vision-language-action policy: a Qwen-VL whose completions are action tokens, rolled out in simulators.

One sample is one *episode*. For a prompt item ``{"prompt": instruction, "init_state": s,
"env_task": name}`` the ``G`` samples of the group are ``G`` episodes started from the same initial
state (SimpleVLA-RL's groups). All ``B * G`` episodes run in one persistent
:class:`~mmrl.simulators.env_pool.EnvPool` (created at the first rollout, closed by :meth:`close`
or at exit). The episode loop itself (resets, fingerprint checks, chunked env steps, frame
recording) is :func:`mmrl.adapters.vla.episodes.run_episodes`; this policy supplies its ``act``. At every
policy call, the frames of the still-running episodes go through ONE batched
image-processor call, ONE vision-tower forward and ONE ``generate`` of exactly
``chunk * action_dim`` tokens restricted to the action vocabulary (:class:`ActionTokenSampler`:
every other id is impossible, the behaviour log-prob is ``log_softmax`` over the bins at the
policy temperature). The :class:`~mmrl.adapters.vla.action_tokenizer.ActionTokenizer` decodes the bins
into an action chunk that the env workers execute.

The ``[B, T]`` tensors: ``T = policy calls x tokens per call`` (token granularity; ``action`` /
``chunk`` granularity sums the token log-probs per action / chunk with
:func:`~mmrl.adapters.vla.action_tokenizer.group_logp`). The mask covers the recorded steps; episodes
that failed for infrastructure reasons (env exception, hung or dead worker, simulator blow-up,
non-finite state) are ``valid=False``. Binary success is in each sample (``success``), read by the
task's reward function.

The payload keeps, per episode, the observed frames (uint8), the sampled bins, the instruction and,
with a frozen vision tower, the vision features computed at rollout time, so :meth:`log_probs`
re-runs only the language model over every (episode, step) pair of the micro-batch (prompt with
image features + the step's action tokens, ``logits_to_keep`` = action tokens).

Everything model-side (chat template, multimodal positions, LoRA, value head, reference,
save/load) is inherited from :class:`~mmrl.policies.vlm.VLMPolicy`. Continuous action chunks
(``model.action_head=flow|gaussian``) are :class:`~mmrl.adapters.vla.continuous_policy.ContinuousVLAPolicy`,
a subclass that replaces ``act``, the per-call payload (:meth:`VLAPolicy._call_payload`), the log-probs and the
warm-start loss.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from mmrl.adapters.vla.action_tokenizer import ActionTokenizer, group_logp, group_mask, group_size
from mmrl.adapters.vla.episodes import Act, ActOutput, EpisodeRecord, EpisodeRun, EpisodeSpec, run_episodes
from mmrl.adapters.vla.errors import VLAInputError
from mmrl.adapters.vla.init_states import INIT_STATES_FILE, InitStateRecord, init_state_key
from mmrl.adapters.vla.output_vocab import restricted_output_vocab
from mmrl.models.families import input_size_from_grid
from mmrl.policies.base import LogProbOutput, PromptBatch, Rollout
from mmrl.policies.token_policy import token_logp_and_entropy
from mmrl.policies.vlm import PromptInputs, VLMPolicy, build_messages, encode_images
from mmrl.rollout.token_sampler import SeededTokenSampler, top_p_mask

log = logging.getLogger(__name__)

__all__ = [
    "ACTION_STATS_FILE",
    "ActionTokenSampler",
    "VLAEnvSpec",
    "VLAPolicy",
    "action_vocab_ids",
    "first_identical_rows",
    "sample_action_tokens",
]

ACTION_STATS_FILE = "action_stats.json"
"""The action tokenizer's statistics, saved next to the model weights."""


def split_views(frames: np.ndarray, n_views: int) -> list[np.ndarray]:
    """The ``n_views`` equal-width views tiled side by side in ``frames [N, H, n * W, 3]``: ``n`` x ``[N, H, W, 3]``."""
    width = frames.shape[2]
    if width % n_views:
        raise VLAInputError(f"frames of width {width} do not split into {n_views} equal camera views")
    w = width // n_views
    return [frames[:, :, i * w : (i + 1) * w] for i in range(n_views)]


@dataclass
class VLAEnvSpec:
    """How the policy builds its env pool (given by the task)."""

    env_name: str
    """Registered env name of every pool slot."""
    env_kwargs: dict = field(default_factory=dict)
    """Constructor kwargs of every env."""
    max_steps: int = 50
    """Env steps after which an episode is truncated (bounds the policy calls)."""
    switch_tasks: bool = False
    """Items name their task in ``env_task``; slots are switched with ``env.set_task(name)``."""
    action_dim: int = 4
    """Entries of one action."""
    gripper_dims: tuple[int, ...] = ()
    """Action dimensions decoded to binary gripper commands."""


def action_vocab_ids(tokenizer, n_bins: int) -> list[int]:
    """Vocabulary ids of the bins: the reserved ``<|act_i|>`` tokens when the tokenizer has them,
    else (real Qwen-VL checkpoints, OpenVLA's recipe) the last ``n_bins`` ids of the base vocabulary."""
    from mmrl.models.tokenizer_builder import ACTION_TOKEN_FORMAT

    vocab = tokenizer.get_vocab()
    names = [ACTION_TOKEN_FORMAT.format(i) for i in range(n_bins)]
    if all(n in vocab for n in names):
        return [vocab[n] for n in names]
    base = int(tokenizer.vocab_size)
    log.info("tokenizer has no <|act_i|> tokens: using its last %d base-vocabulary ids as action bins", n_bins)
    return list(range(base - n_bins, base))


# ============================================================================ constrained sampling


class ActionTokenSampler(SeededTokenSampler):
    """Seeded sampling restricted to the action ids (a logits processor for greedy ``generate``).

    At each token: ``z = logits[action_ids] / T``; the pick is ``argmax(z + Gumbel(seed))`` (or
    ``argmax z`` when greedy), optionally inside the top-p nucleus of ``z``; the behaviour log-prob
    is ``log_softmax(z)[pick]``, the same formula :meth:`VLAPolicy.log_probs` uses. The returned
    scores are ``-inf`` everywhere but the picked id, so no other id can be generated.
    """

    def __init__(
        self, seeds, action_ids: Tensor, *, temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False
    ) -> None:
        super().__init__(seeds, temperature=temperature, top_p=top_p, greedy=greedy)
        self.action_ids = action_ids
        self.bins: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        ids = self.action_ids.to(scores.device)
        z = scores.float().index_select(-1, ids) / (self.temperature if self.temperature > 0 else 1.0)
        pick_from = z
        if not self.greedy:
            if self.top_p < 1.0:
                pick_from = pick_from.masked_fill(top_p_mask(pick_from, self.top_p), float("-inf"))
            pick_from = pick_from + self._noise(z.shape[-1], z.device)
        choice = pick_from.argmax(-1, keepdim=True)
        self.logps.append((z.gather(-1, choice) - z.logsumexp(-1, keepdim=True))[:, 0])
        self.bins.append(choice[:, 0])
        self.step += 1
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, ids[choice], 0.0)


def sample_action_tokens(
    lm,
    inputs: dict,
    *,
    seeds: Sequence[int],
    action_ids: Tensor,
    num_tokens: int,
    pad_id: int,
    temperature: float,
    top_p: float = 1.0,
    greedy: bool = False,
) -> tuple[Tensor, Tensor]:
    """Generate exactly ``num_tokens`` action tokens per row; returns bins ``[N, num_tokens]`` and
    their behaviour log-probs ``[N, num_tokens]`` (both on CPU)."""
    from transformers import GenerationConfig, LogitsProcessorList

    sampler = ActionTokenSampler(list(seeds), action_ids, temperature=temperature, top_p=top_p, greedy=greedy)
    gen_cfg = GenerationConfig(
        do_sample=False, max_new_tokens=num_tokens, min_new_tokens=num_tokens, pad_token_id=pad_id, num_beams=1
    )
    prompt_len = inputs["input_ids"].shape[1]
    with torch.no_grad():
        # synced_gpus=False: transformers turns it on for FSDP-managed modules and then all-reduces at every token, which
        # pairs up only if every rank generates as often (DAPO rounds, VLA episode steps differ); under
        # trainer.strategy=fsdp2 the weights are gathered for the whole rollout, so no rank needs the others
        out = lm.generate(
            **inputs, generation_config=gen_cfg, logits_processor=LogitsProcessorList([sampler]), synced_gpus=False
        )
    bins = torch.stack(sampler.bins, 1).cpu()
    generated = out[:, prompt_len:].cpu()
    if generated.shape != bins.shape or not torch.equal(generated, action_ids.cpu()[bins]):
        raise VLAInputError(
            f"generate returned {tuple(generated.shape)} tokens that are not the sampled action "
            f"tokens {tuple(bins.shape)}"
        )
    return bins, torch.stack(sampler.logps, 1).cpu()


def _same_features(a, b) -> bool:
    """Two observations' vision features (:class:`~mmrl.policies.vlm.ImageFeatures` or None) are bit-identical."""
    if a is None or b is None:
        return a is b
    if len(a.embeds) != len(b.embeds) or (a.deepstack is None) != (b.deepstack is None):
        return False
    pairs = list(zip(a.embeds, b.embeds))
    if a.deepstack is not None:
        pairs += [(x, y) for la, lb in zip(a.deepstack, b.deepstack) for x, y in zip(la, lb)]
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in pairs)


def first_identical_rows(
    frames: np.ndarray,
    instructions: Sequence[str],
    features: Sequence[Any] | None = None,
    states: np.ndarray | None = None,
) -> list[int]:
    """For each observation ``k`` (``frames [N, H, W, 3]``, ``instructions``, optional vision ``features`` and
    proprioceptive ``states [N, P]``), the first row with the same instruction, the same frame (and state) bytes and
    bit-identical features (``k`` itself when none before)."""
    if len(instructions) != len(frames) or (features is not None and len(features) != len(frames)):
        raise VLAInputError(
            f"{len(frames)} frames, {len(instructions)} instructions and "
            f"{'no' if features is None else len(features)} features do not match"
        )
    if states is not None and len(states) != len(frames):
        raise VLAInputError(f"{len(frames)} frames and {len(states)} states do not match")
    seen: dict[tuple[str, bytes, bytes], list[int]] = {}
    out: list[int] = []
    for k in range(len(frames)):
        state = b"" if states is None else np.ascontiguousarray(states[k]).tobytes()
        candidates = seen.setdefault((instructions[k], np.ascontiguousarray(frames[k]).tobytes(), state), [])
        match = next((r for r in candidates if features is None or _same_features(features[r], features[k])), None)
        if match is None:
            candidates.append(k)
            match = k
        out.append(match)
    return out


# ============================================================================ the policy


class VLAPolicy(VLMPolicy):
    """A :class:`~mmrl.policies.base.Policy` whose samples are episodes and whose actions are bins.

    Args:
        lm, processor, cfg: the Qwen-VL model, its processor and a :class:`~mmrl.adapters.vla.config.VLAConfig`.
        action_stats: ``{"low": [D], "high": [D]}`` normalisation statistics (1st / 99th percentiles
            of the demos' actions) or an :class:`ActionTokenizer` ``to_dict()``.
        env_spec: the env pool to roll out in.
        value_head, reference: as for :class:`~mmrl.policies.vlm.VLMPolicy`.
    """

    def __init__(
        self,
        lm,
        processor,
        cfg,
        action_stats: dict,
        env_spec: VLAEnvSpec,
        *,
        value_head: bool = False,
        reference: bool = False,
        min_envs: int = 1,
        check_init_states: bool = True,
    ) -> None:
        super().__init__(lm, processor, cfg, value_head=value_head, reference=reference)
        self.env_spec = env_spec
        self.init_states = InitStateRecord(strict=check_init_states)
        """Fingerprint of every (task, init state) reset so far; saved with checkpoints, compared at every reset."""
        self.min_envs = int(min_envs)
        """Env-pool slots created at the first rollout (the trainer's batch x group size), so the pool is built once."""
        self.action_ids = torch.tensor(action_vocab_ids(self.tokenizer, cfg.n_bins), dtype=torch.long)
        vocab = lm.get_input_embeddings().weight.shape[0]
        if int(self.action_ids.max()) >= vocab:
            raise VLAInputError(f"action id {int(self.action_ids.max())} is outside the model vocabulary ({vocab})")
        self.action_tokenizer = self._make_action_tokenizer(action_stats)
        self._pool = None
        self.record_frames = False
        """Keep every episode's frames in its sample (for evaluation videos); greedy rollouts always keep them.
        On inside :meth:`evaluation_outputs` (the trainer's evaluation)."""
        self._slot_tasks: list[str | None] = []
        self._assigned_at_restarts = 0
        self._templates: dict[tuple[str, tuple[int, ...]], PromptInputs] = {}
        cameras = list(action_stats.get("cameras") or ["image"])
        self.n_views = len(cameras) if cfg.camera_views == "separate" else 1
        """Images per observation given to the VLM: the task's camera views split out of its tiled frame
        (``model.camera_views=separate``), else the tiled frame as one image."""

    @contextlib.contextmanager
    def evaluation_outputs(self) -> Iterator[None]:
        """Every episode keeps its frames (for the evaluation videos) inside this context."""
        before = self.record_frames
        self.record_frames = True
        try:
            yield
        finally:
            self.record_frames = before

    # ------------------------------------------------------------------ action tokenizer
    def _make_action_tokenizer(self, stats: dict) -> ActionTokenizer:
        if "version" in stats:
            tok = ActionTokenizer.from_dict(stats, token_ids=self.action_ids.tolist())
            if tok.chunk != self.cfg.chunk:
                raise VLAInputError(f"saved action statistics use chunk={tok.chunk}, model.chunk={self.cfg.chunk}")
            return tok
        low = np.asarray(stats["low"], dtype=np.float64)
        if low.size != self.env_spec.action_dim:
            raise VLAInputError(f"action statistics have {low.size} dims, the env has {self.env_spec.action_dim}")
        return ActionTokenizer(
            low,
            stats["high"],
            n_bins=self.cfg.n_bins,
            token_ids=self.action_ids.tolist(),
            gripper_dims=tuple(stats.get("gripper_dims", self.env_spec.gripper_dims)),
            chunk=self.cfg.chunk,
        )

    @property
    def tokens_per_call(self) -> int:
        """Action tokens generated per policy call (``chunk * action_dim``)."""
        return self.action_tokenizer.tokens_per_chunk

    @property
    def _group(self) -> int:
        tok = self.action_tokenizer
        return group_size(self.cfg.logp_granularity, tok.action_dim, tok.chunk)

    @property
    def logp_columns_per_call(self) -> int:
        """Columns of the rollout's ``[B, T]`` tensors per policy call before grouping (one per action token)."""
        return self.tokens_per_call

    @property
    def actions_per_call(self) -> int:
        """Env steps executed per policy call (``model.n_action_steps``, default the whole chunk)."""
        return int(self.cfg.n_action_steps or self.cfg.chunk)

    def max_policy_calls(self) -> int:
        """Policy calls after which a rollout stops (the env truncates episodes before that)."""
        if self.cfg.max_policy_calls is not None:
            return int(self.cfg.max_policy_calls)
        return math.ceil(self.env_spec.max_steps / self.actions_per_call)

    # ------------------------------------------------------------------ observations -> prompts
    def _views(self, frames: np.ndarray) -> list[np.ndarray]:
        """The images of each frame of ``frames [N, H, W, 3]``, observation-major: ``N * n_views`` arrays."""
        views = split_views(frames, self.n_views)
        return [views[v][k] for k in range(len(frames)) for v in range(self.n_views)]

    def _template(self, instruction: str, frame: np.ndarray) -> PromptInputs:
        """Chat-templated ids of (images, instruction) for this frame size, computed once and cached."""
        key = (instruction, tuple(frame.shape))
        tpl = self._templates.get(key)
        if tpl is None:
            from PIL import Image

            images = [Image.fromarray(view) for view in self._views(frame[None])]
            text = self.processor.apply_chat_template(
                build_messages({"prompt": instruction}, len(images)), add_generation_prompt=True, tokenize=False
            )
            enc = self.processor(text=[text], images=images, return_tensors="pt")
            grid = enc["image_grid_thw"]
            mm = enc.get("mm_token_type_ids")
            ids = enc["input_ids"][0].long()
            if self.cfg.max_prompt_tokens is not None and ids.numel() > self.cfg.max_prompt_tokens:
                raise VLAInputError(f"prompt '{instruction}' has {ids.numel()} tokens > model.max_prompt_tokens")
            tpl = PromptInputs(
                text=text,
                images=images,
                input_ids=ids,
                mm_token_type_ids=mm[0].long() if mm is not None else torch.zeros_like(ids),
                pixel_values=None,
                image_grid_thw=grid,
                orig_sizes=[image.size for image in images],
                input_sizes=[input_size_from_grid(g, self.patch_size) for g in grid],
            )
            self._templates[key] = tpl
        return tpl

    def observation_prompts(
        self, frames: np.ndarray | Tensor, instructions: Sequence[str], *, features: Sequence[Any] | None = None
    ) -> list[PromptInputs]:
        """One :class:`PromptInputs` per observation: cached text ids + either the given vision
        ``features`` or pixel values from ONE batched image-processor call over ``frames [N, H, W, 3]``."""
        frames = frames.numpy() if isinstance(frames, Tensor) else np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise VLAInputError(f"frames must be uint8 [N, H, W, 3], got {frames.dtype} {frames.shape}")
        if len(instructions) != len(frames):
            raise VLAInputError(f"{len(instructions)} instructions for {len(frames)} frames")
        pixels = None
        if features is None and len(frames):
            enc = self.processor.image_processor(images=self._views(frames), return_tensors="pt")
            per = enc["image_grid_thw"].prod(-1).reshape(len(frames), self.n_views).sum(-1).tolist()
            pixels = torch.split(enc["pixel_values"], per)  # one observation's views together, in camera order
        out = []
        for k, instruction in enumerate(instructions):
            tpl = self._template(instruction, frames[k])
            out.append(
                PromptInputs(
                    text=tpl.text,
                    images=tpl.images,
                    input_ids=tpl.input_ids,
                    mm_token_type_ids=tpl.mm_token_type_ids,
                    pixel_values=pixels[k] if pixels is not None else None,
                    image_grid_thw=tpl.image_grid_thw,
                    orig_sizes=tpl.orig_sizes,
                    input_sizes=tpl.input_sizes,
                    features=features[k] if features is not None else None,
                )
            )
        return out

    # ------------------------------------------------------------------ env pool
    def _ensure_pool(self, n: int):
        """The persistent env pool, (re)built when a rollout needs more slots than it has."""
        if self._pool is not None and self._pool.num_envs >= n:
            return self._pool
        self.close()
        from mmrl.simulators.env_pool import EnvPool

        n = max(n, self.min_envs)
        spec = self.env_spec
        self._pool = EnvPool(
            spec.env_name,
            n,
            num_workers=min(self.cfg.num_workers, n),
            env_kwargs=spec.env_kwargs,
            step_timeout_s=self.cfg.step_timeout_s,
        )
        self._slot_tasks = [None] * n
        self._assigned_at_restarts = 0
        if tuple(self._pool.action_shape) != (spec.action_dim,):
            raise VLAInputError(
                f"env {spec.env_name} has actions {self._pool.action_shape}, expected ({spec.action_dim},)"
            )
        return self._pool

    def _assign_tasks(self, pool, tasks: Sequence[str | None]) -> None:
        """Switch slots whose env runs another task (``env.set_task``), one pool call per task name."""
        if not self.env_spec.switch_tasks:
            return
        restarts = int(pool.stats()["restarts"])
        if restarts != self._assigned_at_restarts:  # a restarted worker rebuilt its envs with the pool's first task
            self._slot_tasks = [None] * len(self._slot_tasks)
            self._assigned_at_restarts = restarts
        todo: dict[str, list[int]] = {}
        for slot, name in enumerate(tasks):
            if name is None:
                raise VLAInputError("env_spec.switch_tasks is set but an item has no 'env_task'")
            if self._slot_tasks[slot] != name:
                todo.setdefault(name, []).append(slot)
        for name, slots in todo.items():
            pool.call("set_task", name, env_indices=slots)
            for s in slots:
                self._slot_tasks[s] = name

    def prepare_for_evaluation(self, rollouts_per_call: int) -> None:
        """Evaluation rolls out fewer episodes per call than training: the env pool is sized for that."""
        self.min_envs = int(rollouts_per_call)

    def close(self) -> None:
        """Stop the env pool's workers (also done at interpreter exit)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ------------------------------------------------------------------ rollout
    @staticmethod
    def _check_item(item: dict, k: int) -> None:
        if not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise VLAInputError(f"item {k} has no instruction 'prompt' (keys: {sorted(item)})")
        s = item.get("init_state")
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise VLAInputError(f"item {k} needs a non-negative int 'init_state', got {s!r}")

    def rollout(self, batch: PromptBatch, group_size: int, *, greedy: bool = False) -> Rollout:
        """Run ``group_size`` episodes per item from the item's initial state; see the module docstring.

        The env-side episode loop is :func:`mmrl.adapters.vla.episodes.run_episodes`; this policy supplies
        its ``act`` (:meth:`_act_fn`) and builds the :class:`Rollout` from the episode records."""
        for k, it in enumerate(batch.items):
            self._check_item(it, k)
        G = int(group_size)
        plan = [(i, j) for i in range(len(batch)) for j in range(G)]
        items = [batch.items[i] for i, _ in plan]
        episodes = [
            EpisodeSpec(init_state=int(it["init_state"]), key=init_state_key(it), seed=(batch.seeds[i], j))
            for it, (i, j) in zip(items, plan)
        ]
        pool = self._ensure_pool(len(plan))
        t0 = time.perf_counter()
        self._assign_tasks(pool, [it.get("env_task") for it in items])
        t_assign = time.perf_counter() - t0
        self._set_train_mode(False)
        run = run_episodes(
            pool,
            episodes,
            self._act_fn(items, greedy=greedy),
            max_calls=self.max_policy_calls(),
            init_states=self.init_states,
            record_frames=greedy or self.record_frames,
        )
        run.timing["env"] += t_assign
        return self._build_rollout(batch, plan, items, run)

    def _act_fn(self, items: Sequence[dict], *, greedy: bool) -> Act:
        """The episode loop's ``act``: ONE image-processor call, ONE vision forward and ONE constrained
        ``generate`` for the running episodes, decoded into action chunks."""
        lm = self.module.lm
        keep_features = not self.vision_trainable

        def act(slots: list[int], frames: np.ndarray, seeds: list[int], proprio: np.ndarray | None = None) -> ActOutput:
            prompts = self.observation_prompts(frames, [items[k]["prompt"] for k in slots])
            with torch.no_grad():
                feats = encode_images(lm, prompts, self.device)
            bins, logp = sample_action_tokens(
                lm,
                self._prompt_inputs(prompts, feats),
                seeds=seeds,
                action_ids=self.action_ids,
                num_tokens=self.tokens_per_call,
                pad_id=self.pad_id,
                temperature=self.cfg.temperature,
                top_p=self.cfg.top_p,
                greedy=greedy,
            )
            actions = self.action_tokenizer.decode(self.action_tokenizer.unflatten_chunk(bins.numpy()))  # [N, chunk, D]
            return ActOutput(actions=actions, bins=bins, logp=logp, features=feats if keep_features else None)

        return act

    def _build_rollout(
        self, batch: PromptBatch, plan: list[tuple[int, int]], items: list[dict], run: EpisodeRun
    ) -> Rollout:
        """The ``[B, T]`` tensors, samples, payload and metrics of the recorded episodes."""
        eps = run.records
        n = len(plan)
        tpc = self.logp_columns_per_call
        T_tok = max([e.policy_calls for e in eps] + [1]) * tpc
        old = torch.zeros(n, T_tok)
        mask = torch.zeros(n, T_tok)
        for k, ep in enumerate(eps):
            if ep.policy_calls:
                old[k, : ep.policy_calls * tpc] = torch.stack(ep.logp).reshape(-1)
                mask[k, : ep.policy_calls * tpc] = 1.0
        valid = torch.tensor([ep.valid for ep in eps], dtype=torch.bool)
        samples, payload = self._episode_samples(items, eps, run.image_shape)
        if self._group > 1:
            tok = self.action_tokenizer
            old = group_logp(old, self.cfg.logp_granularity, tok.action_dim, tok.chunk, mask=mask)
            mask = group_mask(mask, self.cfg.logp_granularity, tok.action_dim, tok.chunk).float()
        prompt_index = torch.tensor([i for i, _ in plan], dtype=torch.long)
        return self._first_rollout_check(
            Rollout(
                rollout_logp=old,
                mask=mask,
                group_id=torch.tensor(batch.seeds, dtype=torch.long)[prompt_index],
                prompt_index=prompt_index,
                samples=samples,
                payload=payload,
                valid=valid,
                metrics=self._rollout_metrics(samples, valid, mask, run.timing),
            )
        )

    def _episode_samples(
        self, items: list[dict], eps: list[EpisodeRecord], image_shape: tuple[int, ...] | None
    ) -> tuple[list[dict], dict[str, list]]:
        """Per episode: the sample dict (success, length, failure, ...; frames when recorded) and the payload
        (frames, instruction, vision features and :meth:`_call_payload` of its policy calls)."""
        samples = []
        payload: dict[str, list] = {"frames": [], "instruction": [], "features": []}
        for k, ep in enumerate(eps):
            steps = ep.policy_calls
            frames = np.stack(ep.frames) if steps else np.zeros((0, *image_shape), dtype=np.uint8)
            payload["frames"].append(torch.from_numpy(frames))
            for key, value in self._call_payload(ep.bins).items():
                payload.setdefault(key, []).append(value)
            payload["instruction"].append(items[k]["prompt"])
            payload["features"].append(ep.features if ep.features else None)
            sample = {
                "success": ep.success,
                "valid": ep.valid,
                "length": ep.length,
                "policy_calls": steps,
                "failure": ep.failure,
                "task": items[k].get("task", items[k].get("env_task")),
                "init_state": int(items[k]["init_state"]),
            }
            if ep.last_frame is not None:  # evaluation (greedy or record_frames): keep the frames for videos
                sample["frames"] = np.concatenate([frames, ep.last_frame[None]])
            samples.append(sample)
        return samples, payload

    def _call_payload(self, records: list) -> dict[str, Tensor]:
        """The payload entries of one episode from what ``act`` recorded per call: the sampled bins ``[calls, tpc]``."""
        if not records:
            return {"bins": torch.zeros(0, self.tokens_per_call, dtype=torch.long)}
        return {"bins": torch.stack(records)}

    def _rollout_metrics(self, samples: list[dict], valid: Tensor, mask: Tensor, timing: dict) -> dict[str, float]:
        n = len(samples)
        ok = valid.float()
        n_ok = max(1.0, float(ok.sum()))
        lengths = torch.tensor([s["length"] for s in samples], dtype=torch.float32)
        succ = torch.tensor([s["success"] for s in samples], dtype=torch.float32)
        return {
            "rollout/success_rate": float((succ * ok).sum() / n_ok),
            "rollout/episode_length": float((lengths * ok).sum() / n_ok),
            "rollout/policy_calls": float(mask.shape[1] * self._group / self.logp_columns_per_call),
            "rollout/invalid_frac": 1.0 - float(ok.mean()),
            "count/failed_episodes": float(n - int(ok.sum())),
            "env/steps_per_s": timing["env_steps"] / timing["env"] if timing["env"] > 0 else 0.0,
            "env/init_state_drift": float(self.init_states.drift),
            "time/generation": timing["generation"],
            "time/env": timing["env"],
        }

    # ------------------------------------------------------------------ log-probs
    def _step_forward(
        self,
        frames: Tensor,
        instructions: list[str],
        features: list | None,
        bins: Tensor,
        *,
        temperature: float,
        entropy: bool,
        values: bool,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Token log-probs ``[N, tpc]`` (+ entropy, values) of ``bins`` at N observations."""
        if self.shared_prefix.enabled:
            # identical observations (the G episodes of a group start from one state) become one prompt object, which
            # the shared-prefix forward encodes once (and a trainable vision tower sees once)
            frames = frames.numpy() if isinstance(frames, Tensor) else np.asarray(frames)
            same = first_identical_rows(frames, instructions, features)
            reps = sorted(set(same))
            unique = self.observation_prompts(
                frames[reps],
                [instructions[r] for r in reps],
                features=[features[r] for r in reps] if features is not None else None,
            )
            by_row = dict(zip(reps, unique))
            prompts = [by_row[r] for r in same]
        else:
            prompts = self.observation_prompts(frames, instructions, features=features)
        comps = list(self.action_ids[bins])
        mask = torch.ones(bins.shape, dtype=torch.float32)
        # logits over the action tokens only (the LM head restricted to their rows), not the whole vocabulary
        with restricted_output_vocab(self.module.lm, self.action_ids) as restricted:
            logits, _ids, v = self._completion_forward(prompts, comps, mask, want_values=values)
        act_logits = logits if restricted else logits.index_select(-1, self.action_ids.to(logits.device))
        logp, ent = token_logp_and_entropy(act_logits, bins.to(logits.device), temperature=temperature, entropy=entropy)
        return logp, ent, v

    def log_probs(self, rollout: Rollout, *, entropy: bool = False, values: bool = False) -> LogProbOutput:
        """Re-run every (episode, step) pair of ``rollout`` in one batch and scatter back to ``[b, T]``."""
        pay = rollout.payload
        b = rollout.batch_size
        tpc = self.tokens_per_call
        T_tok = rollout.mask.shape[1] * self._group
        lengths = [int(x.shape[0]) for x in pay["bins"]]
        use_feats = not self.vision_trainable and all(f is not None for f, L in zip(pay["features"], lengths) if L)
        rows = [k for k, L in enumerate(lengths) for _ in range(L)]
        out_logp = torch.zeros(b, T_tok, device=self.device)
        out_ent = torch.zeros(b, T_tok, device=self.device) if entropy else None
        out_val = torch.zeros(b, T_tok, device=self.device) if values else None
        if rows:
            frames = torch.cat([f for f, L in zip(pay["frames"], lengths) if L])
            bins = torch.cat([x for x in pay["bins"] if x.shape[0]])
            instr = [pay["instruction"][k] for k in rows]
            feats = [f for k, L in enumerate(lengths) if L for f in pay["features"][k]] if use_feats else None
            logp, ent, v = self._step_forward(
                frames, instr, feats, bins, temperature=self.cfg.temperature, entropy=entropy, values=values
            )
            step_in_ep = torch.cat([torch.arange(L) for L in lengths if L])
            r = torch.tensor(rows)[:, None].expand(-1, tpc).to(self.device)
            c = (step_in_ep[:, None] * tpc + torch.arange(tpc)[None]).to(self.device)
            out_logp = out_logp.index_put((r, c), logp)
            if entropy:
                out_ent = out_ent.index_put((r, c), ent)
            if values and v is not None:
                out_val = out_val.index_put((r, c), v.float())
        if self._group > 1:
            tok, gran = self.action_tokenizer, self.cfg.logp_granularity
            out_logp = group_logp(out_logp, gran, tok.action_dim, tok.chunk)
            out_ent = group_logp(out_ent, gran, tok.action_dim, tok.chunk) if entropy else None
            out_val = out_val[:, :: self._group] if values else None
        return LogProbOutput(logp=out_logp, entropy=out_ent, values=out_val)

    # ------------------------------------------------------------------ supervised warm start
    def sample_meta(self, items: Sequence[dict]) -> list[dict]:
        """What a task needs to write SFT targets: the action tokenizer and the HF tokenizer."""
        return [{"action_tokenizer": self.action_tokenizer, "tokenizer": self.tokenizer} for _ in items]

    def target_bins(self, target: str) -> Tensor:
        """Bins ``[tpc]`` of an SFT target text (exactly ``tokens_per_call`` action tokens)."""
        ids = self.tokenizer(target, add_special_tokens=False)["input_ids"]
        if len(ids) != self.tokens_per_call:
            raise VLAInputError(
                f"SFT target {target[:60]!r} has {len(ids)} tokens, expected {self.tokens_per_call} "
                "action tokens (chunk x action_dim)"
            )
        return torch.as_tensor(self.action_tokenizer.from_token_ids(np.asarray(ids, dtype=np.int64)))

    def sft_loss(self, batch: PromptBatch, targets: Sequence[str]) -> Tensor:
        """Mean cross-entropy of the expert action tokens given each observation item
        (``{"prompt": instruction, "frame": uint8 [H, W, 3]}``), over the action vocabulary."""
        if len(targets) != len(batch):
            raise ValueError(f"sft_loss: {len(targets)} targets for {len(batch)} items")
        for k, it in enumerate(batch.items):
            if it.get("frame") is None or not isinstance(it.get("prompt"), str):
                raise VLAInputError(f"SFT item {k} needs 'frame' (uint8 [H, W, 3]) and 'prompt' (keys: {sorted(it)})")
        frames = np.stack([np.asarray(it["frame"], dtype=np.uint8) for it in batch.items])
        bins = torch.stack([self.target_bins(t) for t in targets])
        logp, _, _ = self._step_forward(
            frames, [it["prompt"] for it in batch.items], None, bins, temperature=1.0, entropy=False, values=False
        )
        return -logp.mean()

    # ------------------------------------------------------------------ persistence
    def save_pretrained(self, path: str | Path) -> None:
        """The VLM files plus the action statistics (``action_stats.json``) and the initial-state
        fingerprints (``init_states.json``)."""
        super().save_pretrained(path)
        self.action_tokenizer.save(Path(path) / ACTION_STATS_FILE)
        self.init_states.save(Path(path) / INIT_STATES_FILE)

    def load_pretrained(self, path: str | Path) -> None:
        """Load weights and, when present, the saved action statistics and initial-state fingerprints
        (later resets are checked against them)."""
        super().load_pretrained(path)
        stats = Path(path) / ACTION_STATS_FILE
        if stats.exists():
            self.action_tokenizer = ActionTokenizer.load(stats, token_ids=self.action_ids.tolist())
        if (Path(path) / INIT_STATES_FILE).exists():
            self.init_states.load(Path(path) / INIT_STATES_FILE)
