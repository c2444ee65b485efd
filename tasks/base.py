"""The task interface: what a task gives the trainer, SFT, evaluation and the policy builder.

Required: :meth:`Task.reward_specs`, and the records: :meth:`Task.build_items` (or :meth:`Task.train_items` and
:meth:`Task.eval_items`). Everything else has a working default that a task
overrides when it has something to say (see docs/architecture.md).
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, ClassVar, Sequence

from mmrl.errors import (
    ConfigError,
    SkipItem,  # noqa: F401  (the Task contract: prepare_item raises it)
)
from mmrl.policies.base import PolicySpec
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.task_config import (  # noqa: F401  (the Task contract: what a task's config is)
    TaskConfig,
    TaskConfigBase,
    task_data,
)


class Task(abc.ABC):
    """Dataset + prompt template + reward composition + eval metric of one job."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    config_cls: ClassVar[type] = object
    model_types: ClassVar[tuple[str, ...]] = ()
    """The ``model.type`` values whose policies this task can drive (``("vla",)``); a run with another type is a
    ConfigError naming both. Empty: any type (a task outside mmrl that has not said)."""

    def __init__(self, cfg: TaskConfig, run_cfg: Any) -> None:
        self.cfg = cfg
        self.run_cfg = run_cfg
        self.output_dir: Path | None = None
        """Where evaluation outputs beyond results.json go (a success table, videos); ``mmrl eval`` sets it to its
        eval folder. None: the task's default (the run directory). Tasks without such outputs ignore it."""
        self.last_eval_table: dict | None = None
        """A per-suite table of the last :meth:`eval_metrics` call (e.g. success per LIBERO suite), which ``mmrl eval``
        writes and prints; None: the task has none."""

    def build_items(self, split: str) -> list[dict]:
        """Records of ``split`` ("train" / "eval"); the default train/eval_items call this once each. A task
        implements this, or overrides :meth:`train_items` and :meth:`eval_items` themselves."""
        raise NotImplementedError(f"task {self.name} implements neither build_items nor train_items/eval_items")

    def train_items(self) -> Sequence[dict]:
        """Training records; each has at least ``prompt`` (what the policy reads). Built once."""
        return self._cached_split("train")

    def eval_items(self) -> Sequence[dict]:
        """Evaluation records (same schema). Built once. Empty when the task config has ``num_eval: 0`` and no
        ``eval_data`` (the fields of :class:`TaskConfigBase`; a task that names its eval size otherwise overrides
        this)."""
        data = task_data(self.cfg)
        if data.num_eval == 0 and not data.eval_data:
            return []
        return self._cached_split("eval")

    def _cached_split(self, split: str) -> list[dict]:
        cache = self.__dict__.setdefault("_split_cache", {})
        if split not in cache:
            cache[split] = self.build_items(split)
        return cache[split]

    def sft_items(self) -> Sequence[dict]:
        """Records of the supervised warm start (``trainer.warm_start.steps``). Default: the training records; a task may
        warm-start on other items (VLA: one item per expert-demo observation)."""
        return self.train_items()

    def collect_demos(self, path: str | None = None) -> list:
        """Record expert demos (``mmrl collect``) into ``path``. Default: this task has no scripted expert."""
        raise ConfigError(
            f"task {self.name} has no scripted expert to collect demos from (tasks with one: "
            "vla_reach, vla_lift, metaworld)"
        )

    def policy_spec(self) -> PolicySpec:
        """What the policy builder needs from this task (vocabulary, environment, action statistics, model hook).
        Default: only the task's name."""
        return PolicySpec(task_name=self.name)

    @abc.abstractmethod
    def reward_specs(self) -> list[RewardSpec]:
        """Reward functions with weights."""

    def prepare_item(self, item: dict) -> dict:
        """Load what the item needs (media...) right before rollout; raise SkipItem for bad items."""
        return item

    def reward_columns(self, items: Sequence[dict]) -> dict[str, list]:
        """Per-item fields passed to reward functions as keyword columns (TRL's convention), one list per key.

        Default: every key of the items but ``prompt``, media included (images, video paths, frames), and every
        reward function gets them, remote reward endpoints too (``reward.fns`` with a URL: they are serialised into
        the request). A task whose items carry large media overrides this to send only what its rewards read."""
        keys = [k for k in items[0] if k != "prompt"] if items else []
        return {k: [it.get(k) for it in items] for k in keys}

    def sft_target(self, item: dict, meta: dict) -> str | None:
        """The reference completion for the supervised warm start (``trainer.warm_start.steps``), or None.

        ``meta`` is what the policy knows about the item after preprocessing (e.g. the model-input
        image size and box frame for VLMs; empty for text policies).
        """
        return None

    def rollout_metrics(self, items: Sequence[dict], samples: list) -> dict[str, float]:
        """Extra per-step monitors computed from the samples (e.g. reward-hacking monitors)."""
        return {}

    def eval_metrics(self, items: Sequence[dict], samples: list, per_fn: dict) -> dict[str, float]:
        """Task metrics on greedy eval samples; ``eval/score`` is the headline number."""
        return {}
