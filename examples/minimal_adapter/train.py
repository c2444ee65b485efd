"""Train the minimal adapter (tone task + tone MLP policy) with mmrl's GRPO trainer; about half a minute on one CPU thread.

The adapter is the plugin package ``mmrl_tone`` next to this script. Installed (``pip install examples/minimal_adapter``),
the plain command runs it with no script at all::

    mmrl train task=tone_class                    # the preset mmrl_tone/configs/task/tone_class.yaml: 100 steps
    mmrl eval checkpoint=runs/<run>
    mmrl plan task=tone_class

This script names the package folder in ``plugins=`` when the package is not installed (so the run's config.yaml
records where it is, and ``mmrl eval checkpoint=runs/tone_class`` imports it again), evaluates the untrained policy,
trains, and prints the eval score and the mean reward start -> end::

    python examples/minimal_adapter/train.py                       # run folder runs/tone_class
    python examples/minimal_adapter/train.py trainer.seed=1 algo=rloo task.noise=1.0   # any `mmrl train` override

The run folder is a normal one (config.yaml, metrics.jsonl, curves.png, checkpoints/step_N/pretrained_model written
by ``TonePolicy.save_pretrained``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

PLUGIN = Path(__file__).resolve().parent / "mmrl_tone"
"""The plugin package: imported by mmrl from ``plugins=[<this folder>]`` (it registers the task, the model type and
its presets)."""

DEFAULTS = ["trainer.seed=0", "trainer.run_name=tone_class", "trainer.checkpointing.overwrite=true"]


def make_config(overrides: list[str]):
    """The validated run config: the plugin, ``task=tone_class`` (its preset selects ``model=tone_mlp``), DEFAULTS,
    then ``overrides``, composed and checked as ``mmrl train`` does."""
    from importlib.metadata import entry_points

    from mmrl.config import load_config

    installed = any(ep.value == PLUGIN.name for ep in entry_points(group="mmrl.plugins"))  # its entry point loads it
    plugins = [] if installed else [f"plugins=[{PLUGIN}]"]
    return load_config([*plugins, "task=tone_class", *DEFAULTS, *overrides])


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
