"""Train the minimal adapter (tone task + tone MLP policy) with mmrl's GRPO trainer; about half a minute on one CPU thread.

    python examples/minimal_adapter/train.py                       # defaults below, run folder runs/tone_class
    python examples/minimal_adapter/train.py trainer.seed=1 algo=rloo task.noise=1.0   # any `mmrl train` override

It registers the task and the model type in mmrl's registries (what ``task.name`` / ``model.type`` look up), builds
the config as ``mmrl train`` does (Hydra presets, validation, one-line errors), evaluates the untrained policy,
trains, and prints the eval score and the mean reward start -> end. The run folder is a normal one (config.yaml,
metrics.jsonl, curves.png, checkpoints/step_N/pretrained_model written by ``TonePolicy.save_pretrained``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the registries import tone_task / tone_policy by name

from tone_policy import ToneModelConfig, build_tone_policy  # noqa: E402
from tone_task import ToneTask  # noqa: E402

DEFAULTS = [
    "trainer.max_steps=100",
    "trainer.batch_size=16",
    "algo.group_size=8",
    "trainer.lr=0.003",
    "trainer.eval_every=20",
    "trainer.device=cpu",
    "trainer.threads=1",
    "trainer.seed=0",
    "trainer.run_name=tone_class",
    "trainer.overwrite=true",
]


def register() -> None:
    """Make ``task.name=tone_class`` and ``model.type=tone_mlp`` known to mmrl (values: ``module:attribute``)."""
    from mmrl.models.registry import register_model_type
    from mmrl.tasks import register_task

    register_task(ToneTask.name, f"{ToneTask.__module__}:{ToneTask.__name__}")
    register_model_type(
        ToneModelConfig.type,
        f"{ToneModelConfig.__module__}:{ToneModelConfig.__name__}",
        f"{build_tone_policy.__module__}:{build_tone_policy.__name__}",
    )


def make_config(overrides: list[str]):
    """The validated run config: our task and model selected by name, then DEFAULTS, then ``overrides``."""
    from mmrl.config import load_config

    register()
    # the root config preselects a task and a model preset (configs/config.yaml); drop both (their fields belong to
    # other config classes) and name ours; the algo / trainer presets and every override work as in `mmrl train`
    select = [
        "~task=toy_arithmetic",
        f"task.name={ToneTask.name}",
        "~model=tiny_lm",
        f"model.type={ToneModelConfig.type}",
    ]
    return load_config(select + DEFAULTS + list(overrides))


def train(overrides: list[str]) -> tuple:
    """Build the trainer, evaluate before training, train; returns ``(trainer, eval before, final metrics)``."""
    from mmrl.trainer import Trainer

    trainer = Trainer(make_config(overrides))  # builds ToneTask and TonePolicy through the registries
    trainer.setup_run_dir()  # the run folder and its metrics tracker (fit() would make them otherwise)
    before = trainer.evaluate()
    trainer.tracker.log(before, trainer.step)  # the starting score in metrics.jsonl and curves.png (step 0)
    final = trainer.fit()
    return trainer, before, final


def main(argv: list[str]) -> int:
    from mmrl.errors import ConfigError

    t0 = time.perf_counter()
    try:
        trainer, before, final = train(argv)
    except ConfigError as e:  # a bad override or value: one line, as `mmrl train` prints it
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    if not trainer.is_main:  # torchrun --nproc_per_node 2 ...: one summary
        return 0
    rep = trainer.report
    print(f"eval/score   {before['eval/score']:.3f} -> {final['eval/score']:.3f}")
    print(f"eval/format  {before['eval/format']:.3f} -> {final['eval/format']:.3f}")
    print(f"reward/mean  {rep.first_reward:.3f} -> {rep.last_reward:.3f} (first -> last training step)")
    print(f"run folder   {trainer.run_dir} ({trainer.step} steps in {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
