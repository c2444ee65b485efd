"""Shared test helpers: small toy-task configs and trainers."""
from __future__ import annotations

from pathlib import Path

from mmrl.config import load_config
from mmrl.trainer import Trainer


def toy_overrides(tmp_path: Path, *extra: str, steps: int = 4, run: str = "run") -> list[str]:
    return [
        "task=toy_arithmetic",
        f"trainer.output_dir={tmp_path}",
        f"trainer.run_name={run}",
        f"trainer.max_steps={steps}",
        "trainer.batch_size=4",
        "trainer.eval_every=0",
        "trainer.eval_at_end=false",
        "trainer.progress=false",
        "trainer.tensorboard=false",
        "trainer.plot=false",
        "algo.group_size=4",
        *extra,
    ]


def toy_trainer(tmp_path: Path, *extra: str, steps: int = 4, run: str = "run") -> Trainer:
    return Trainer(load_config(toy_overrides(tmp_path, *extra, steps=steps, run=run)))
