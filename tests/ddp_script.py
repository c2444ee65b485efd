"""Run a few toy-task steps and save the parameters (used by test_ddp under `accelerate launch`)."""
import sys

import torch

from mmrl.config import load_config
from mmrl.trainer import Trainer

out, steps, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]  # extra: more key=value overrides
torch.set_num_threads(1)
cfg = load_config([
    "task=toy_arithmetic", f"trainer.output_dir={out}", "trainer.run_name=run", f"trainer.max_steps={steps}",
    "trainer.batch_size=4", "algo.group_size=4", "trainer.eval_at_end=false", "trainer.progress=false",
    "trainer.tensorboard=false", "trainer.plot=false", "trainer.device=cpu", "algo.loss_agg=token_mean", *extra,
])
tr = Trainer(cfg)
tr.fit()
if tr.is_main:
    (__import__("pathlib").Path(out) / "world.txt").write_text(str(tr.world))
    torch.save({k: v.detach().cpu() for k, v in tr.policy.module.state_dict().items()}, f"{out}/params.pt")
