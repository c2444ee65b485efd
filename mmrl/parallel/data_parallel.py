"""The trainer's view of data parallelism: one object that knows the processes, wraps the policy for
``trainer.strategy=ddp|fsdp2`` and gives the few collective helpers the loop needs.

With one process every helper is a no-op, so the loop is written once for both cases.
"""

from __future__ import annotations

import contextlib

import torch

from mmrl.errors import ConfigError


class DataParallel:
    """Processes (``rank``, ``world``, ``is_main``), the policy's wrapping, and the loop's collectives."""

    def __init__(self, accelerator, trainer_cfg) -> None:
        self.accelerator = accelerator
        self.cfg = trainer_cfg
        self.rank = accelerator.process_index
        self.world = accelerator.num_processes
        self.is_main = accelerator.is_main_process
        self.sharded = False
        """True when ``trainer.strategy=fsdp2`` sharded the policy over several processes."""
        self._policy = None

    def wrap(self, policy, *, ema: bool = False) -> None:
        """``trainer.strategy``: DDP through accelerate, or FSDP2 sharding of every module the policy names
        (``Policy.shardable_modules``). ConfigError for launch configs mmrl does not drive (accelerate's own FSDP /
        DeepSpeed) and for an EMA copy under fsdp2."""
        self._policy = policy
        if self.world == 1:
            return
        launched_as = str(self.accelerator.distributed_type).rsplit(".", 1)[-1]
        if launched_as in ("FSDP", "DEEPSPEED", "MEGATRON_LM"):
            raise ConfigError(
                f"accelerate was configured for {launched_as}: mmrl shards the model itself; launch with a plain "
                "multi-process config (configs/accelerate/ddp.yaml, or torchrun) and choose trainer.strategy=ddp|fsdp2"
            )
        if self.cfg.strategy == "ddp":
            policy.model = self.accelerator.prepare_model(policy.model)
            return
        if ema:
            raise ConfigError(
                "model.ema=true with trainer.strategy=fsdp2 is not supported yet (the EMA copy is not "
                "sharded); use trainer.strategy=ddp or model.ema=false"
            )
        from mmrl.parallel.fsdp import shard_module

        for module in policy.shardable_modules():
            shard_module(
                module,
                reshard_after_forward=self.cfg.fsdp.reshard_after_forward,
                offload=self.cfg.fsdp.offload,
                param_dtype=self.cfg.fsdp.param_dtype,
            )
        self.sharded = True

    def gathered(self, metrics: dict | None = None):
        """Full parameters for rollouts and evaluation under fsdp2 (no collectives inside); a no-op otherwise."""
        if not self.sharded:
            return contextlib.nullcontext()
        from mmrl.parallel.fsdp import gathered_parameters

        return gathered_parameters(
            self._policy.model, metrics, reshard_after_forward=self.cfg.fsdp.reshard_after_forward
        )

    def no_sync(self, sync: bool):
        """Skip the gradient all-reduce / reduce-scatter of micro-batches before the last one of a minibatch."""
        if self.world == 1 or sync:
            return contextlib.nullcontext()
        if self.sharded:
            from mmrl.parallel.fsdp import gradient_sync

            return gradient_sync(self._policy.model, False)
        return self.accelerator.no_sync(self._policy.model)

    def all_reduce_sums(self, xs: list[float]) -> list[float]:
        """Each of ``xs`` summed over the processes (float64), in one collective."""
        if self.world == 1:
            return [float(x) for x in xs]
        t = torch.tensor(xs, dtype=torch.float64, device=self.accelerator.device)
        return [float(v) for v in self.accelerator.reduce(t, reduction="sum").tolist()]

    def all_gather_ints(self, x: int) -> list[int]:
        """``x`` of every process, in rank order (``[x]`` with one process)."""
        if self.world == 1:
            return [int(x)]
        parts: list = [None] * self.world
        torch.distributed.all_gather_object(parts, int(x))
        return [int(v) for v in parts]

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()
