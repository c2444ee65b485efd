"""The run configuration's dataclasses: one per section of a run (``algo``, ``trainer``, ``agent``; ``reward``'s
:class:`~mmrl.rewards.config.RewardConfig` lives with the rewards and is re-exported here) and :class:`RunConfig`,
which holds them with the task's and the model's own config classes.

Every field carries a docstring (the string literal under it), which ``mmrl train --help`` prints
(:mod:`mmrl.config.docstrings`). A section's ``validate()`` checks its own values when it is built from a mapping
(:func:`mmrl.config.coercion.from_dict`); checks against the registries are in :mod:`mmrl.config.validate`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mmrl.errors import ConfigError
from mmrl.models.configs import ModelConfig
from mmrl.rewards.config import RewardConfig
from mmrl.tasks.task_config import TaskConfig

log = logging.getLogger("mmrl.config")  # the package's logger: a warning names mmrl.config, not this module


@dataclass
class TGRPOConfig:
    """T-GRPO settings (Video-R1's temporal contrast; the math is in :mod:`mmrl.algos.tgrpo`)."""

    shuffled_group: int = 0
    """Extra probe samples per video prompt on shuffled temporal patches (Video-R1: G/2); 0 turns T-GRPO off."""
    alpha: float = 0.3
    """Advantage bonus of a correct ordered sample in a granted group (Video-R1: 0.3)."""
    mu: float = 0.8
    """A group is granted when p_ordered >= mu * p_shuffled (Video-R1: 0.8)."""
    correct_reward: str = "accuracy"
    """Name of the task's reward function whose value is the correctness c_i (the reward/<name> metric)."""
    threshold: float = 0.1
    """A sample is correct when c_i > threshold (Video-R1: 0.1)."""

    @property
    def enabled(self) -> bool:
        return self.shuffled_group > 0

    def validate(self) -> None:
        """Raise ConfigError on bad values."""
        import math

        if self.shuffled_group < 0:
            raise ConfigError(f"algo.tgrpo.shuffled_group must be >= 0 (0 disables T-GRPO), got {self.shuffled_group}")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ConfigError(f"algo.tgrpo.alpha must be a finite number >= 0, got {self.alpha}")
        if not (math.isfinite(self.mu) and self.mu >= 0):
            raise ConfigError(f"algo.tgrpo.mu must be a finite number >= 0, got {self.mu}")
        if not math.isfinite(self.threshold):
            raise ConfigError(f"algo.tgrpo.threshold must be finite, got {self.threshold}")
        if not self.correct_reward:
            raise ConfigError("algo.tgrpo.correct_reward must name one of the task's reward functions")


@dataclass
class AlgoConfig:
    """The RL algorithm: advantage estimator, policy loss, KL, filtering, update schedule."""

    name: str = "grpo"
    """Label of the preset this config came from (informational)."""
    advantage: str = "grpo"
    """Advantage estimator: grpo, drgrpo, rloo, reinforce_pp (outcome rewards) or gae (critic)."""
    adv_scale: str = "group"
    """For grpo: divide by the group std ("group"), the batch std ("batch") or not at all ("none")."""
    adv_eps: float = 1e-6
    """Epsilon added to the std when normalising advantages (>= 0; all-equal groups get exactly 0 even with 0)."""
    adv_clip: float | None = None
    """Clip advantages to [-adv_clip, adv_clip] (Flow-GRPO uses 5); None disables."""
    reinforce_baseline: str = "none"
    """For reinforce_pp: subtract the group mean ("group") before batch whitening, or not ("none")."""
    group_size: int = 8
    """Samples per prompt (G)."""
    policy_loss: str = "ppo_clip"
    """Policy loss: ppo_clip (token ratio) or gspo (sequence ratio). Its clip range follows it unless set: ``algo.
    policy_loss=gspo`` alone clips at GSPO's 3e-4 / 4e-4, not PPO's 0.2 (see clip_low)."""
    clip_low: float | None = None
    """Lower clip range: ratios below 1 - clip_low are clipped. None (unset): the policy loss's own value from
    ``mmrl.algos.losses.DEFAULT_CLIP`` (ppo_clip 0.2; gspo 3e-4, the GSPO paper's range for its sequence ratio, on
    which 0.2 would rarely clip), filled in when the config is built, so config.yaml records the number used. A loss
    with no entry there (a plugin's) gets ppo_clip's, with a one-line warning naming it."""
    clip_high: float | None = None
    """Upper clip range: ratios above 1 + clip_high are clipped (DAPO clip-higher: 0.28). None: the policy loss's own
    value, as for clip_low (ppo_clip 0.2, gspo 4e-4); each side is filled on its own."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (e.g. 3); None disables."""
    loss_agg: str = "token_mean"
    """Loss aggregation: token_mean (DAPO), seq_mean_token_mean (GRPO), seq_mean_token_sum_norm (Dr.GRPO)."""
    loss_max_len: int | None = None
    """Constant length for seq_mean_token_sum_norm; None uses the batch's padded length."""
    kl_coef: float = 0.0
    """KL penalty coefficient beta (0 disables the reference forward entirely)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3 (low variance)."""
    kl_in_reward: bool = False
    """Fold -beta * KL into the rewards (PPO-RLHF style) instead of adding it to the loss."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (subtracted from the loss)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    num_minibatches: int = 1
    """Optimizer steps per epoch (the rollout batch is split into this many minibatches)."""
    old_logp: str = "auto"
    """Source of the PPO 'old' log-probs (pi_prox): auto (detached current forward when one epoch and one
    minibatch, else recompute), recompute (a no-grad forward before the update), rollout (the
    rollout engine's own log-probs) or interpolate (AReaL's approximation without a forward: the behaviour log-probs
    moved s / (s + 1) of the way to the current forward's, for a sample s versions stale; docs/async.md)."""
    filter_groups: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal."""
    max_resample: int = 2
    """With filter_groups: at most this many extra rollout rounds to refill the batch."""
    max_staleness: int = 1
    """With ``trainer.rollout=async``: eta, how many learner versions older than the current one the weights that
    sampled a group may be when it trains (0: on-policy, the synchronous run's numbers). A group starts only if it
    will be consumed within eta versions (AReaL's capacity rule; docs/async.md)."""
    truncated_is: bool = False
    """Weight each token's policy loss by pi_prox / pi_behaviour: the PPO anchor (``old_logp``) over the log-probs
    recorded at sampling (a rollout engine's kernels, or older weights in asynchronous mode), capped by ``is_mode``.
    With ``old_logp=recompute`` this is AReaL's decoupled PPO objective (docs/async.md, "The objective")."""
    is_cap: float = 2.0
    """Cap C (> 0) of the importance weights pi_prox / pi_behaviour."""
    is_mode: str = "truncate"
    """How the cap acts, per token: truncate (verl's TIS: the weight is min(ratio, C)) or mask (AReaL: a token whose
    ratio exceeds C is dropped from the policy loss but still counted in its normaliser)."""
    gamma: float = 1.0
    """Discount for GAE."""
    lam: float = 0.95
    """GAE lambda."""
    vf_coef: float = 0.5
    """Value-loss coefficient (critic, GAE only)."""
    value_clip: float | None = 0.2
    """Value clipping range for the critic; None disables."""
    tgrpo: TGRPOConfig | None = None
    """T-GRPO (Video-R1): shuffled-frame probes and a temporal advantage bonus for video prompts; None (off) unless
    set, e.g. ``algo.tgrpo.shuffled_group=4`` (the video task presets include it, off)."""

    @property
    def tgrpo_enabled(self) -> bool:
        """T-GRPO is configured and draws probes."""
        return self.tgrpo is not None and self.tgrpo.enabled

    def __post_init__(self) -> None:
        """Fill an unset clip_low / clip_high with the policy loss's default (``DEFAULT_CLIP``, the one table the loss
        functions' own defaults read), so a run never clips a sequence ratio with a token-ratio range by omission."""
        if self.clip_low is not None and self.clip_high is not None:
            return
        from mmrl.algos import DEFAULT_CLIP, POLICY_LOSSES

        if self.policy_loss in DEFAULT_CLIP:
            low, high = DEFAULT_CLIP[self.policy_loss]
        elif self.policy_loss in POLICY_LOSSES:
            low, high = DEFAULT_CLIP["ppo_clip"]
            log.warning(
                f"algo.policy_loss={self.policy_loss} has no default clip range in mmrl.algos.losses.DEFAULT_CLIP: "
                f"clipping at ppo_clip's {low} / {high}; set algo.clip_low and algo.clip_high to choose"
            )
        else:
            return  # an unknown loss name: validate_algo rejects it with the valid choices
        if self.clip_low is None:
            self.clip_low = low
        if self.clip_high is None:
            self.clip_high = high


@dataclass
class OptimConfig:
    """The optimiser of the RL updates (AdamW) and its learning-rate schedule."""

    lr: float = 1e-4
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 0
    """Linear warm-up steps of the learning rate."""
    lr_schedule: str = "constant"
    """After warm-up: constant, linear (to 0 at trainer.max_steps) or cosine. Warm-up and schedule count RL steps,
    steps that updated nothing (an empty batch, non-finite gradients) included."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clipping; None disables."""


@dataclass
class EvalConfig:
    """When and how the policy is evaluated on the task's held-out items."""

    every: int = 0
    """Evaluate every N steps (0: only at the end when at_end)."""
    at_end: bool = True
    """Run the evaluation once after the last step."""
    at_start: bool = False
    """Evaluate the initial policy before the first RL step (logged at step 0), for a start -> end comparison without
    a warm start (with ``trainer.warm_start.steps > 0`` the warm start already evaluates before and after itself)."""
    before_warm_start: bool = True
    """With ``trainer.warm_start.steps > 0``: also evaluate the untrained policy before the warm start (logged as
    ``sft/eval_score_before``); false skips that evaluation (the one after the warm start always runs)."""
    size: int | None = None
    """Evaluate on at most this many eval items (None: all)."""
    greedy: bool = True
    """Greedy evaluation (argmax decoding / actions); false samples at the policy's temperature, with seeds fixed per
    eval item so every evaluation sees the same noise."""
    samples: int = 1
    """Samples (episodes) per eval item; > 1 needs greedy=false and averages the task metrics over them
    (``trainer.eval.greedy=true`` on the command line without this key sets it to 1)."""


@dataclass
class CheckpointingConfig:
    """Checkpoints of a run, and what happens to an existing run folder (continue it, refuse it, start over)."""

    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints to keep (older complete ones are deleted)."""
    resume: str = "never"
    """never (refuse an existing run dir), auto (newest complete checkpoint of trainer.run_name) or a checkpoint
    path."""
    overwrite: bool = False
    """Start over in an existing run directory: the folder is deleted first, but only if mmrl created it (it holds the
    ``.mmrl_run`` marker); any other folder is refused."""
    resume_accept_changes: bool = False
    """Resume even when the new config differs from the run's saved one in keys that make it another experiment
    (model, task, algorithm, rewards, group size, seed, learning rate ...); without it such a resume stops with the
    differing keys listed. Changes to length, cadence and logging are always accepted (and logged)."""


@dataclass
class LoggingConfig:
    """Where and how often a run reports: metrics, TensorBoard, W&B, the progress bar, plots, sampled completions."""

    every: int = 1
    """Write metrics every N steps."""
    tensorboard: bool = True
    """Write TensorBoard event files in the run directory."""
    wandb: bool = False
    """Log to Weights & Biases (needs `pip install wandb`)."""
    wandb_project: str = "mmrl"
    """W&B project."""
    progress: bool = True
    """Show a progress bar."""
    plot: bool = True
    """Save PNG plots of the reward curve and key metrics at the end."""
    samples_every: int = 0
    """Every this many steps append the step's rollouts (prompt id, group, completion text, total reward and reward per
    function) to samples.jsonl in the run dir, to read what the policy writes; 0 disables."""
    samples_max: int = 16
    """At most this many samples per logged step."""


@dataclass
class LimitsConfig:
    """Failure limits: when a run stops instead of training on broken rewards, data or numbers."""

    reward_error_threshold: float = 0.5
    """Abort when more than this fraction of a reward function's calls failed over the last window."""
    reward_error_window: int = 256
    """Samples over which the reward error rate is measured."""
    data_skip_threshold: float = 0.5
    """Abort when more than this fraction of the data items of a step had to be skipped (bad media)."""
    max_consecutive_nonfinite: int = 5
    """Abort after this many consecutive steps with non-finite loss or gradients (each is skipped)."""


@dataclass
class WarmStartConfig:
    """The supervised warm start on the task's reference answers before RL (SFT -> RL)."""

    steps: int = 0
    """Supervised warm-start steps before RL; 0 disables."""
    lr: float | None = None
    """Learning rate of the warm start (default: trainer.optim.lr)."""
    batch_size: int | None = None
    """Prompts per warm-start step (default: trainer.batch_size)."""
    max_items: int | None = None
    """The warm start uses only the first N items of its data (the task's SFT items, else the training items): a small
    labelled set for SFT and the whole prompt set for RL, so RL meets prompts the warm start did not memorise; None: all."""


@dataclass
class FSDPConfig:
    """Settings of ``trainer.strategy=fsdp2`` (docs/scaling.md)."""

    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (less memory, one more all-gather in backward)."""
    offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in CPU memory (slower; for models that do not fit)."""
    param_dtype: str | None = None
    """Mixed precision: gather and compute parameters in this dtype (``bfloat16``); the sharded master weights and the
    optimizer keep ``model.dtype`` and gradients are reduced in float32. None: compute in ``model.dtype``."""


@dataclass
class TrainerConfig:
    """The training loop: the keys typed most (steps, batches, seed, run name, devices, rollout mode) flat, the rest
    in sections (optimiser, evaluation, checkpoints, logging, failure limits, warm start, FSDP). The flat keys of
    earlier releases are still read, with a notice (:mod:`mmrl.config.deprecated`)."""

    max_steps: int = 100
    """RL steps (one rollout batch each)."""
    batch_size: int = 8
    """Prompts per step (global, across data-parallel processes); samples = batch_size * group_size."""
    grad_accum: int = 1
    """Micro-batches per minibatch (gradient accumulation); exact thanks to global loss normalisers."""
    strategy: str = "ddp"
    """With several processes (``torchrun`` / ``accelerate launch``): ``ddp`` replicates the model on every device;
    ``fsdp2`` shards parameters, gradients and optimizer state (``torch.distributed.fsdp.fully_shard`` per transformer
    block) and writes sharded checkpoints (settings: ``trainer.fsdp``). See docs/scaling.md."""
    seed: int = 0
    """Seed of everything (data order, sampling noise, init)."""
    output_dir: str = "runs"
    """Parent folder of run directories."""
    run_name: str | None = None
    """Run directory name; default '<task>-<timestamp>'."""
    threads: int = 1
    """torch intra-op threads on CPU (1 is fastest on small shared machines); 0 leaves torch's default."""
    device: str = "auto"
    """auto (accelerate's choice), cpu or cuda."""
    rollout: str = "sync"
    """sync: each step samples, scores, then updates. async: rollout workers (spawned processes with their own task,
    policy and rewards) sample groups with published weights while the learner updates, within
    ``algo.max_staleness`` versions (docs/async.md)."""
    rollout_workers: int = 1
    """With ``rollout=async``: rollout worker processes (each holds a copy of the policy)."""
    learner_nice: int = 0
    """With ``rollout=async``: raise the learner's niceness by this much (0 to 19) once its rollout workers have
    started, so that where the learner and the samplers share CPU cores the samplers (the side the learner waits for
    when it is idle) get them first; the learner's update then fills the cores they leave. 0 leaves priorities alone.
    A worker restarted later inherits the learner's niceness (an unprivileged process cannot lower it again)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimiser (AdamW) and learning-rate schedule: ``trainer.optim.lr``, ``trainer.optim.warmup_steps`` ..."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation cadence and method: ``trainer.eval.every``, ``trainer.eval.size``, ``trainer.eval.greedy`` ..."""
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    """Checkpoints and existing run folders: ``trainer.checkpointing.save_every``, ``trainer.checkpointing.resume`` ..."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metrics, trackers, progress bar, plots, logged samples: ``trainer.logging.every``, ``trainer.logging.wandb`` ..."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Failure limits (reward errors, skipped data, non-finite steps) at which a run stops."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Supervised warm start before RL: ``trainer.warm_start.steps`` (0: none), ``trainer.warm_start.lr`` ..."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """``trainer.strategy=fsdp2`` settings: resharding, CPU offload, compute dtype."""


OVER_TURN_MODES: tuple[str, ...] = ("mask", "penalize")


@dataclass
class AgentConfig:
    """Multi-turn tool use (read by ``model.type=vlm_agent``; ignored by the other model types). See docs/agents.md."""

    tools: list[str] = field(default_factory=list)
    """Tools the model may call: built-in names (``zoom``) and your own functions as ``FILE.py:FUNCTION`` or
    ``MODULE:FUNCTION`` (loaded like ``reward.fns``). Each is a plain or async Python function whose JSON schema comes
    from its type hints and docstring (``transformers.utils.get_json_schema``, TRL's convention). Empty: the task's
    own tools (``task=visual_search``: ``[zoom]``); ``[none]``: no tools (a no-tool baseline)."""
    max_turns: int = 4
    """Most policy turns per trajectory. A trajectory that still calls a tool on its last turn is over-turn (it gave
    no final answer): see ``over_turn``."""
    max_tokens: int = 1024
    """Token budget of one trajectory after its prompt: generated tokens plus tool / observation tokens. A turn is cut
    at the budget; an observation that does not fit ends the trajectory (counted in ``agent/over_budget_frac``)."""
    tool_timeout_s: float = 10.0
    """Seconds a tool call may run. A call that takes longer becomes an error message to the model (counted in
    ``count/agent/error_timeout``); the hung call is abandoned, never waited for."""
    over_turn: str = "mask"
    """What trains on an over-turn trajectory (turn limit hit while still calling tools): ``mask`` (Mini-o3: its
    tokens leave the loss, it still counts in its group's reward statistics) or ``penalize`` (it trains, and its
    reward gets ``-over_turn_penalty``)."""
    over_turn_penalty: float = 1.0
    """Magnitude of the reward penalty of an over-turn trajectory with ``over_turn=penalize``."""
    max_tool_chars: int = 2000
    """A tool's text result longer than this is cut (and says so) before it reaches the model."""
    reuse_cache: bool = True
    """Continue each turn from the previous turn's KV cache (Qwen-VL families; earlier text and images are not encoded
    again). False: each turn prefills the whole sequence so far (image features are reused either way)."""
    environment: str | None = None
    """Your own environment as ``FILE.py:NAME`` or ``MODULE:NAME``: a callable ``(item, tools) -> Environment`` (an
    :class:`mmrl.agents.environment.Environment` subclass whose constructor takes those two), called once per
    trajectory. None: the task's environment, else the tool-running default (docs/agents.md)."""

    def validate(self) -> None:
        """ConfigError (one line naming the field) for values that cannot work."""
        import math

        if self.max_turns < 1:
            raise ConfigError(f"agent.max_turns must be >= 1, got {self.max_turns}")
        if self.max_tokens < 1:
            raise ConfigError(f"agent.max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.tool_timeout_s) and self.tool_timeout_s > 0):
            raise ConfigError(f"agent.tool_timeout_s must be a positive number of seconds, got {self.tool_timeout_s}")
        if self.over_turn not in OVER_TURN_MODES:
            raise ConfigError(f"agent.over_turn: {self.over_turn!r} is not valid; choose from mask, penalize")
        if not (math.isfinite(self.over_turn_penalty) and self.over_turn_penalty >= 0):
            raise ConfigError(
                f"agent.over_turn_penalty is a magnitude: give a finite value >= 0, got {self.over_turn_penalty}"
            )
        if self.max_tool_chars < 1:
            raise ConfigError(f"agent.max_tool_chars must be >= 1, got {self.max_tool_chars}")
        if self.environment is not None and ":" not in self.environment:
            raise ConfigError(f"agent.environment: give FILE.py:NAME or MODULE:NAME, got {self.environment!r}")
        if any(not isinstance(t, str) or not t for t in self.tools):
            raise ConfigError(
                f"agent.tools: give tool names or FILE.py:FUNCTION / MODULE:FUNCTION strings, got {self.tools}"
            )


@dataclass
class RunConfig:
    """A whole run: task, model, algorithm and trainer settings."""

    task: TaskConfig
    """The task's own config dataclass (see `mmrl tasks`)."""
    model: ModelConfig
    """The model config dataclass (selected by its `type` field)."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Algorithm settings."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop settings."""
    checkpoint: str | None = None
    """Checkpoint to evaluate (`mmrl eval`) or to initialise the policy from."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """User reward functions (file, module or remote URL) added to or replacing the task's."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """Multi-turn tool use: tools, turn and token limits, over-turn handling (``model.type=vlm_agent``, docs/agents.md)."""
    plugins: list[str] = field(default_factory=list)
    """Modules (``my_pkg.audio``) or ``.py`` files to import before the task and model are looked up: code that
    registers tasks, model types, estimators or losses (:mod:`mmrl.plugins`; installed packages' ``mmrl.plugins``
    entry points load without it). Kept in the run's config.yaml, so ``mmrl eval`` imports them again."""
