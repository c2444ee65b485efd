"""`mmrl plan` with asynchronous rollouts (trainer.rollout=async, mmrl/planning/memory.py, docs/scaling.md).

Each rollout worker is a process holding its own policy copy (weights unsharded + the rollout peak of one round, a
step's global batch, + its own overhead) on rank 0's device; the learner keeps a CPU shared-memory copy of the
policy's state_dict (the weight board). The numbers below are worked out by hand on the 2-layer toy of
tests/trainer/test_planner.py (1304 parameters, tied embeddings of 10 x 8) and, for real configs, from the planner's
own per-part figures of the synchronous plan.
"""

from __future__ import annotations

import pytest

from mmrl.planning.advice import suggest
from mmrl.planning.memory import GIB, PlanInputs, plan_memory
from tests.trainer.test_planner import TOY_ARCH, _full_ft_7b

# The toy run of test_toy_plan_total_and_reference: bf16, micro-batch 3, rollout 3 samples of 6 prompt + 4 new tokens.
#   learner: parameters 1304 x 2 = 2608, optimizer 1304 x 12 = 15648, training 2608 + 20640 + 2520 = 25768,
#            rollout: KV cache 960 + prefill 2880 = 3840  ->  2608 + 15648 + max(25768, 3840) = 44024
#   one worker: weights 2608 + rollout 3840 (+ overhead 0)  = 6448
TOY = PlanInputs(
    arch=TOY_ARCH, dtype_bytes=2, micro_batch=3, rollout_samples=3, text_tokens=6, new_tokens=4, device_bytes=10**9
)


def test_toy_async_adds_exactly_the_worker_copies():
    sync = plan_memory(TOY)
    assert (sync.total, sync.learner, sync.workers, sync.weight_board) == (44024, 44024, 0, 0)
    one, two = plan_memory(TOY.with_(rollout_workers=1)), plan_memory(TOY.with_(rollout_workers=2))
    for bd in (one, two):
        assert (bd.worker_weights, bd.worker_rollout, bd.worker_overhead) == (2608, 3840, 0)
        assert bd.worker == 6448 and bd.learner == 44024  # the learner's part is the synchronous plan
        # the board: every state_dict entry, the tied embedding twice (10 x 8 x 2 B more)
        assert bd.weight_board == 2608 + 160
    assert (one.total, two.total) == (44024 + 6448, 44024 + 2 * 6448)
    assert two.total - one.total == one.total - sync.total == 6448
    # a CPU run's RAM: the learner per process + the workers (once: rank 0's) + the board
    assert two.host_ram(1) == 44024 + 2 * 6448 + 2768
    assert two.host_ram(3) == 3 * 44024 + 2 * 6448 + 2768
    assert sync.host_ram(3) == 3 * 44024


def test_toy_worker_copy_terms():
    # KL with full fine-tuning: the learner keeps its frozen copy (1304 x 2 B), the worker builds without one
    #   learner 2608 + 15648 + 2608 + max(25768, 3840) = 46632; one worker 2608 + 3840 = 6448
    kl = plan_memory(TOY.with_(rollout_workers=1, kl_reference=True))
    assert (kl.reference, kl.worker) == (2608, 6448)  # a worker with the reference would be 2608 more
    assert (kl.learner, kl.total) == (46632, 46632 + 6448)
    # LoRA r=2 on the 7 projections: 512 fp32 adapters + the bf16 base; no reference copy
    lora = plan_memory(TOY.with_(rollout_workers=1, lora=True, lora_r=2, kl_reference=True))
    assert (lora.worker_weights, lora.worker) == (512 * 4 + 1304 * 2, 512 * 4 + 1304 * 2 + 3840)
    assert lora.weight_board == 512 * 4 + 1304 * 2 + 160
    # each worker is a process: its own runtime overhead (CUDA context)
    assert plan_memory(TOY.with_(rollout_workers=2, overhead_bytes=100)).worker == 6448 + 100
    # vLLM in the worker: its reservation, 0.3 x 1e9, whether or not it sleeps
    for sleep in (True, False):
        v = plan_memory(TOY.with_(rollout_workers=1, engine="vllm", vllm_sleep=sleep))
        assert v.worker_rollout == 300_000_000 and v.worker == 2608 + 300_000_000


def test_toy_worker_rolls_out_the_global_batch_unsharded():
    """With 2 DDP learners (3 samples each), rank 0's workers sample the step's 6; with fsdp2 the learner's state is
    sharded but a worker's copy is not."""
    ddp = plan_memory(TOY.with_(rollout_workers=1, world_size=2))
    # KV cache 2 x 2 layers x 1 kv x 4 x 10 tokens x 6 samples x 2 B = 1920; prefill 6 x 6 x (3 x 16 + 4 x 8) x 2 = 5760
    assert ddp.worker_rollout == 1920 + 5760 == plan_memory(TOY.with_(rollout_samples=6)).rollout
    fsdp = plan_memory(TOY.with_(rollout_workers=1, world_size=2, strategy="fsdp2", offload="params"))
    assert fsdp.params == 0 and fsdp.worker_weights == 2608


def test_advice_counts_the_workers_and_never_offers_fsdp2_to_an_async_run():
    inp = _full_ft_7b(rollout_workers=1)
    sugg = suggest(inp, grad_accum=1)
    assert sugg and all("fsdp2" not in s.override for s in sugg)  # trainer.rollout=async runs under ddp only
    assert sugg[-1].fits and sugg[-1].breakdown.workers > 0 and sugg[-1].total == plan_memory(sugg[-1].inputs).total
    assert "plan.strategy=fsdp2" in [s.override for s in suggest(_full_ft_7b(), grad_accum=1)]


# ============================================================================ from a run config (`mmrl plan`)

TOY_RUN = ["task=toy_arithmetic", "plan.overhead_gb=0"]
ASYNC = ["trainer.rollout=async", "algo.max_staleness=1"]


def _plan(*extra):
    from mmrl.planning.report import build_plan

    return build_plan([*TOY_RUN, *extra])


def test_config_plan_sync_vs_async_1_vs_2_from_the_planners_own_parts():
    *_, sync, _ = _plan()
    *_, one, _ = _plan(*ASYNC)
    *_, two, _ = _plan(*ASYNC, "trainer.rollout_workers=2")
    # one process, ddp: a worker holds what the learner's parameters and rollout terms already count
    worker = sync.params + sync.rollout
    assert sync.workers == 0 and one.learner == two.learner == sync.total
    assert (one.rollout_workers, two.rollout_workers) == (1, 2)
    assert one.total == sync.total + worker and two.total == sync.total + 2 * worker
    # with 2 learner processes each trains half the batch, but rank 0's workers roll out all of it
    *_, sync2, _ = _plan("plan.world_size=2")
    *_, two2, _ = _plan(*ASYNC, "trainer.rollout_workers=2", "plan.world_size=2")
    assert two2.learner == sync2.total and sync2.rollout < sync.rollout
    assert two2.total == sync2.total + 2 * (sync.params + sync.rollout)


def test_report_shows_the_worker_copies(capsys):
    from mmrl.cli import main

    assert main(["plan", *TOY_RUN, *ASYNC, "trainer.rollout_workers=2"]) == 0
    out = capsys.readouterr().out
    *_, bd, _ = _plan(*ASYNC, "trainer.rollout_workers=2")

    def line(name: str) -> list[str]:
        found = [ln.split() for ln in out.splitlines() if ln.strip().startswith(name)]
        assert len(found) == 1, (name, out)
        return found[0]

    mib = 1024**2
    for name, value in (
        ("rollout worker: weights", bd.worker_weights),
        ("rollout worker: rollout peak", bd.worker_rollout),
        ("learner", bd.learner),
        ("rollout workers", bd.workers),
        ("total per device", bd.total),
        ("weight board (CPU RAM)", bd.weight_board),
        ("RAM of a CPU run", bd.host_ram(1)),
    ):
        assert line(name)[len(name.split())] == f"{value / mib:.2f}", name
    assert "2 x" in " ".join(line("rollout workers")) and "trainer.rollout_workers=2" in out
    # with KL under full fine-tuning the learner's reference is a row; a worker builds none, so it has no row
    assert main(["plan", *TOY_RUN, *ASYNC, "algo.kl_coef=0.1"]) == 0
    kl_out = capsys.readouterr().out
    assert "reference model (KL)" in kl_out and "rollout worker: KL reference" not in kl_out
    # a synchronous plan prints none of it
    assert main(["plan", *TOY_RUN]) == 0
    sync_out = capsys.readouterr().out
    assert "rollout worker" not in sync_out and "weight board" not in sync_out


def test_json_report_names_the_workers(capsys):
    import json

    from mmrl.cli import main

    assert main(["plan", *TOY_RUN, *ASYNC, "plan.json=true"]) == 0
    out = json.loads(capsys.readouterr().out)
    *_, bd, _ = _plan(*ASYNC)
    assert (out["total"], out["learner"], out["workers"], out["rollout_workers"]) == (
        bd.total,
        bd.learner,
        bd.workers,
        1,
    )
    assert out["terms_bytes"]["worker_weights"] == bd.worker_weights
    assert out["terms_bytes"]["weight_board"] == bd.weight_board


def test_ram_check_refuses_a_cpu_run_that_fits_sync_but_not_with_its_workers(tmp_path, monkeypatch):
    from mmrl.config import load_config
    from mmrl.errors import ConfigError
    from mmrl.planning.report import check_fits_in_ram
    from tests.helpers import toy_overrides

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    sync_cfg = load_config(toy_overrides(tmp_path))
    async_cfg = load_config(toy_overrides(tmp_path, *ASYNC, "trainer.rollout_workers=2"))
    *_, sync, _ = _plan(*toy_overrides(tmp_path)[1:], "plan.optim=model")
    *_, two, _ = _plan(*toy_overrides(tmp_path)[1:], *ASYNC, "trainer.rollout_workers=2", "plan.optim=model")
    assert two.host_ram(1) == sync.total + 2 * (sync.params + sync.rollout) + two.weight_board
    ram = (sync.total + two.host_ram(1)) / 2 / GIB  # between the two
    assert check_fits_in_ram(sync_cfg, world_size=1, ram_gb=ram) is None
    with pytest.raises(
        ConfigError,
        match=r"needs about .* \(with 2 rollout worker\(s\) of .* GiB each\).*fewer trainer.rollout_workers",
    ):
        check_fits_in_ram(async_cfg, world_size=1, ram_gb=ram)
    assert check_fits_in_ram(async_cfg, world_size=1, ram_gb=two.host_ram(1) / GIB) is None  # just enough
    with pytest.raises(ConfigError):  # the device total of rank 0 fits, but not with the learner's weight board
        check_fits_in_ram(async_cfg, world_size=1, ram_gb=(two.total + two.weight_board // 2) / GIB)


def test_start_of_run_warning_names_the_workers():
    from mmrl.config import load_config
    from mmrl.planning.report import start_of_run_warning

    msg = start_of_run_warning(
        load_config(["task=toy_arithmetic", *ASYNC, "trainer.rollout_workers=3"]), device_gb=1e-6, world_size=1
    )
    assert msg is not None and "1 process(es), 3 rollout worker(s) on this device" in msg


def test_weight_board_bytes_equal_the_real_board(tmp_path):
    """The planner's board is the bytes of a real WeightBoard of the built toy policy (every state_dict entry, the
    tied embedding copied twice), and a worker's weights are the policy's unique parameter bytes."""
    import multiprocessing

    from mmrl.asynchronous.weights import WeightBoard, trainable_names
    from mmrl.builders import build_policy, build_task
    from mmrl.config import load_config
    from tests.helpers import toy_overrides

    overrides = toy_overrides(tmp_path, *ASYNC)
    cfg = load_config(overrides)
    policy = build_policy(cfg, build_task(cfg))
    names = trainable_names(policy.model, policy.trainable_parameters())
    board = WeightBoard(policy.model, names, 0, multiprocessing.get_context("spawn"))
    *_, bd, _ = _plan(*overrides[1:])
    assert bd.weight_board == sum(t.numel() * t.element_size() for t in board.tensors.values())
    unique = {id(p): p for p in policy.model.parameters()}.values()
    assert bd.worker_weights == sum(p.numel() * p.element_size() for p in unique) < bd.weight_board
    policy.close()


def test_docs_scaling_example_is_what_mmrl_plan_prints():
    """docs/scaling.md, "What `mmrl plan` reports": every line of the example is a line of the report (a line cut
    with '...' is its start), and the numbers of the text around it."""
    import re
    from pathlib import Path

    from mmrl.planning.report import build_plan, format_report

    doc = (Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text()
    section = doc[doc.index("**What `mmrl plan` reports.**") : doc.index("## `plan.*` keys")]
    command = re.search(r"Example, `mmrl plan ([^`]+)`", section.replace("\n", " ")).group(1).split()
    report = format_report(*build_plan(command)).splitlines()
    block = section.split("```")[3].strip("\n").splitlines()
    assert len(block) > 8
    for line in block:
        if line.strip() in ("", "..."):
            continue
        if line.endswith("...)") or line.endswith("..."):
            head = line[: line.index("...")]
            assert any(r.startswith(head) for r in report), line
        else:
            assert line in report, line
    assert not any("RAM of a CPU run" in r for r in report)  # a GPU run (1 GiB overhead): no CPU RAM line
    *_, sync, _ = build_plan([c for c in command if not c.startswith("trainer.rollout")])
    *_, bd, _ = build_plan(command)
    assert f"The synchronous run fits ({sync.total / GIB:.2f} GiB per device)" in section
    assert f"(KV cache {2 * sync.kv_cache / GIB:.2f} + prefill {2 * sync.prefill / GIB:.2f} GiB" in section
    assert bd.worker_rollout == 2 * sync.rollout and bd.worker_weights == sync.params
    assert f"= {bd.weight_board / GIB:.2f} GiB" in section and bd.weight_board == sync.params + 151936 * 2048 * 2


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_docs_sizing_rule_at_most_eta_plus_one_rounds_in_flight(eta):
    """docs/scaling.md, "Sizing N": without group filtering, at most eta + 1 rounds of B groups are handed out before
    the learner moves on, and each step it completes frees exactly one more: a worker beyond eta + 1 gets no round."""
    from mmrl.asynchronous.schedule import Schedule

    b = 4
    schedule = Schedule(b, eta, filter_groups=False, max_slots=b)
    rounds = []

    def start_all() -> list[int]:
        sizes = []
        while (n := schedule.next_round_size()) > 0:
            rounds.append(
                schedule.start_round(list(range(n)), list(range(n)), [(0, i) for i in range(n)], sampler_step=0)
            )
            sizes.append(n)
        return sizes

    assert start_all() == [b] * (eta + 1)
    schedule.finish_round(rounds[0].round_id, None, sampled_version=0, kept=[True] * b)
    assert schedule.pull()  # step 0 takes the first round's B groups
    assert start_all() == []  # nothing more until the learner's next version
    schedule.begin_step(1)
    assert start_all() == [b]
