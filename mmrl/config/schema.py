"""Typed run configuration, composed with Hydra from the packaged ``configs/`` folder.

The YAML groups (``task/``, ``model/``, ``algo/``, ``trainer/``) are composed by Hydra, then validated
into the dataclasses below; every field carries a docstring (shown by ``mmrl train --help``). An
unknown key or group option raises :class:`ConfigError` naming the bad key and the valid choices; so does a value of
the wrong type for its field (every value is checked against its annotation before anything reads it), and an
override whose value the override grammar cannot read, with the quoted form to type instead
(``'trainer.run_name="café"'``).
"""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import functools
import inspect
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmrl.errors import ConfigError, check_choice, suggest  # noqa: F401  (ConfigError, check_choice: re-exported)

CONFIG_GROUPS = ("task", "model", "algo", "trainer")


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
    """Source of the PPO 'old' log-probs: auto (detached current forward when one epoch and one
    minibatch, else recompute), recompute (a no-grad forward before the update) or rollout (the
    rollout engine's own log-probs)."""
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
            import logging

            logging.getLogger(__name__).warning(
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
class TrainerConfig:
    """The training loop: steps, batches, optimiser, logging, checkpoints, failure limits."""

    max_steps: int = 100
    """RL steps (one rollout batch each)."""
    batch_size: int = 8
    """Prompts per step (global, across data-parallel processes); samples = batch_size * group_size."""
    grad_accum: int = 1
    """Micro-batches per minibatch (gradient accumulation); exact thanks to global loss normalisers."""
    strategy: str = "ddp"
    """With several processes (``torchrun`` / ``accelerate launch``): ``ddp`` replicates the model on every device;
    ``fsdp2`` shards parameters, gradients and optimizer state (``torch.distributed.fsdp.fully_shard`` per transformer
    block) and writes sharded checkpoints. See docs/scaling.md."""
    fsdp_reshard_after_forward: bool = True
    """fsdp2: free each block's gathered parameters after its forward (less memory, one more all-gather in backward)."""
    fsdp_offload: bool = False
    """fsdp2: keep sharded parameters, gradients and optimizer state in CPU memory (slower; for models that do not fit)."""
    fsdp_param_dtype: str | None = None
    """fsdp2 mixed precision: gather and compute parameters in this dtype (``bfloat16``); the sharded master weights
    and the optimizer keep ``model.dtype`` and gradients are reduced in float32. None: compute in ``model.dtype``."""
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
    """After warm-up: constant, linear (to 0 at max_steps) or cosine. Warm-up and schedule count RL steps, steps that
    updated nothing (an empty batch, non-finite gradients) included."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clipping; None disables."""
    seed: int = 0
    """Seed of everything (data order, sampling noise, init)."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end when eval_at_end)."""
    eval_at_end: bool = True
    """Run the evaluation once after the last step."""
    eval_at_start: bool = False
    """Evaluate the initial policy before the first RL step (logged at step 0), for a start -> end comparison without
    a warm start (with ``sft_steps > 0`` the warm start already evaluates before and after itself)."""
    eval_before_warm_start: bool = True
    """With ``sft_steps > 0``: also evaluate the untrained policy before the warm start (logged as
    ``sft/eval_score_before``); false skips that evaluation (the one after the warm start always runs)."""
    eval_size: int | None = None
    """Evaluate on at most this many eval items (None: all)."""
    eval_greedy: bool = True
    """Greedy evaluation (argmax decoding / actions); false samples at the policy's temperature, with seeds fixed per
    eval item so every evaluation sees the same noise."""
    eval_samples: int = 1
    """Samples (episodes) per eval item; > 1 needs eval_greedy=false and averages the task metrics over them
    (`trainer.eval_greedy=true` on the command line without this key sets it to 1)."""
    save_every: int = 0
    """Checkpoint every N steps (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints to keep (older complete ones are deleted)."""
    output_dir: str = "runs"
    """Parent folder of run directories."""
    run_name: str | None = None
    """Run directory name; default '<task>-<timestamp>'."""
    resume: str = "never"
    """never (refuse an existing run dir), auto (newest complete checkpoint of run_name) or a checkpoint path."""
    overwrite: bool = False
    """Start over in an existing run directory: the folder is deleted first, but only if mmrl created it (it holds the
    ``.mmrl_run`` marker); any other folder is refused."""
    resume_accept_changes: bool = False
    """Resume even when the new config differs from the run's saved one in keys that make it another experiment
    (model, task, algorithm, rewards, group size, seed, learning rate ...); without it such a resume stops with the
    differing keys listed. Changes to length, cadence and logging are always accepted (and logged)."""
    log_every: int = 1
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
    threads: int = 1
    """torch intra-op threads on CPU (1 is fastest on small shared machines); 0 leaves torch's default."""
    device: str = "auto"
    """auto (accelerate's choice), cpu or cuda."""
    reward_error_threshold: float = 0.5
    """Abort when more than this fraction of a reward function's calls failed over the last window."""
    reward_error_window: int = 256
    """Samples over which the reward error rate is measured."""
    data_skip_threshold: float = 0.5
    """Abort when more than this fraction of the data items of a step had to be skipped (bad media)."""
    max_consecutive_nonfinite: int = 5
    """Abort after this many consecutive steps with non-finite loss or gradients (each is skipped)."""
    sft_steps: int = 0
    """Supervised warm-start steps on the task's reference answers before RL (SFT -> RL); 0 disables."""
    sft_lr: float | None = None
    """Learning rate of the warm start (default: trainer.lr)."""
    sft_batch_size: int | None = None
    """Prompts per warm-start step (default: trainer.batch_size)."""
    sft_max_items: int | None = None
    """The warm start uses only the first N items of its data (the task's SFT items, else the training items): a small
    labelled set for SFT and the whole prompt set for RL, so RL meets prompts the warm start did not memorise; None: all."""
    log_samples_every: int = 0
    """Every this many steps append the step's rollouts (prompt id, group, completion text, total reward and reward per
    function) to samples.jsonl in the run dir, to read what the policy writes; 0 disables."""
    log_samples_max: int = 16
    """At most this many samples per logged step."""
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


@dataclass
class RewardConfig:
    """Reward functions given by the user, next to or instead of the task's own (docs/rewards.md)."""

    fns: list[str] = field(default_factory=list)
    """User rewards: FILE.py:FUNCTION (path relative to the working directory), MODULE:FUNCTION, or an http(s)://
    URL scoring batches remotely, e.g. 'reward.fns=[my_rewards.py:short_answer]'."""
    weights: list[float] = field(default_factory=list)
    """Weight of each entry of reward.fns, in order; empty: 1.0 each."""
    fn_kwargs: list[dict[str, Any] | None] = field(default_factory=list)
    """Arguments of each entry of reward.fns, in order ({} or null: none); empty: none for any. A factory (a callable
    without prompts / completions / completion_ids / **kwargs, e.g. trl.rewards:get_soft_overlong_punishment) is called
    once with them and returns the reward; a reward function gets them as fixed keyword arguments of every call. E.g.
    'reward.fn_kwargs=[{max_completion_len:64,soft_punish_cache:16}]'."""
    completion_format: str = "auto"
    """How user functions get the completions: text (strings), conversational ([{role: assistant, content: text}], as
    TRL's chat rewards such as think_format_reward expect; plain-text prompts then come as [{role: user, content:
    prompt}]) or auto (conversational when the task's prompts are conversational, as TRL decides; text otherwise)."""
    columns: dict[str, str] = field(default_factory=dict)
    """Extra names for the task's reward columns, passed to user functions too: {solution: answer} gives a function's
    'solution' parameter (TRL's accuracy rewards) the task's 'answer' column."""
    mode: str = "add"
    """add (the user's rewards next to the task's own) or replace (only the user's rewards)."""
    timeout_s: float = 30.0
    """Remote rewards: seconds one HTTP request may take before it is abandoned (then retried)."""
    max_retries: int = 2
    """Remote rewards: extra attempts after a failed request (timeout, connection error, HTTP 5xx/429), with backoff."""
    max_concurrency: int = 4
    """Remote rewards: at most this many requests in flight at once."""
    batch_size: int = 64
    """Remote rewards: samples per request (a step's batch is split into chunks of this size)."""

    def validate(self) -> None:
        """Raise ConfigError on bad values (the specs themselves are resolved when the trainer is built)."""
        import math

        check_choice(self.mode, ("add", "replace"), "reward.mode")
        if self.weights and len(self.weights) != len(self.fns):
            raise ConfigError(
                f"reward.weights has {len(self.weights)} values for {len(self.fns)} reward.fns; "
                "give one weight per function, or none (1.0 each)"
            )
        if any(not math.isfinite(w) for w in self.weights):
            raise ConfigError(f"reward.weights must be finite numbers, got {self.weights}")
        if self.mode == "replace" and not self.fns:
            raise ConfigError("reward.mode=replace needs at least one function in reward.fns")
        if self.fn_kwargs and len(self.fn_kwargs) != len(self.fns):
            raise ConfigError(
                f"reward.fn_kwargs has {len(self.fn_kwargs)} entries for {len(self.fns)} reward.fns; "
                "give one per function, in order ({} or null for one without arguments), or none"
            )
        check_choice(self.completion_format, ("auto", "text", "conversational"), "reward.completion_format")
        bad = {k: v for k, v in self.columns.items() if not (isinstance(v, str) and str(k).isidentifier())}
        if bad:
            raise ConfigError(
                f"reward.columns maps argument names to task columns, e.g. {{solution: answer}}; got {bad}"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError(f"reward.timeout_s must be a positive number of seconds, got {self.timeout_s}")
        if self.max_retries < 0 or self.max_concurrency < 1 or self.batch_size < 1:
            raise ConfigError("reward.max_retries must be >= 0, reward.max_concurrency and reward.batch_size >= 1")


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

    task: Any
    """The task's own config dataclass (see `mmrl tasks`)."""
    model: Any
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


# ---------------------------------------------------------------- field docs


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field) of a dataclass and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in zip(body, body[1:]):
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def describe_fields(cls: type, prefix: str) -> list[str]:
    """Lines `prefix.field (type, default): doc` for --help."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else "<required>")
        )
        if dataclasses.is_dataclass(default):
            continue
        tname = getattr(hints[f.name], "__name__", str(hints[f.name])).replace("typing.", "")
        lines.append(f"  {prefix}.{f.name} ({tname}, default {default!r}): {docs.get(f.name, '')}")
    return lines


# ---------------------------------------------------------------- validation


_OVERRIDE_TEXT: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("mmrl_override_text", default={})  # noqa: B039 - never mutated, only replaced
"""``{key: text}`` of the command-line overrides being validated whose value the override grammar read as a number:
a ``str`` field keeps the text as typed (``trainer.run_name=1.10`` is ``'1.10'``, not ``'1.1'``)."""


def _show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages stay one short line whatever the user passed."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def _describe(tp: Any) -> str:
    """What a value of type annotation ``tp`` looks like, in words (``'an integer or null'``), for error messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        kinds = [_describe(a) for a in args if a is not type(None)]
        return " or ".join(kinds + (["null"] if type(None) in args else []))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)} values"
    if origin in (list, tuple):
        return f"a list ({_describe(args[0])} each)" if args and args[0] is not Any else "a list"
    if origin is dict or tp is dict:
        return "a mapping {key: value, ...}"
    if dataclasses.is_dataclass(tp):
        return f"a mapping of {tp.__name__} fields"
    words = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    return words.get(tp, getattr(tp, "__name__", str(tp)))


def _wrong(value: Any, tp: Any, where: str) -> ConfigError:
    """The one-line error for ``value`` that is not of type ``tp`` at config key ``where``. A boolean or null given
    for a text field gets the quoted override that makes it text."""
    msg = f"{where}: expected {_describe(tp)}, got {_show(value)}"
    takes_text = tp is str or (typing.get_origin(tp) in (typing.Union, types.UnionType) and str in typing.get_args(tp))
    if takes_text and (value is None or isinstance(value, bool)) and _KEY.fullmatch(where):
        text = "null" if value is None else str(value).lower()
        msg += f"; for the text '{text}' quote it: {quoted_override(where, text)}"
    return ConfigError(msg)


def _coerce_union(value: Any, args: tuple, where: str) -> Any:
    """``value`` as the first member of a Union that accepts it (null for an Optional); the member's own error when
    only one member could apply, else one error naming every accepted kind."""
    if value is None and type(None) in args:
        return None
    members = [a for a in args if a is not type(None)]
    errors = []
    for a in members:
        try:
            return _coerce(value, a, where)
        except ConfigError as e:
            errors.append(e)
    if len(members) == 1 and not str(errors[0]).startswith(f"{where}: expected "):
        raise errors[0]  # an item or field inside the value is wrong: that error names it
    raise _wrong(value, typing.Union[args], where)  # noqa: UP007 - a union built from a tuple


def _coerce_sequence(value: Any, tp: Any, where: str) -> list | tuple:
    """A list / tuple field: a list whose items are coerced one by one (``where[i]`` names a bad item); a fixed-length
    tuple type also checks the length."""
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise _wrong(value, tp, where)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} values, got {_show(list(value))}")
        return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    inner = args[0] if args else Any
    out = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    return tuple(out) if origin is tuple else out


def _coerce_mapping(value: Any, tp: Any, where: str) -> dict:
    """A dict field: a mapping whose keys and values are coerced to the annotation's key and value types
    (``where.KEY`` names a bad value). ``dict[str, Any]`` values stay as given: their meaning belongs to the code that
    reads them (e.g. a reward factory's own arguments), which reports what does not fit."""
    if not isinstance(value, dict):
        raise _wrong(value, tp, where)
    args = typing.get_args(tp)
    key_tp, value_tp = args if len(args) == 2 else (Any, Any)
    out = {}
    for k, v in value.items():
        key = _coerce(k, key_tp, f"{where} (key {_show(k)})")
        out[key] = _coerce(v, value_tp, f"{where}.{key}")
    return out


def _coerce_scalar(value: Any, tp: type, where: str) -> Any:
    """bool / int / float / str. Integers are accepted for floats; numbers for strings (as typed on the command line,
    see :data:`_OVERRIDE_TEXT`); nothing else converts (a bool is not a number, a float is not an integer)."""
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is str:
        if isinstance(value, str):
            return str(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _OVERRIDE_TEXT.get().get(where, str(value))
    raise _wrong(value, tp, where)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against (and converted to) the type annotation ``tp`` of config key ``where``; a ConfigError
    naming the key and what it expects otherwise. Handles bool, int, float, str, Optional / unions, Literal, lists,
    tuples, dicts and nested config dataclasses; ``Any`` accepts everything."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(tp), where)
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise _wrong(value, tp, where)
        return value
    if origin in (tuple, list) or tp in (tuple, list):
        return _coerce_sequence(value, tp, where)
    if origin is dict or tp is dict:
        return _coerce_mapping(value, tp, where)
    if tp in (bool, int, float, str):
        return _coerce_scalar(value, tp, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _wrong(value, tp, where)
        return from_dict(tp, value, where)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise _wrong(value, tp, where)
    return value


def from_dict(cls: type, data: dict | None, where: str) -> Any:
    """Build dataclass ``cls`` from a mapping (None: all defaults), rejecting unknown keys with the valid ones named
    and values of the wrong type with the key named; then the dataclass's own ``validate()``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _wrong(data, cls, where)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            raise ConfigError(
                f"unknown key '{where}.{key}'{suggest(str(key), names)}; valid keys of {where}: {', '.join(names)}"
            )
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key '{where}.{f.name}'")
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if callable(check):
        check()
    return obj


def to_dict(obj: Any) -> Any:
    """A plain-YAML-friendly dict of a (nested) config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def field_defaults(cfg: Any) -> dict:
    """The defaults of ``cfg``'s config sections as :func:`to_dict` writes them: every dataclass section rebuilt from
    its class (a class with a field without a default is left out), every plain top-level field's own default. A
    resume compares a run's saved config.yaml with the new config; a key the saved file lacks (a field added in a
    newer mmrl) is no change when the new value is this default."""
    out: dict = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            try:
                out[f.name] = to_dict(type(value)())
            except TypeError:  # a section whose class needs arguments: no defaults known
                continue
        elif f.default is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default_factory())
    return out


def validate_algo(algo: AlgoConfig) -> None:
    """Cross-check algorithm names against the registries."""
    from mmrl.algos import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, advantage_choices

    check_choice(algo.advantage, advantage_choices(), "algo.advantage")
    check_choice(algo.policy_loss, POLICY_LOSSES.names(), "algo.policy_loss")
    check_choice(algo.loss_agg, AGGREGATIONS.names(), "algo.loss_agg")
    check_choice(algo.kl_estimator, KL_ESTIMATORS.names(), "algo.kl_estimator")
    check_choice(algo.adv_scale, ("group", "batch", "none"), "algo.adv_scale")
    check_choice(algo.old_logp, ("auto", "recompute", "rollout"), "algo.old_logp")
    from mmrl.algos.importance import IS_MODES

    check_choice(algo.is_mode, IS_MODES, "algo.is_mode")
    if not algo.is_cap > 0:
        raise ConfigError(f"algo.is_cap must be > 0 (the cap of the importance weights), got {algo.is_cap}")
    if not algo.adv_eps >= 0:
        raise ConfigError(
            f"algo.adv_eps must be >= 0 (an all-equal group gets advantage 0 even with 0), got {algo.adv_eps}"
        )
    if algo.group_size < 1 or algo.ppo_epochs < 1 or algo.num_minibatches < 1:
        raise ConfigError("algo.group_size, algo.ppo_epochs and algo.num_minibatches must be >= 1")
    if algo.max_staleness < 0:
        raise ConfigError(f"algo.max_staleness must be >= 0 (0: on-policy), got {algo.max_staleness}")


def validate_trainer(tr: TrainerConfig) -> None:
    check_choice(tr.lr_schedule, ("constant", "linear", "cosine"), "trainer.lr_schedule")
    check_choice(tr.device, ("auto", "cpu", "cuda"), "trainer.device")
    check_choice(tr.strategy, ("ddp", "fsdp2"), "trainer.strategy")
    if tr.fsdp_param_dtype is not None:
        check_choice(tr.fsdp_param_dtype, ("float32", "bfloat16", "float16"), "trainer.fsdp_param_dtype")
    if tr.batch_size < 1 or tr.grad_accum < 1 or tr.max_steps < 0:
        raise ConfigError("trainer.batch_size and trainer.grad_accum must be >= 1, trainer.max_steps >= 0")
    if tr.eval_samples < 1 or (tr.eval_samples > 1 and tr.eval_greedy):
        raise ConfigError(
            f"trainer.eval_samples={tr.eval_samples}: must be >= 1, and > 1 only with "
            "trainer.eval_greedy=false (greedy copies are identical)"
        )
    if tr.sft_max_items is not None and tr.sft_max_items < 1:
        raise ConfigError(f"trainer.sft_max_items must be >= 1 (or null for all items), got {tr.sft_max_items}")
    check_choice(tr.rollout, ("sync", "async"), "trainer.rollout")
    if tr.rollout_workers < 1:
        raise ConfigError(f"trainer.rollout_workers must be >= 1, got {tr.rollout_workers}")
    if not 0 <= tr.learner_nice <= 19:
        raise ConfigError(f"trainer.learner_nice must be in [0, 19] (a niceness increase), got {tr.learner_nice}")


def validate_sampling(model: Any) -> None:
    """Sampling settings of a token model (``model.temperature`` / ``top_p``) and, with
    ``model.rollout_engine=vllm``, the values vLLM would reject or silently change (it raises temperatures in
    (0, 0.01) to 0.01 and refuses ones above 2), so the trainer's log-probs never use another temperature than the
    sampler's; plus the engine's own numeric settings."""
    import math

    if not hasattr(model, "temperature"):
        return
    t, top_p = model.temperature, getattr(model, "top_p", 1.0)
    if not (math.isfinite(t) and t > 0):
        raise ConfigError(
            f"model.temperature must be a finite number > 0 (rollouts sample, and log-probs are "
            f"computed, at logits / temperature), got {t}"
        )
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise ConfigError(f"model.top_p must be in (0, 1], got {top_p}")
    if getattr(model, "rollout_engine", "hf") != "vllm":
        return
    from mmrl.rollout.vllm_engine import check_vllm_sampling

    try:
        check_vllm_sampling(t, top_p)
    except ValueError as e:
        raise ConfigError(f"model.temperature with model.rollout_engine=vllm: {e}") from None
    if not 0 < model.vllm_gpu_memory_utilization <= 1:
        raise ConfigError(
            f"model.vllm_gpu_memory_utilization must be in (0, 1], got {model.vllm_gpu_memory_utilization}"
        )
    if model.vllm_max_images_per_prompt < 1:
        raise ConfigError(f"model.vllm_max_images_per_prompt must be >= 1, got {model.vllm_max_images_per_prompt}")


# ---------------------------------------------------------------- composition


def configs_dir() -> Path:
    """The packaged configs folder (works from any working directory)."""
    import mmrl.configs

    return Path(mmrl.configs.__file__).parent


def group_options(group: str) -> list[str]:
    """The YAML options available in a config group: the packaged ones and the plugins' (:mod:`mmrl.plugins`)."""
    from mmrl.plugins import config_dirs

    return sorted({p.stem for d in (configs_dir(), *config_dirs()) for p in (d / group).glob("*.yaml")})


def _registered_task_selection(overrides: list[str]) -> list[str]:
    """``task=<name>`` for a task registered in code (a plugin's, :func:`mmrl.tasks.register_task`) with no preset
    file: the root config's task preset (``toy_arithmetic``, which also sets model keys) and, unless ``model=`` is
    given, its model preset (``tiny_lm``) are dropped, ``task.name`` is set, and ``model.type`` is the task's first
    declared ``model_types`` (unless given): the task and model compose from their own dataclass defaults, with no
    fields of another task's or model's preset. Other overrides are returned unchanged."""
    from mmrl.tasks import TASKS, get_task_class

    keys = {ov.split("=", 1)[0] for ov in overrides if "=" in ov}
    picked = [ov.split("=", 1)[1] for ov in overrides if ov.startswith("task=")]
    if len(picked) != 1 or picked[0] in group_options("task") or picked[0] not in TASKS:
        return overrides
    name = picked[0]
    out = [ov for ov in overrides if not ov.startswith("task=")]
    out += ["~task", f"++task.name={name}"] if not any(k.startswith("~task") for k in keys) else [f"++task.name={name}"]
    if "model" not in keys:
        types = get_task_class(name).model_types
        if not any(k.startswith("~model") for k in keys):
            out.append("~model")
        if types and "model.type" not in keys:
            out.append(f"++model.type={types[0]}")
    return out


def _normalise_override(ov: str) -> str:
    """Group selections stay as they are; plain keys become Hydra force-adds (`++key=value`) so that
    unknown keys reach our validator, which names them with the valid choices."""
    if ov.startswith(("+", "~")) or "=" not in ov:
        return ov
    key = ov.split("=", 1)[0]
    if key in CONFIG_GROUPS:
        return ov
    return "++" + ov


_KEY = re.compile(r"[A-Za-z_][\w\-]*(\.[\w\-]+)*")
"""A config key as overrides name it: names of letters, digits, ``_`` and ``-`` joined by dots."""


def quoted_override(key: str, text: str) -> str:
    """The shell word that gives ``key`` the literal text ``text``: quotes for the override parser (double, or single
    when the text has double quotes) inside quotes for the shell, e.g. ``'trainer.run_name="café"'``."""
    import shlex

    if '"' not in text:
        inner = f'"{text}"'
    elif "'" not in text:
        inner = f"'{text}'"
    else:
        inner = '"' + text.replace('"', '\\"') + '"'
    return shlex.quote(f"{key}={inner}")


def _unparseable(ov: str, reason: str) -> ConfigError:
    """The one-line error for override ``ov`` whose value the override grammar cannot read (``reason``), or reads as
    a sweep (``reason == "sweep"``), with the quoted form that passes the value as text."""
    import shlex

    key, _, value = ov.partition("=")
    key = key.lstrip("+")
    quoted = quoted_override(key, value.strip())
    if not value.isascii():
        return ConfigError(f"{ov}: a value with non-ASCII characters must be quoted: {quoted}")
    if reason == "sweep":
        return ConfigError(
            f"{ov}: a comma makes a sweep of several runs, which mmrl does not do; for a list write "
            f"{shlex.quote(f'{key}=[{value}]')}, for text quote it: {quoted}"
        )
    return ConfigError(f"{ov}: the value cannot be read ({reason}); if it is text, quote it: {quoted}")


@functools.lru_cache(maxsize=1)
def _override_parser():
    """Hydra's override parser (built once)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_override(ov: str) -> tuple[str, Any]:
    """``(key, value)`` of one command-line ``key=value``, the value read with Hydra's override grammar as ``mmrl
    train`` reads it (``3`` an int, ``[a,b]`` a list, ``"a b"`` or ``'x'`` a string, ``null`` None). A leading ``+`` /
    ``++`` is dropped from the key. ConfigError, naming the override: not ``key=value``, not a config key, a value
    the grammar cannot read (non-ASCII text, stray brackets, ``=``, ``#`` ... unquoted) or a sweep (``a,b``), each
    with the quoted form that passes the value as text."""
    if "=" not in ov:
        raise ConfigError(f"override '{ov}' is not of the form key=value")
    key = ov.split("=", 1)[0].lstrip("+")
    if not _KEY.fullmatch(key):
        raise ConfigError(
            f"{ov}: '{key}' is not a config key (names of letters, digits and '_' joined by '.'; "
            "`mmrl train --help` lists them)"
        )
    try:
        parsed = _override_parser().parse_override("++" + ov.lstrip("+"))
    except Exception as e:  # noqa: BLE001 - the grammar's errors (HydraException and its parse errors): one line
        raise _unparseable(ov, (str(e).splitlines() or [type(e).__name__])[0]) from None
    if parsed.is_sweep_override():
        raise _unparseable(ov, "sweep")
    return key, parsed.value()


def _number_texts(overrides: list[str]) -> dict[str, str]:
    """``{key: text}`` of the overrides whose value reads as a number (see :data:`_OVERRIDE_TEXT`)."""
    texts = {}
    for ov in overrides:
        if "=" in ov and ov.split("=", 1)[0] not in CONFIG_GROUPS and not ov.startswith("~"):
            key, value = parse_override(ov)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                texts[key] = ov.split("=", 1)[1].strip()
    return texts


def _resolve(conf: Any) -> dict:
    """The OmegaConf config as a plain dict with interpolations resolved; a ConfigError naming the key whose
    ``${...}`` cannot be resolved (or any other OmegaConf error) otherwise."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(conf, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = (str(getattr(e, "msg", "") or e).splitlines() or [type(e).__name__])[0]
        hint = " (text that starts with '${' is written '\\${')" if "Interpolation" in type(e).__name__ else ""
        raise ConfigError(f"{key + ': ' if key else ''}{msg}{hint}") from None


def compose_dict(overrides: list[str] | None = None) -> dict:
    """Compose the raw config with Hydra and return it as a plain dict. Every override is checked first on its own
    (:func:`parse_override`, group options), so an error names the override as the user typed it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    from mmrl.plugins import config_dirs, load_plugins
    from mmrl.tasks import TASKS

    overrides = list(overrides or [])
    load_plugins(_plugins_named(overrides))  # before group options and task names are looked up
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override '{ov}' is not of the form key=value")
        key, value = ov.split("=", 1)
        if key in CONFIG_GROUPS:
            options = group_options(key)
            if key == "task" and value not in options and value in TASKS:
                continue  # a task registered in code, without a preset file (_registered_task_selection)
            if value not in options:
                plugin = " (one from outside mmrl: install its plugin package or name it in plugins=[module])"
                raise ConfigError(
                    f"unknown {key} '{value}'{suggest(value, options)}; valid choices: {', '.join(options)}"
                    + (plugin if key in ("task", "model") else "")
                )
        elif not key.startswith("~"):
            parse_override(ov)
    composed = [_normalise_override(o) for o in _registered_task_selection(overrides)]
    if config_dirs():  # the plugins' presets, searched after the packaged configs
        import json

        composed.append("hydra.searchpath=[" + ",".join(json.dumps(f"file://{d}") for d in config_dirs()) + "]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(configs_dir()), version_base=None):
            cfg = compose("config", overrides=composed)
    except HydraException as e:
        raise ConfigError(str(e).split("\n")[0].replace("'++", "'")) from None
    finally:
        GlobalHydra.instance().clear()
    return _resolve(cfg)


def _plugins_named(overrides: list[str]) -> list[str]:
    """The ``plugins=[...]`` of a command line (read with the override grammar; one name is a list of one)."""
    for ov in overrides:
        if ov.lstrip("+").startswith("plugins="):
            value = parse_override(ov)[1]
            return [value] if isinstance(value, str) else value
    return []


def _section(raw: dict, key: str) -> dict:
    """Top-level section ``key`` of a raw config: a mapping (absent or null: empty); ConfigError otherwise."""
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{key}: expected a mapping of {key} fields (set them as {key}.FIELD=VALUE), got {_show(value)}"
        )
    return dict(value)


_TOP_KEYS = ("task", "model", "algo", "trainer", "reward", "agent", "checkpoint", "plugins")
"""The sections and keys of a run config (:class:`RunConfig`), in the order the errors list them."""


def build_run_config(raw: dict, *, texts: dict[str, str] | None = None) -> RunConfig:
    """Validate a composed dict into a :class:`RunConfig`: every value is checked against its field's type before
    any of it is used (the task name and model type are registry keys, so they are checked first). ``texts``: the
    command-line text of overrides that read as numbers (:data:`_OVERRIDE_TEXT`)."""
    from mmrl.models.registry import model_config_class
    from mmrl.plugins import load_plugins, plugin_path
    from mmrl.tasks import get_task_class

    if not isinstance(raw, dict):
        raise ConfigError(f"a run config is a mapping of {', '.join(_TOP_KEYS)}; got {_show(raw)}")
    for key in raw:
        if key not in _TOP_KEYS:
            raise ConfigError(f"unknown key '{key}'; valid top-level keys: {', '.join(_TOP_KEYS)}")
    plugins = [plugin_path(p) for p in _coerce(raw.get("plugins") or [], list[str], "plugins")]
    load_plugins(plugins)  # before the task name and model type are looked up (mmrl eval of a plugin's run)
    token = _OVERRIDE_TEXT.set(dict(texts or {}))
    try:
        task_raw = _section(raw, "task")
        if "name" not in task_raw:
            raise ConfigError("task.name is missing: select a task with task=<name> (see `mmrl tasks`)")
        try:
            task_cls = get_task_class(_coerce(task_raw["name"], str, "task.name"))
        except ConfigError as e:
            raise ConfigError(str(e) if str(e).startswith("task.name") else f"task.name: {e}") from None
        model_raw = _section(raw, "model")
        if "type" not in model_raw:
            raise ConfigError("model.type is missing: select a model preset with model=<name>")
        model_cls = model_config_class(_coerce(model_raw["type"], str, "model.type"))
        if task_cls.model_types and model_raw["type"] not in task_cls.model_types:
            raise ConfigError(
                f"model.type={model_raw['type']} cannot run task {task_raw['name']}, which takes model.type="
                f"{' or '.join(task_cls.model_types)}; pick a model preset of that type (model=<name>, see configs/model)"
            )
        cfg = RunConfig(
            task=from_dict(task_cls.config_cls, task_raw, "task"),
            model=from_dict(model_cls, model_raw, "model"),
            algo=from_dict(AlgoConfig, raw.get("algo"), "algo"),
            trainer=from_dict(TrainerConfig, raw.get("trainer"), "trainer"),
            checkpoint=_coerce(raw.get("checkpoint"), typing.get_type_hints(RunConfig)["checkpoint"], "checkpoint"),
            reward=from_dict(RewardConfig, raw.get("reward"), "reward"),
            agent=from_dict(AgentConfig, raw.get("agent"), "agent"),
            plugins=plugins,
        )
    finally:
        _OVERRIDE_TEXT.reset(token)
    validate_algo(cfg.algo)
    validate_trainer(cfg.trainer)
    validate_sampling(cfg.model)
    return cfg


def load_config(overrides: list[str] | None = None) -> RunConfig:
    """Compose ``configs/`` with Hydra-style ``key=value`` overrides and validate it."""
    overrides = list(overrides or [])
    raw = compose_dict(overrides)
    _greedy_override_means_one_sample(raw, overrides)
    return build_run_config(raw, texts=_number_texts(overrides))


def _greedy_override_means_one_sample(raw: dict, overrides: list[str]) -> None:
    """``trainer.eval_greedy=true`` given on the command line without ``trainer.eval_samples`` evaluates one greedy
    answer per item, whatever number of samples the task preset uses for its sampled evaluation (greedy copies are
    identical). Given both, the validator checks the pair as usual."""
    keys = {ov.lstrip("+~").split("=", 1)[0]: ov.split("=", 1)[-1] for ov in overrides}
    if keys.get("trainer.eval_greedy", "").lower() == "true" and "trainer.eval_samples" not in keys:
        raw.setdefault("trainer", {})["eval_samples"] = 1


def config_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML, in the fields' order (a run folder's ``config.yaml``)."""
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (:func:`config_yaml`)."""
    Path(path).write_text(config_yaml(cfg))


def load_saved_config(path: str | Path) -> RunConfig:
    """Read a config saved by :func:`save_config`."""
    import yaml

    return build_run_config(yaml.safe_load(Path(path).read_text()))


def trained_with(saved: dict) -> str:
    """``task=A model=B`` (plus ``(path P)`` when the model path is not the preset name) of a saved config dict."""
    task = (saved.get("task") or {}).get("name", "?")
    model = saved.get("model") or {}
    name, path = model.get("name") or model.get("type", "?"), model.get("path")
    return f"task={task} model={name}" + (f" (path {path})" if path and str(path) != str(name) else "")


def load_run_config(run_dir: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """The config a run was trained with (``<run_dir>/config.yaml``, written by :func:`save_config`) with command-line
    ``key=value`` overrides merged on top (read as ``mmrl train`` reads them, :func:`parse_override`), validated like
    :func:`load_config` (an unknown key is the usual :class:`ConfigError`). Used by ``mmrl eval checkpoint=<run>``
    (docs/evaluation.md).

    Group selections: ``task=X`` / ``model=Y`` equal to the run's are no-ops; others raise ConfigError naming the
    task and model the run was trained with (its weights belong to that model). ``algo=`` / ``trainer=`` presets
    are refused (set their fields instead). FileNotFoundError: the run has no readable config.yaml."""
    import yaml
    from omegaconf import OmegaConf

    path = Path(run_dir) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise FileNotFoundError(f"{path}: {type(e).__name__}") from None
    if (
        not isinstance(saved, dict)
        or not isinstance(saved.get("task"), dict)
        or not isinstance(saved.get("model"), dict)
    ):
        raise FileNotFoundError(f"{path}: not a run config saved by mmrl")
    updates = []
    for ov in overrides or []:
        if "=" not in ov:
            raise ConfigError(f"override '{ov}' is not of the form key=value")
        key, value = ov.split("=", 1)
        key = key.lstrip("+")
        if key.startswith("~"):
            raise ConfigError(
                f"'{ov}': deleting keys is not supported on a saved run config; set {key[1:]}=null instead"
            )
        if key in ("task", "model"):
            own = saved[key].get("name")
            if value != own:
                raise ConfigError(
                    f"checkpoint {run_dir} was trained with {trained_with(saved)}; it does not fit "
                    f"{key}={value}: drop {key}= to evaluate it with its own {key}"
                )
            continue
        if key in CONFIG_GROUPS:
            raise ConfigError(
                f"'{ov}': a {key} preset cannot be applied on top of the run's saved config; "
                f"set its fields instead ({key}.FIELD=VALUE)"
            )
        updates.append((ov, *parse_override(ov)))  # the grammar of `mmrl train`, and its one-line errors
    conf = OmegaConf.create(saved)
    for ov, key, value in updates:
        try:
            OmegaConf.update(conf, key, value, merge=True, force_add=True)
        except Exception as e:  # noqa: BLE001 - OmegaConf refuses the update (e.g. a field below a scalar): one line
            raise ConfigError(
                f"{ov}: cannot apply it to {path}: {(str(e).splitlines() or [type(e).__name__])[0]}"
            ) from None
    raw = _resolve(conf)
    _greedy_override_means_one_sample(raw, [o.lstrip("+") for o in overrides or []])
    return build_run_config(raw, texts=_number_texts([ov for ov, _, _ in updates]))
