"""Training over several processes: FSDP2 sharding (:mod:`mmrl.parallel.fsdp`) and sharded checkpoints
(:mod:`mmrl.parallel.sharded_checkpoint`). DDP goes through accelerate in the trainer."""
