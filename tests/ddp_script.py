"""Run a few steps (the toy task unless ``task=...`` is given) and save the gathered parameters (used by test_ddp
and test_fsdp under `accelerate launch`)."""

import os
import sys
from pathlib import Path

import torch

from mmrl.config import load_config
from mmrl.parallel.fsdp import full_state_dict
from mmrl.parallel.shutdown import shutdown_distributed
from mmrl.trainer import Trainer


def main() -> None:
    out, steps, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]  # extra: more key=value overrides
    torch.set_num_threads(1)
    task = [] if any(x.startswith("task=") for x in extra) else ["task=toy_arithmetic"]
    cfg = load_config(
        [
            *task,
            f"trainer.output_dir={out}",
            "trainer.run_name=run",
            f"trainer.max_steps={steps}",
            "trainer.batch_size=4",
            "algo.group_size=4",
            "trainer.eval.at_end=false",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
            "trainer.device=cpu",
            "algo.loss_agg=token_mean",
            *extra,
        ]
    )
    tr = Trainer(cfg)
    tr.fit()
    params = full_state_dict(tr.policy.module)  # gathered from the shards under trainer.strategy=fsdp2 (collective)
    if tr.is_main:
        (Path(out) / "world.txt").write_text(f"{tr.world}")
        (Path(out) / "sharded.txt").write_text(f"{tr.sharded}")
        torch.save(params, f"{out}/params.pt")
    shutdown_distributed()  # as `mmrl train` ends: no rank exits with its process group alive


if __name__ == "__main__":  # spawned children (env workers, demo collection) import this module
    main()
    # skip the interpreter's teardown: with gloo (and FSDP2's CPU offload) a rank still died there now and then with
    # "terminate called without an active exception" after a finished, saved run (1 of 2 CI runs after the
    # destroy_process_group fix); the results are on disk and the streams are flushed first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
