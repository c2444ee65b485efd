"""``model.type=vla``'s config: :class:`VLAConfig`, the fields of a vision-language-action policy.

It lives with the adapter that reads it; the model-type registry finds it by name through this package's
``MODEL_TYPES``, so the core never imports it (what the core asks about a VLA model goes through ``MODEL_HOOKS``).
Light: it imports only the core's config bases."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmrl.models.configs import VLMConfig

__all__ = ["VLAConfig", "runtime_overhead_gb"]


@dataclass
class VLAConfig(VLMConfig):
    """``model.type=vla``: a vision-language-action policy, rolled out in simulators through the env pool. Two fields
    pick the policy; the others are grouped below by what they serve.

    - ``architecture`` picks the backbone: ``vlm``, a transformers VLM (Qwen-VL or SmolVLM; ``path`` a preset, hub id
      or folder; the :class:`VLMConfig` fields apply, ``camera_views`` lays out its cameras), or ``smolvla`` /
      ``pi0`` / ``pi05``, a LeRobot checkpoint (SmolVLA, π0, π0.5) whose backbone, flow expert and action statistics
      come from the checkpoint (``camera_map``, ``tokenizer_path``; of the VLM fields, ``lora`` and
      ``freeze_vision_tower`` apply).
    - ``action_head`` picks how the backbone's output becomes a chunk of ``chunk`` actions with a log-prob:

      - ``tokens``: the LM head restricted to ``n_bins`` reserved action tokens per dimension (OpenVLA); sampled
        with ``temperature`` / ``top_p``, the PPO ratio per ``logp_granularity``; the whole chunk is executed and the
        state is not read.
      - ``flow``: a flow-matching action expert attending to the backbone's prefix (π0, SmolVLA): ``expert_*``,
        ``num_steps`` denoising steps, a log-prob per chunk from ``likelihood`` (``noise_*``), the warm start's
        ``time_sampling``. The LeRobot architectures are always this head, with the checkpoint's own expert.
      - ``gaussian``: learned action queries giving the mean and log-std of the whole chunk (OpenVLA-OFT):
        ``expert_*`` for the queries, ``log_std``, ``init_log_std``, ``log_std_min`` / ``log_std_max``.

      ``flow`` and ``gaussian`` share ``n_action_steps`` (actions executed per call), ``head_action_dim`` and the
      state input (``use_state``, ``state_mean`` / ``state_std``), and sample with the HF engine only.
    - Every policy: ``chunk``, the env pool (``num_workers``, ``step_timeout_s``) and ``max_policy_calls``.

    :meth:`validate` refuses, in one line each, the combinations that do not exist (e.g. a LeRobot architecture with
    a head other than flow, ``logp_granularity`` or the vLLM engine with a continuous head). The policies:
    :mod:`mmrl.adapters.vla.policy` (tokens), :mod:`mmrl.adapters.vla.continuous_policy` (flow, gaussian),
    :mod:`mmrl.adapters.vla.lerobot` (the LeRobot architectures); see docs/tasks/vla.md.
    """

    type: str = "vla"
    name: str = "tiny_vla"
    path: str = "tiny_qwen2_5_vl"
    """A VLM preset, HF id or folder; its tokenizer's reserved <|act_i|> tokens (else its last n_bins ids) are the bins."""
    temperature: float = 1.0
    """Sampling temperature over the action bins (SimpleVLA-RL uses 1.6); log-probs use the same temperature."""
    chunk: int = 1
    """Actions per policy call: each call generates chunk * action_dim tokens, executed in the env worker."""
    n_bins: int = 256
    """Uniform bins per action dimension (at most the number of reserved action tokens)."""
    logp_granularity: str = "token"
    """Unit of the PPO ratio: token (one bin), action (sum over action_dim tokens) or chunk (sum over a chunk)."""
    num_workers: int = 2
    """Env-pool worker processes (persistent, created at the first rollout)."""
    step_timeout_s: float = 30.0
    """An env worker that makes no progress for this long is killed and its episodes are masked."""
    max_policy_calls: int | None = None
    """Upper bound on policy calls per episode; None: ceil(env max steps / n_action_steps)."""

    # ---------------------------------------------------------------- the architecture (docs/tasks/vla.md)
    architecture: str = "vlm"
    """vlm: a transformers VLM (``path``: a Qwen-VL / SmolVLM preset, id or folder) with the head of ``action_head``;
    smolvla / pi0 / pi05: LeRobot's SmolVLA, π0 or π0.5 (mmrl.adapters.vla.lerobot; config.json's ``type`` must be
    this), ``path`` a folder written by LeRobot's save_pretrained, a hub id, or ``tiny_smolvla`` / ``tiny_pi0`` /
    ``tiny_pi05`` (a random tiny one built offline for the task's cameras, state and actions). These are flow
    policies (``action_head=flow``) whose own expert, state and action statistics and padded dims come from the
    checkpoint: expert_*, head_action_dim and state_mean / state_std are not used (but by the tiny builds), and
    ``chunk`` must be the checkpoint's chunk_size."""
    camera_map: dict[str, str] = field(default_factory=dict)
    """architecture=smolvla|pi0|pi05: the task's camera (LIBERO: agentview, wrist; the tabletop tasks: image) -> the
    checkpoint's image feature (e.g. ``observation.images.camera1``). Cameras not listed map to LeRobot's LIBERO
    names (agentview and image -> observation.images.image, wrist -> observation.images.image2), else to
    ``observation.images.<camera>``."""
    tokenizer_path: str | None = None
    """architecture=pi0|pi05: a local folder with the checkpoint's tokenizer (π0's PaliGemma tokenizer is a gated hub
    repo, google/paligemma-3b-pt-224). None: the checkpoint folder's own ``tokenizer/`` when it has one, else what its
    pre-processor names (a folder, or a hub id read from the local cache)."""
    camera_views: str = "tiled"
    """architecture=vlm: how the task's camera views reach the VLM: tiled (its frame, the views side by side, as one
    image) or separate (each view its own image in the prompt, in the task's camera order, as multi-camera models
    take them: more image tokens, no seam between the views). One-camera tasks are the same either way."""

    # ---------------------------------------------------------------- continuous action heads (docs/tasks/vla.md)
    action_head: str = "tokens"
    """What turns the backbone's output into actions: tokens (discretised action tokens, OpenVLA), flow (a
    flow-matching action expert cross-attending to the backbone's prefix, pi0 / SmolVLA) or gaussian (learned action
    queries -> the mean and log-std of the whole chunk, OpenVLA-OFT). With flow / gaussian, ``chunk`` is the chunk
    length H; the token-only fields (n_bins, temperature, top_p, logp_granularity) are not used."""
    n_action_steps: int | None = None
    """Actions of each sampled chunk executed in the env before the next policy call (action chunking); the others are
    sampled but add nothing to the log-prob. None: the whole chunk. The tokens head executes its whole chunk (only
    None or ``chunk`` is valid there)."""
    head_action_dim: int | None = None
    """flow / gaussian: action dims the head predicts; dims beyond the env's are padding (sampled, never executed,
    excluded from the log-prob and the warm-start loss). None: the env's action dim."""
    use_state: bool = True
    """flow / gaussian: feed the env's proprioceptive state (obs["proprio"], normalised) to the model, as one projected
    state token appended to the backbone's prefix (pi0's state token). The tokens head never reads the state."""
    state_mean: list[float] | None = None
    """flow / gaussian: per-dim mean of the state normalisation, (state - mean) / std; None: estimated from the
    task's successful demos."""
    state_std: list[float] | None = None
    """flow / gaussian: per-dim std of the state normalisation (values below 1e-3 are raised to it); None: from the
    demos."""
    expert_width: int = 64
    """flow: hidden width of the action expert's tokens (also the gaussian head's query width)."""
    expert_depth: int = 2
    """flow: action-expert layers (self-attention over the chunk, cross-attention to the prefix, MLP); gaussian:
    query layers (1 or 2)."""
    expert_heads: int = 4
    """flow / gaussian: attention heads per layer; must divide expert_width."""
    num_steps: int = 10
    """flow: K denoising steps from noise to the chunk (pi0 uses 10), at rollout and evaluation alike."""
    likelihood: str = "flow_sde"
    """flow: how a sampled chunk gets a log-prob for RL: flow_sde (the reverse SDE at every step but the last, a =
    noise_level), flow_sde_one (the SDE at one random step per chunk, ODE elsewhere: one expert pass per chunk in
    training) or flow_noise (a learned noise head, std in [noise_min_std, noise_max_std], at every step). Greedy
    evaluation always uses the deterministic ODE sampler."""
    noise_level: float = 0.5
    """flow_sde / flow_sde_one: the SDE noise level a (piRL ~0.5); must be > 0 (0 is the ODE, which has no density)."""
    noise_min_std: float = 0.08
    """flow_noise: lower bound of the learned per-step std (piRL: 0.08)."""
    noise_max_std: float = 0.16
    """flow_noise: upper bound of the learned per-step std (piRL: 0.16)."""
    time_sampling: str = "beta"
    """flow warm start: how the flow-matching loss draws t: beta (pi0: 0.999 Beta(1.5, 1) + 0.001, more weight on
    noisy times) or uniform."""
    log_std: str = "learned"
    """gaussian: learned (one log-std parameter per action dim) or state (predicted from each query's features,
    bounded to [log_std_min, log_std_max])."""
    init_log_std: float = -1.0
    """gaussian: initial log-std in the normalised action space ([-1, 1] spans the demos' 1st-99th percentiles)."""
    log_std_min: float = -5.0
    """gaussian, log_std=state: lower bound of the predicted log-std."""
    log_std_max: float = 1.0
    """gaussian, log_std=state: upper bound of the predicted log-std."""

    def validate(self) -> None:
        from mmrl.errors import ConfigError, check_choice

        check_choice(self.logp_granularity, ("token", "action", "chunk"), "model.logp_granularity")
        check_choice(self.action_head, ("tokens", "flow", "gaussian"), "model.action_head")
        check_choice(self.architecture, ("vlm", "smolvla", "pi0", "pi05"), "model.architecture")
        check_choice(self.camera_views, ("tiled", "separate"), "model.camera_views")
        if self.architecture != "vlm":
            if self.action_head != "flow":
                raise ConfigError(
                    f"model.architecture={self.architecture} is a flow-matching policy: set model.action_head=flow"
                )
            if not self.use_state:
                raise ConfigError(
                    f"model.architecture={self.architecture} reads the robot state (its checkpoint's "
                    "'observation.state'): set model.use_state=true"
                )
            if self.camera_views != "tiled":
                raise ConfigError(
                    f"model.camera_views is for model.architecture=vlm ({self.architecture} maps each camera to "
                    "its own image feature: model.camera_map)"
                )
        elif self.camera_map or self.tokenizer_path is not None:
            raise ConfigError(
                "model.camera_map and model.tokenizer_path are for model.architecture=smolvla|pi0|pi05 (a vlm reads "
                "the task's one image with its own processor)"
            )
        if self.tokenizer_path is not None and self.architecture == "smolvla":
            raise ConfigError(
                "model.tokenizer_path is for model.architecture=pi0|pi05 (SmolVLA reads its VLM's tokenizer from the "
                "checkpoint's vlm_model_name)"
            )
        if self.chunk < 1 or not 2 <= self.n_bins <= 256:
            raise ConfigError(f"model.chunk must be >= 1 and model.n_bins in [2, 256], got {self.chunk}, {self.n_bins}")
        if self.num_workers < 1 or self.step_timeout_s <= 0:
            raise ConfigError("model.num_workers must be >= 1 and model.step_timeout_s > 0")
        if self.temperature <= 0:
            raise ConfigError(f"model.temperature must be > 0 for VLA sampling, got {self.temperature}")
        if self.n_action_steps is not None and not 1 <= self.n_action_steps <= self.chunk:
            raise ConfigError(
                f"model.n_action_steps must be in [1, model.chunk={self.chunk}], got {self.n_action_steps}"
            )
        if self.action_head == "tokens":
            if self.n_action_steps not in (None, self.chunk):
                raise ConfigError(
                    "model.n_action_steps < model.chunk needs a continuous head (model.action_head=flow|gaussian): "
                    "the tokens head executes its whole chunk"
                )
            return
        self._validate_continuous()

    def _validate_continuous(self) -> None:
        """The flow / gaussian fields (model.action_head != tokens)."""
        from mmrl.errors import ConfigError, check_choice

        head = f"model.action_head={self.action_head}"
        if self.logp_granularity != "token":
            raise ConfigError(
                f"model.logp_granularity is for the tokens head only; {head} has one log-prob per chunk: unset it"
            )
        if self.rollout_engine != "hf":
            raise ConfigError(f"{head} samples with its own head: model.rollout_engine must be hf")
        check_choice(self.likelihood, ("flow_sde", "flow_sde_one", "flow_noise"), "model.likelihood")
        check_choice(self.time_sampling, ("beta", "uniform"), "model.time_sampling")
        check_choice(self.log_std, ("learned", "state"), "model.log_std")
        if self.head_action_dim is not None and self.head_action_dim < 1:
            raise ConfigError(f"model.head_action_dim must be >= 1 (or null), got {self.head_action_dim}")
        if min(self.expert_width, self.expert_depth, self.expert_heads) < 1 or self.expert_width % self.expert_heads:
            raise ConfigError(
                "model.expert_width, expert_depth and expert_heads must be >= 1 and expert_heads must divide "
                f"expert_width, got {self.expert_width}, {self.expert_depth}, {self.expert_heads}"
            )
        if self.expert_width % 2:
            raise ConfigError(f"model.expert_width must be even (sin/cos time embedding), got {self.expert_width}")
        if self.action_head == "gaussian" and self.expert_depth > 2:
            raise ConfigError(f"model.expert_depth must be 1 or 2 for the gaussian head, got {self.expert_depth}")
        if self.action_head == "flow" and self.num_steps < 2:
            raise ConfigError(
                f"model.num_steps must be >= 2 for the flow head (K = 1 has no density), got {self.num_steps}"
            )
        if self.likelihood != "flow_noise" and not self.noise_level > 0:
            raise ConfigError(
                f"model.noise_level must be > 0 for model.likelihood={self.likelihood}, got {self.noise_level}"
            )
        if not 0 < self.noise_min_std < self.noise_max_std:
            raise ConfigError(
                f"need 0 < model.noise_min_std < model.noise_max_std, got {self.noise_min_std}, {self.noise_max_std}"
            )
        if not self.log_std_min < self.init_log_std < self.log_std_max:
            raise ConfigError(
                f"need model.log_std_min < model.init_log_std < model.log_std_max, got {self.log_std_min}, "
                f"{self.init_log_std}, {self.log_std_max}"
            )
        for name in ("state_mean", "state_std"):
            value = getattr(self, name)
            if value is not None and (not value or not self.use_state):
                raise ConfigError(f"model.{name} must be a non-empty list, and needs model.use_state=true")
        if (self.state_mean is None) != (self.state_std is None) or (
            self.state_mean is not None and len(self.state_mean) != len(self.state_std)
        ):
            raise ConfigError("model.state_mean and model.state_std are set together, with one entry per state dim")


def runtime_overhead_gb(model_cfg: VLAConfig, device: str) -> float | None:
    """The planner's runtime overhead per device (the ``runtime_overhead_gb`` hook of ``MODEL_HOOKS``) for a LeRobot
    architecture, which runs in float32 on an accelerator whatever ``model.dtype`` says: 1 GB there, none on the CPU
    or for a tiny build. None for ``architecture=vlm``: the planner's own rule, by ``model.dtype``."""
    if model_cfg.architecture == "vlm":
        return None
    tiny = f"tiny_{model_cfg.architecture}" in (str(model_cfg.path), str(model_cfg.name))
    return 0.0 if device == "cpu" or tiny else 1.0
