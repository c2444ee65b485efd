"""Continuous-action VLA policy (``model.action_head=flow|gaussian``): π0-style flow expert or OpenVLA-OFT Gaussian.

:class:`ContinuousVLAPolicy` is a :class:`~mmrl.adapters.vla.policy.VLAPolicy` whose actions are continuous chunks:
everything about episodes is inherited (env pool, task switching, initial-state fingerprints, the episode loop
:func:`~mmrl.adapters.vla.episodes.run_episodes`, the Rollout's samples, metrics, evaluation frames), and so are the
prompt building (:meth:`observation_prompts`, one batched image-processor call per policy call), the vision tower,
LoRA and saving of the backbone. What differs:

* **Prefix.** At every policy call the distinct observations of the running episodes (image, instruction, state;
  the G episodes of a group share theirs at the first call) go through ONE backbone forward; the last hidden states
  plus one projected state token (``model.use_state``) are the prefix (:class:`~mmrl.adapters.vla.continuous_heads.
  ContinuousVLAModule`). The head (:mod:`~mmrl.adapters.vla.continuous_heads`) samples one chunk of ``H =
  model.chunk`` normalised actions per episode from it; the first ``n_action_steps`` are executed.
* **Actions.** The head works in the normalised space of the action statistics the token head uses (demos' 1st /
  99th percentiles map to -1 / +1, :meth:`ActionTokenizer.normalise`); the env gets them clipped, mapped back and
  with gripper dims binarised (:meth:`ActionTokenizer.to_env`). The head may predict more dims than the env has
  (``model.head_action_dim``): padding dims are sampled but excluded from every log-prob and loss (``dim_mask``).
* **State.** ``obs["proprio"]`` (shipped by the env pool), normalised as ``(s - mean) / std`` with statistics from
  the demos (``Task.state_stats``) or ``model.state_mean`` / ``state_std``.
* **Rollout tensors.** One action per policy call: ``[B, T = policy calls]``, each the chunk's log-prob (summed over
  the stochastic denoising steps, executed actions and real dims). The payload keeps per episode the frames, the
  normalised states and the head's record (flow: the denoising chain and its stochastic steps; gaussian: the
  unclipped chunk); with a frozen vision tower, the vision features too.
* **Training.** :meth:`log_probs` recomputes the prefix of every distinct observation of the micro-batch WITH
  gradients, then the head's log-prob: gradients reach the backbone, the head, the noise head and the state
  projection. ``values=True`` adds the value head's V(prefix) per chunk (PPO, ``algo.advantage=gae``).
* **Warm start.** :meth:`sft_loss`: flow matching (flow) or L1 (gaussian) on the demo chunks of the task's SFT items
  (``Task.sft_target`` writes them as JSON for a continuous head, :meth:`sample_meta`).

* **KL to the reference** (``algo.kl_coef > 0``): the policy owns its KL (``owns_kl``). :meth:`log_probs` runs the
  frozen reference copy (no gradient) on the same observations and recorded chunks and returns the exact KL of the
  policy's distribution to the reference's: the Gaussian head's chunk Gaussians, or the sum over the chain's
  stochastic steps of the flow head's Gaussian transitions (:meth:`HeadRule.log_prob`). A chunk's log-prob sums
  H x A element densities, so the sampled log-ratio of the chunk (what the trainer's k1/k2/k3 estimators see) leaves
  k3's [-20, 20] clamp after small per-element moves, where the estimate sticks at 19 and passes no gradient; the
  closed form stays finite and differentiable.

Limits: the log-prob counts the first ``n_action_steps`` actions of a chunk even when the episode ended inside the
chunk (those actions changed nothing: zero-mean noise in the gradient, no bias). With LoRA the reference policy
would share the trained heads, so LoRA with a KL reference is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from mmrl.adapters.vla.continuous_heads import ContinuousVLAModule, row_generators
from mmrl.adapters.vla.episodes import Act, ActOutput
from mmrl.adapters.vla.errors import VLAInputError
from mmrl.adapters.vla.flow_chain import executed_steps_mask
from mmrl.adapters.vla.heads import head_rule
from mmrl.adapters.vla.policy import VLAEnvSpec, VLAPolicy, first_identical_rows
from mmrl.adapters.vla.value_head import ValueHead
from mmrl.policies.base import FrozenCopyReference, LogProbOutput, PromptBatch, Rollout
from mmrl.policies.vlm import PromptInputs, encode_images
from mmrl.rollout.noise import mix_seed

__all__ = ["HEAD_FILE", "HEAD_META_FILE", "STATE_STD_FLOOR", "ContinuousVLAPolicy"]

HEAD_FILE = "action_head.safetensors"
"""The action head, noise head and state projection, saved next to the backbone's weights."""
HEAD_META_FILE = "action_head.json"
"""The head kind, its dims and the state statistics, saved next to the weights."""
STATE_STD_FLOOR = 1e-3
"""State dims whose std is below this are divided by it instead (constant dims stay finite)."""


class ContinuousVLAPolicy(VLAPolicy):
    """A VLA policy whose actions are continuous chunks from a flow expert or a Gaussian head; see the module docstring.

    Args: as :class:`~mmrl.adapters.vla.policy.VLAPolicy`; ``action_stats`` may carry ``"state": {"mean", "std"}``
    (the task's demo statistics), used unless ``model.state_mean`` / ``state_std`` are set.
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
        if reference and cfg.lora.enabled:
            raise VLAInputError(
                f"model.action_head={cfg.action_head} with model.lora.enabled=true has no KL reference (the LoRA-off "
                "model would keep the trained action head): set algo.kl_coef=0 or model.lora.enabled=false"
            )
        super().__init__(
            lm, processor, cfg, action_stats, env_spec, min_envs=min_envs, check_init_states=check_init_states
        )
        self._init_head(int(cfg.head_action_dim or env_spec.action_dim))
        self.state_stats = self._state_stats(action_stats.get("state")) if cfg.use_state else None
        """``{"mean": [S], "std": [S]}`` of the state normalisation, or None when the state is not read."""
        lm = self.module.lm
        width = int(self._text_config().hidden_size)
        head, noise_head = self.rule.build(width, self.head_action_dim)
        state_proj = nn.Linear(len(self.state_stats["mean"]), width) if self.state_stats else None
        module = ContinuousVLAModule(
            lm,
            head,
            noise_head=noise_head,
            value_head=ValueHead(width) if value_head else None,
            state_proj=state_proj,
        )
        module.head_modules().to(self.device)
        if module.value_head is not None:
            module.value_head.to(self.device)
        self.model = module
        self._frozen_ref = FrozenCopyReference(self) if reference else None

    def _init_head(self, head_action_dim: int) -> None:
        """The head rule and the action-dim mask (what every continuous policy sets up, whatever its backbone)."""
        self.rule = head_rule(self.cfg)
        """What the head does with a prefix (:class:`~mmrl.adapters.vla.continuous_heads.HeadRule`)."""
        env_dim = int(self.env_spec.action_dim)
        self.head_action_dim = int(head_action_dim)
        if self.head_action_dim < env_dim:
            raise VLAInputError(
                f"the head predicts {self.head_action_dim} action dims (model.head_action_dim, or a checkpoint's "
                f"max_action_dim), fewer than the env's {env_dim}"
            )
        self.dim_mask = torch.arange(self.head_action_dim) < env_dim
        """``[A]`` True for the env's real action dims (the rest are padding)."""

    def _state_stats(self, from_task: dict | None) -> dict[str, list[float]]:
        """The state normalisation: ``model.state_mean`` / ``state_std`` when set, else the task's demo statistics."""
        cfg = self.cfg
        stats = {"mean": cfg.state_mean, "std": cfg.state_std} if cfg.state_mean is not None else from_task
        if not stats or not stats.get("mean"):
            raise VLAInputError(
                "model.use_state=true needs state statistics: the task's demos record no proprioceptive state; set "
                "model.state_mean and model.state_std, or model.use_state=false"
            )
        mean = [float(x) for x in stats["mean"]]
        std = [max(float(x), STATE_STD_FLOOR) for x in stats["std"]]
        if len(mean) != len(std):
            raise VLAInputError(f"state statistics have {len(mean)} means and {len(std)} stds")
        return {"mean": mean, "std": std}

    # ------------------------------------------------------------------ shapes
    @property
    def logp_columns_per_call(self) -> int:
        """One log-prob per policy call (the chunk's)."""
        return 1

    @property
    def _group(self) -> int:
        """The chunk's log-prob is one column already: nothing to group."""
        return 1

    @property
    def _reads_state(self) -> bool:
        """The policy conditions on the robot state (its payload then keeps each call's ``state``)."""
        return self.state_stats is not None

    # ------------------------------------------------------------------ backbone hooks (a SmolVLA policy overrides)
    def _state_input(self, proprio: np.ndarray | None, rows: int) -> Tensor | None:
        """What the prefix gets of the env's ``proprio [rows, S]``: the normalised state (:meth:`normalised_state`)."""
        return self.normalised_state(proprio, rows)

    def _rollout_features(self, prompts: list[PromptInputs]) -> list | None:
        """Vision features of the distinct observations at rollout (kept in the payload with a frozen tower)."""
        return encode_images(self.module.lm, prompts, self.device)

    def _to_env(self, chunk: np.ndarray) -> np.ndarray:
        """What the env executes for the head's ``[N, n, env_dim]`` actions (clipped, unnormalised, binarised)."""
        return self.action_tokenizer.to_env(chunk)

    def _normalise_actions(self, chunk: np.ndarray) -> Tensor:
        """Env actions ``[H, env_dim]`` in the head's normalised space (float32)."""
        return torch.from_numpy(self.action_tokenizer.normalise(chunk)).to(torch.float32)

    def _exec_mask(self, rows: int) -> Tensor:
        """``[rows, H]`` True for the executed actions of each chunk (the first ``actions_per_call``)."""
        return executed_steps_mask(self.actions_per_call, rows, self.cfg.chunk).to(self.device)

    def normalised_state(self, proprio: np.ndarray | None, rows: int) -> Tensor | None:
        """``[rows, S]`` float32 normalised states from the env's ``proprio [rows, S]`` (None when not read)."""
        if self.state_stats is None:
            return None
        if proprio is None:
            raise VLAInputError(
                f"model.use_state=true but env {self.env_spec.env_name} gives no 'proprio' observation; set "
                "model.use_state=false"
            )
        p = np.asarray(proprio, dtype=np.float64).reshape(rows, -1)
        mean, std = np.asarray(self.state_stats["mean"]), np.asarray(self.state_stats["std"])
        if p.shape[1] != mean.size:
            raise VLAInputError(f"the env's proprio has {p.shape[1]} dims, the state statistics {mean.size}")
        return torch.from_numpy((p - mean) / std).to(torch.float32)

    # ------------------------------------------------------------------ the prefix
    @staticmethod
    def _distinct_rows(
        frames: np.ndarray, instructions: Sequence[str], features: Sequence[Any] | None, states: Tensor | None
    ) -> tuple[np.ndarray, list[int], Tensor]:
        """The frames as numpy, the first row of each distinct observation and the observation of each row ``[N]``."""
        frames = frames.numpy() if isinstance(frames, Tensor) else np.asarray(frames)
        same = first_identical_rows(frames, instructions, features, None if states is None else states.numpy())
        reps = sorted(set(same))
        where = {r: u for u, r in enumerate(reps)}
        return frames, reps, torch.tensor([where[r] for r in same], dtype=torch.long)

    def _distinct_observations(
        self, frames: np.ndarray, instructions: Sequence[str], features: Sequence[Any] | None, states: Tensor | None
    ) -> tuple[list[PromptInputs], Tensor, Tensor | None]:
        """The prompts of the distinct observations, the observation of each row ``[N]`` and the distinct states."""
        frames, reps, index = self._distinct_rows(frames, instructions, features, states)
        prompts = self.observation_prompts(
            frames[reps],
            [instructions[r] for r in reps],
            features=[features[r] for r in reps] if features is not None else None,
        )
        return prompts, index, (states[reps] if states is not None else None)

    def _prefix_forward(self, prompts: list[PromptInputs], feats, states: Tensor | None, run) -> Any:
        """One backbone forward over ``prompts`` (vision ``feats`` given, or from :meth:`_features`) and ``run`` on
        its prefix: through the trainable (possibly wrapped) model with gradients, the bare module without."""
        grad = torch.is_grad_enabled()
        if feats is None:
            feats = self._features(prompts)
        inputs = self._prompt_inputs(prompts, feats)
        self._set_train_mode(grad)
        target = self.model if grad else self.module
        return target(run=run, state=None if states is None else states.to(self.device), **inputs)

    # ------------------------------------------------------------------ rollout
    def _act_fn(self, items: Sequence[dict], *, greedy: bool) -> Act:
        """The episode loop's ``act``: ONE image-processor call, ONE vision forward and ONE backbone forward over the
        distinct observations, then the head samples one chunk per running episode."""
        keep_features = not self.vision_trainable
        env_dim = int(self.env_spec.action_dim)

        def act(slots: list[int], frames: np.ndarray, seeds: list[int], proprio: np.ndarray | None = None):
            instructions = [items[k]["prompt"] for k in slots]
            states = self._state_input(proprio, len(slots))
            prompts, index, unique_states = self._distinct_observations(frames, instructions, None, states)
            exec_mask = self._exec_mask(len(slots))
            dim_mask = self.dim_mask.to(self.device)

            def run(module, hidden, mask):
                return self.rule.sample(
                    module, hidden, mask, index, seeds, greedy=greedy, exec_mask=exec_mask, dim_mask=dim_mask
                )

            with torch.no_grad():
                feats = self._rollout_features(prompts)
                actions, logp, record = self._prefix_forward(prompts, feats, unique_states, run)
            chunk = actions[:, : self.actions_per_call, :env_dim].cpu().numpy()
            rows = [{k: v[n] for k, v in record.items()} for n in range(len(slots))]
            if states is not None:
                for n, row in enumerate(rows):
                    row["state"] = states[n]
            features = [feats[int(u)] for u in index] if keep_features and feats is not None else None
            return ActOutput(actions=self._to_env(chunk), bins=rows, logp=list(logp.cpu()), features=features)

        return act

    def _call_payload(self, records: list) -> dict[str, Tensor | None]:
        """The records of one episode's calls stacked per key (the head rule's ``record_keys``: flow ``chain [K + 1,
        H, A]`` and ``stochastic [K]``, gaussian the unclipped ``actions [H, A]``; plus the normalised
        ``state [calls, S]`` when read); None for an episode without calls."""
        keys = self.rule.record_keys + (("state",) if self._reads_state else ())
        if not records:
            return {k: None for k in keys}
        return {k: torch.stack([r[k] for r in records]) for k in keys}

    def _first_rollout_check(self, rollout: Rollout) -> Rollout:
        """No shared-prefix self-check: this policy's forwards never pack completions after a prompt."""
        return rollout

    # ------------------------------------------------------------------ log-probs
    kl_in_loss: bool = True
    """False with ``algo.kl_in_reward`` (the trainer's estimator then shapes the reward; no KL in the loss)."""

    @property
    def owns_kl(self) -> bool:
        """True with a KL reference (``algo.kl_coef > 0``) and the KL in the loss: :meth:`log_probs` returns the exact
        KL to the reference in ``LogProbOutput.kl`` (see the module docstring), and the trainer runs no reference
        pass of its own."""
        return self._frozen_ref is not None and self.kl_in_loss

    def log_probs(self, rollout: Rollout, *, entropy: bool = False, values: bool = False) -> LogProbOutput:
        """Recompute every (episode, call) of ``rollout``: one backbone forward over the distinct observations (with
        gradients), the head's log-prob of each recorded chunk, scattered to ``[b, T]``. With gradients on and
        :attr:`owns_kl`, also the reference's forward (no gradient) and the exact KL of each chunk's distribution to
        the reference's (``LogProbOutput.kl``)."""
        pay = rollout.payload
        b, T = rollout.batch_size, rollout.mask.shape[1]
        lengths = [int(f.shape[0]) for f in pay["frames"]]
        out_logp = torch.zeros(b, T, device=self.device)
        out_ent = torch.zeros(b, T, device=self.device) if entropy and self.rule.has_entropy else None
        out_val = torch.zeros(b, T, device=self.device) if values else None
        want_kl = self.owns_kl and torch.is_grad_enabled() and self.module is not self._frozen_ref.frozen
        out_kl = torch.zeros(b, T, device=self.device) if want_kl else None
        rows = [k for k, L in enumerate(lengths) for _ in range(L)]
        if not rows:
            return LogProbOutput(logp=out_logp, entropy=out_ent, values=out_val, kl=out_kl)
        live = [k for k, L in enumerate(lengths) if L]
        frames = torch.cat([pay["frames"][k] for k in live])
        use_feats = not self.vision_trainable and all(pay["features"][k] is not None for k in live)
        feats = [f for k in live for f in pay["features"][k]] if use_feats else None
        states = torch.cat([pay["state"][k] for k in live]) if self._reads_state else None
        record = {key: torch.cat([pay[key][k] for k in live]) for key in self.rule.record_keys}
        prompts, index, unique_states = self._distinct_observations(
            frames, [pay["instruction"][k] for k in rows], feats, states
        )
        exec_mask, dim_mask = self._exec_mask(len(rows)), self.dim_mask.to(self.device)
        reference = None
        if want_kl:

            def run_reference(module, hidden, mask):
                return self.rule.distribution(
                    module, hidden, mask, index, record, exec_mask=exec_mask, dim_mask=dim_mask
                )

            with torch.no_grad(), self._frozen_ref.swap():
                reference = self._prefix_forward(prompts, None, unique_states, run_reference)

        def run(module, hidden, mask):
            logp, ent, kl = self.rule.log_prob(
                module,
                hidden,
                mask,
                index,
                record,
                exec_mask=exec_mask,
                dim_mask=dim_mask,
                entropy=entropy,
                reference=reference,
            )
            v = module.value(hidden, mask).index_select(0, index.to(mask.device)) if values else None
            return logp, ent, v, kl

        logp, ent, v, kl = self._prefix_forward(prompts, None, unique_states, run)
        r = torch.tensor(rows, device=self.device)
        c = torch.cat([torch.arange(L) for L in lengths if L]).to(self.device)
        out_logp = out_logp.index_put((r, c), logp)
        if out_ent is not None:
            out_ent = out_ent.index_put((r, c), ent)
        if out_val is not None:
            out_val = out_val.index_put((r, c), v)
        if out_kl is not None:
            out_kl = out_kl.index_put((r, c), kl)
        return LogProbOutput(logp=out_logp, entropy=out_ent, values=out_val, kl=out_kl)

    # ------------------------------------------------------------------ supervised warm start
    def sample_meta(self, items: Sequence[dict]) -> list[dict]:
        """``continuous``: the task writes SFT targets as JSON action chunks (:meth:`VLATask.sft_target`)."""
        return [{"continuous": True, "action_head": self.cfg.action_head} for _ in items]

    def target_chunk(self, target: str) -> Tensor:
        """The normalised ``[H, A]`` chunk (padding dims 0) of an SFT target: a JSON list of H env actions."""
        try:
            chunk = np.asarray(json.loads(target), dtype=np.float64)
        except (ValueError, TypeError) as e:
            raise VLAInputError(f"SFT target {str(target)[:60]!r} is not a JSON action chunk ({e})") from None
        env_dim = int(self.env_spec.action_dim)
        if chunk.shape != (self.cfg.chunk, env_dim):
            raise VLAInputError(
                f"SFT target chunk has shape {chunk.shape}, expected (model.chunk={self.cfg.chunk}, {env_dim})"
            )
        out = torch.zeros(self.cfg.chunk, self.head_action_dim)
        out[:, :env_dim] = self._normalise_actions(chunk)
        return out

    def sft_loss(self, batch: PromptBatch, targets: Sequence[str]) -> Tensor:
        """Flow-matching (flow) or L1 (gaussian) loss of the demo chunks ``targets`` given each observation item
        (``{"prompt", "frame": uint8 [H, W, 3], "proprio": [S]}``); noise and times from the items' seeds."""
        if len(targets) != len(batch):
            raise ValueError(f"sft_loss: {len(targets)} targets for {len(batch)} items")
        for k, it in enumerate(batch.items):
            if it.get("frame") is None or not isinstance(it.get("prompt"), str):
                raise VLAInputError(f"SFT item {k} needs 'frame' (uint8 [H, W, 3]) and 'prompt' (keys: {sorted(it)})")
            if self._reads_state and it.get("proprio") is None:
                raise VLAInputError(f"SFT item {k} has no 'proprio' (the policy reads the robot state)")
        frames = np.stack([np.asarray(it["frame"], dtype=np.uint8) for it in batch.items])
        states = None
        if self._reads_state:
            states = self._state_input(np.stack([it["proprio"] for it in batch.items]), len(batch))
        actions = torch.stack([self.target_chunk(t) for t in targets]).to(self.device)
        prompts, index, unique_states = self._distinct_observations(
            frames, [it["prompt"] for it in batch.items], None, states
        )
        generator = row_generators([mix_seed(*batch.seeds, 0x5F7)])[0]
        dim_mask = self.dim_mask.to(self.device)

        def run(module, hidden, mask):
            return self.rule.sft_loss(module, hidden, mask, index, actions, dim_mask=dim_mask, generator=generator)

        return self._prefix_forward(prompts, None, unique_states, run)

    # ------------------------------------------------------------------ persistence
    def _head_meta(self) -> dict:
        return {
            "action_head": self.cfg.action_head,
            "head_action_dim": self.head_action_dim,
            "chunk": self.cfg.chunk,
            "state_stats": self.state_stats,
        }

    def save_pretrained(self, path: str | Path) -> None:
        """The VLA files (backbone, processor, value head, action statistics, initial states) plus the heads
        (``action_head.safetensors``) and the head kind, dims and state statistics (``action_head.json``)."""
        from safetensors.torch import save_file

        super().save_pretrained(path)
        state = {k: v.detach().contiguous().cpu() for k, v in self.module.head_modules().state_dict().items()}
        save_file(state, str(Path(path) / HEAD_FILE))
        (Path(path) / HEAD_META_FILE).write_text(json.dumps(self._head_meta(), indent=1))

    def load_pretrained(self, path: str | Path) -> None:
        """Load what :meth:`save_pretrained` wrote; a folder of another head kind or shape is a
        :class:`~mmrl.checkpoint_files.CheckpointMismatchError`. A folder without heads (a token-head or plain VLM
        checkpoint) loads the backbone only, keeping the freshly initialised heads."""
        from mmrl.checkpoint_files import CheckpointMismatchError, load_state_checked, read_json, read_safetensors

        super().load_pretrained(path)
        meta_file, head_file = Path(path) / HEAD_META_FILE, Path(path) / HEAD_FILE
        if not head_file.exists():
            return
        meta = read_json(meta_file) if meta_file.exists() else {}
        if meta.get("action_head", self.cfg.action_head) != self.cfg.action_head:
            raise CheckpointMismatchError(
                meta_file, f"it holds a {meta['action_head']} head, model.action_head={self.cfg.action_head}"
            )
        load_state_checked(self.module.head_modules(), read_safetensors(head_file), head_file)
        if meta.get("state_stats") and self.state_stats is not None:
            self.state_stats = {k: [float(x) for x in v] for k, v in meta["state_stats"].items()}
