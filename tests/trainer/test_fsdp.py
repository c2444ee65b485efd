"""trainer.strategy=fsdp2: 2 CPU processes (gloo, FSDP2 sharding) == 1 process, and sharded checkpoints that resume
bit-exactly at the same world size and load at another one."""

import json

import pytest
import torch

from tests.helpers import run_results, run_script

VLM = [
    "task=vqa_grounding",
    "task.num_train=8",
    "task.num_eval=4",
    "trainer.warm_start.steps=0",
    "model.max_new_tokens=6",
    "trainer.batch_size=2",
    "algo.group_size=2",
    "algo.entropy_coef=0.05",
    "trainer.optim.lr=0.01",
]
"""A random tiny Qwen3-VL gets reward 0 everywhere; the entropy bonus gives every step a gradient to compare."""
DIFFUSION = [
    "task=t2i_color",
    "task.pretrain_steps=0",
    "task.pretrain_vae_steps=0",
    "model.num_steps=3",
    "trainer.batch_size=2",
    "algo.group_size=2",
    "algo.kl_coef=0.01",
    "trainer.optim.lr=0.01",
]

VLA = [
    "task=vla_reach",
    "task.tasks=[reach_red,reach_blue]",
    "task.train_init_states=2",
    "task.demo_episodes=2",
    "task.max_steps=3",
    "task.eval_videos=0",
    "trainer.warm_start.steps=0",
    "model.num_workers=1",
    "trainer.batch_size=2",
    "algo.group_size=2",
    "algo.filter_groups=false",
    "algo.entropy_coef=0.05",
    "trainer.optim.lr=0.01",
]
"""The VLA policy (tiny Qwen3-VL + action tokens) in the tabletop simulator: each rank runs its own env pool."""
VLA_FLOW = [
    *VLA,
    "model.action_head=flow",
    "model.chunk=2",
    "model.num_steps=3",
    "algo=ppo",
    "trainer.optim.adam_eps=0.003",
]
"""The flow action expert (Flow-SDE) with PPO's critic on the prefix: the value loss gives every step a gradient, and
PPO's 2 epochs x 2 minibatches are drawn from the global batch. With reward 0 everywhere the advantages are the
critic's TD errors whitened over a batch of near-equal values (std ~0.02: fp noise x 50), and Adam's first steps move
every weight by ~lr whatever the size of its gradient, so a weight whose gradient is below that noise moves by +-lr at
random: with the default eps=1e-8 one process against itself with trainer.grad_accum=2 (the same update, other
micro-batch shapes) already ends 4e-3 apart. eps=3e-3 keeps the update Lipschitz in the gradient (|d update| <=
lr / eps |d grad|), so the comparison measures the gradients."""
VLA_GAUSSIAN = [*VLA, "model.action_head=gaussian", "model.chunk=2"]
"""The Gaussian chunk head with its learned log-std (the entropy bonus has a closed form there)."""
LEROBOT_PI0 = [
    *VLA,
    "model=tiny_pi0",
    "model.num_steps=3",
    "task.image_size=32",
    "algo=ppo",
    "trainer.optim.adam_eps=0.003",
]
"""A tiny LeRobot π0 (its own VLM, expert and preprocessing) with PPO's critic, as VLA_FLOW; with
model.lora.enabled=true its adapters, projections and vision encoder train and the blocks' base weights are frozen."""


def _assert_equal_runs(one, two, *, tol=2e-5):
    (a, ga), (b, gb) = run_results(one), run_results(two)
    assert sorted(a) == sorted(b)
    assert len(ga) == len(gb) and any(g > 0 for g in ga), (ga, gb)  # the steps had gradients: not vacuous
    assert all(abs(x - y) <= 1e-4 * max(1.0, x) for x, y in zip(ga, gb)), (ga, gb)
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst < tol, f"max parameter difference {worst}"
    return a, b


def _sharded_files(run_dir):
    ckpt = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    return sorted(p.name for p in (ckpt / "training_state" / "sharded").glob("*.distcp"))


@pytest.mark.parametrize(
    "name,extra",
    [
        ("toy", []),
        ("vlm_lora", [*VLM, "model.lora.enabled=true"]),
        ("vlm_full", [*VLM, "model.lora.enabled=false", "model.freeze_vision_tower=false"]),
        ("diffusion_dit", [*DIFFUSION]),
        ("vla", [*VLA]),
        ("vla_flow_ppo", VLA_FLOW),
        ("vla_gaussian", VLA_GAUSSIAN),
        ("lerobot_pi0_full", [*LEROBOT_PI0, "model.lora.enabled=false"]),
        ("lerobot_pi0_lora", [*LEROBOT_PI0, "model.lora.enabled=true"]),
    ],
)
def test_fsdp2_two_processes_match_one(tmp_path, name, extra):
    run_script(tmp_path / "one", 3, *extra)
    run_script(tmp_path / "two", 3, *extra, "trainer.strategy=fsdp2", processes=2)
    assert (tmp_path / "two" / "sharded.txt").read_text() == "True"
    assert _sharded_files(tmp_path / "two" / "run") == ["__0_0.distcp", "__1_0.distcp"]  # every rank wrote its shard
    _, two = _assert_equal_runs(tmp_path / "one", tmp_path / "two")
    if name == "toy":  # the gathered pretrained_model/ is a plain HF folder equal to the trained weights
        from safetensors.torch import load_file

        ckpt = sorted((tmp_path / "two" / "run" / "checkpoints").glob("step_*"))[-1]
        saved = load_file(str(ckpt / "pretrained_model" / "model.safetensors"))
        assert max(float((saved[k] - two["lm." + k]).abs().max()) for k in saved) == 0.0


def test_sharded_checkpoint_resumes_exactly_and_at_another_world_size(tmp_path):
    steps = ["trainer.strategy=fsdp2", "trainer.checkpointing.save_every=2", "trainer.checkpointing.keep_last=5"]
    run_script(tmp_path / "full", 3, *steps, processes=2)
    # the same run stopped after step 2 and continued with 2 processes: bit-exact
    run_script(tmp_path / "cont", 2, *steps, processes=2)
    import shutil

    shutil.copytree(tmp_path / "cont" / "run", tmp_path / "one" / "run")  # the run as it stood after step 2
    run_script(tmp_path / "cont", 3, *steps, "trainer.checkpointing.resume=auto", processes=2)
    (full, _), (cont, _) = run_results(tmp_path / "full"), run_results(tmp_path / "cont")
    assert all(torch.equal(full[k], cont[k]) for k in full)
    state = json.loads(
        (tmp_path / "cont" / "run" / "checkpoints" / "step_000002" / "training_state" / "state.json").read_text()
    )
    assert state["world_size"] == 2 and state["strategy"] == "fsdp2"
    # continued with 1 process from the 2-process checkpoint (DCP reshards on load): the same run within fp noise
    run_script(tmp_path / "one", 3, *steps, "trainer.checkpointing.resume=auto")
    one, _ = run_results(tmp_path / "one")
    assert max(float((full[k] - one[k]).abs().max()) for k in full) < 2e-5


def test_fsdp2_with_dapo_resampling_rounds_does_not_hang(tmp_path):
    """DAPO's resampling takes as many rounds as each rank's groups need: the full weights are gathered once around
    all rounds (a per-round gather is a collective the ranks would not pair up)."""
    dapo = ["algo.filter_groups=true", "algo.max_resample=3", "trainer.strategy=fsdp2", "trainer.optim.lr=0.01"]
    run_script(tmp_path / "two", 3, *dapo, processes=2, timeout=300)  # a hang would end in run_script's timeout
    from mmrl.tracking import read_metrics

    rows = [r for r in read_metrics(tmp_path / "two" / "run" / "metrics.jsonl") if "filter/rounds" in r]
    assert len(rows) == 3 and all(1 <= r["filter/rounds"] <= 4 for r in rows)


def test_fsdp2_under_torchrun_with_cpu_offload_matches_one_process(tmp_path):
    """`torchrun --nproc_per_node 2` (the launcher of docs/scaling.md) with trainer.fsdp.offload=true (CPUOffloadPolicy:
    sharded parameters, gradients and AdamW state in CPU memory) trains the same parameters as one process."""
    run_script(tmp_path / "one", 3)
    run_script(
        tmp_path / "two", 3, "trainer.strategy=fsdp2", "trainer.fsdp.offload=true", processes=2, launcher="torchrun"
    )
    assert (tmp_path / "two" / "sharded.txt").read_text() == "True"
    _assert_equal_runs(tmp_path / "one", tmp_path / "two")


def test_fsdp2_bf16_mixed_precision_trains_close_to_fp32(tmp_path):
    """trainer.fsdp.param_dtype=bfloat16: parameters gathered and computed in bf16 over fp32 masters (gradients reduced
    in fp32): the run trains (parameters move, finite) and stays near the fp32 run, but not equal to it."""
    run_script(tmp_path / "fp32", 3, "trainer.strategy=fsdp2", processes=2)
    run_script(tmp_path / "bf16", 3, "trainer.strategy=fsdp2", "trainer.fsdp.param_dtype=bfloat16", processes=2)
    (a, ga), (b, gb) = run_results(tmp_path / "fp32"), run_results(tmp_path / "bf16")
    assert all(b[k].dtype == torch.float32 for k in b)  # the masters (and the saved weights) stay fp32
    assert all(torch.isfinite(b[k]).all() for k in b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert 0 < worst < 0.05, worst
    assert all(abs(x - y) <= 0.1 * x for x, y in zip(ga, gb)), (ga, gb)


def test_accelerate_own_sharding_modes_and_ema_under_fsdp2_are_one_line_errors(tmp_path):
    """mmrl shards the model itself: a launch configured for accelerate's FSDP / DeepSpeed is refused naming the way
    out; model.ema with fsdp2 (an unsharded EMA copy) is refused before anything is wrapped."""
    from mmrl.config import ConfigError, load_config
    from mmrl.trainer import Trainer
    from tests.helpers import fake_launch_accelerator, toy_overrides

    for kind in ("FSDP", "DEEPSPEED"):
        with pytest.raises(ConfigError, match=f"accelerate was configured for {kind}: mmrl shards the model itself"):
            Trainer(load_config(toy_overrides(tmp_path, run=kind)), accelerator=fake_launch_accelerator(kind=kind))
    diffusion = load_config([*DIFFUSION, "model.ema=true", "trainer.strategy=fsdp2", f"trainer.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="model.ema=true with trainer.strategy=fsdp2 is not supported"):
        Trainer(diffusion, accelerator=fake_launch_accelerator())
