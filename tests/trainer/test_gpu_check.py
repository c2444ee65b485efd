"""scripts/gpu_check.sh / scripts/gpu_check.py, the prepared GPU check of issue 13.

The CPU smoke run goes through the bash wrapper exactly as a person would run it (tiny offline VLM, 1 GRPO step per
configuration, ~15-30 s on 2 cores); the rest are fast tests of the script's helpers, with values worked out by hand.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
WRAPPER = ROOT / "scripts" / "gpu_check.sh"
GIB = 1024**3


def _load():
    spec = importlib.util.spec_from_file_location("mmrl_gpu_check_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    return mod


gc = _load()

COLUMNS = ["config", "status", "steps", "step s", "tok/s", "peak alloc GiB", "peak device GiB", "plan GiB", "notes"]


def parse_table(text: str) -> dict[str, dict[str, str]]:
    """The summary table printed by the check, as {config: {column: cell}} (columns cut at the header's offsets)."""
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("config ") and "plan GiB" in ln)
    head = lines[i]
    starts = [head.index(c) for c in COLUMNS]
    assert set(lines[i + 1]) == {"-"}, "a rule under the header"
    table = {}
    for ln in lines[i + 2 :]:
        if not ln.strip():
            break
        cells = [ln[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
        table[cells[0]] = dict(zip(COLUMNS, cells))
    return table


# ============================================================================ the CPU smoke run, end to end


def test_cpu_smoke_through_the_wrapper(tmp_path):
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    env.pop("MMRL_GPU_CHECK_MEMORY_DIR", None)
    report = tmp_path / "report.json"
    t0 = time.monotonic()
    p = subprocess.run(
        ["bash", str(WRAPPER), "--cpu-smoke", "--work", str(tmp_path / "work"), "--report", str(report)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )  # any cwd: it cds itself
    wall = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "mmrl GPU check (CPU smoke" in p.stdout
    table = parse_table(p.stdout)
    configs = ["hf/ddp x1", "hf/fsdp2 x1", "vllm/ddp x1", "vllm/fsdp2 x1"]
    assert list(table) == ["model: tiny_qwen2_5_vl (offline build)", *configs]
    for c in ("hf/ddp x1", "hf/fsdp2 x1"):
        row = table[c]
        assert row["status"] == "ok", row
        assert row["steps"] == "1"
        assert 0 < float(row["step s"]) < wall
        assert float(row["tok/s"]) > 0
        assert 0 < float(row["peak alloc GiB"]) < 64  # the peak RSS of the rank on CPU, said so in the notes
        assert row["peak device GiB"] == "-"  # no nvidia-smi here
        assert 0 < float(row["plan GiB"]) < 1  # mmrl plan's total for the ~0.7M-parameter tiny VLM
        assert "CPU: peak alloc = peak RSS" in row["notes"]
        assert "IS ratio" in row["notes"]  # read from the run's metrics.jsonl
    for c in ("vllm/ddp x1", "vllm/fsdp2 x1"):
        row = table[c]
        assert row["status"] == "skipped"
        assert row["step s"] == row["plan GiB"] == "-"
        assert "vLLM needs a CUDA GPU" in row["notes"]
        if importlib.util.find_spec("vllm") is None:
            assert "vLLM not importable here" in row["notes"]
    # the JSON report carries the same rows, unrounded
    rep = {r["config"]: r for r in json.loads(report.read_text())}
    assert list(rep) == list(table)
    for c in ("hf/ddp x1", "hf/fsdp2 x1"):
        assert rep[c]["step_s"] == pytest.approx(float(table[c]["step s"]), abs=0.005)
        # completion tokens / s = 1 rank x (group 2 x batch 1) samples x response length (<= 8 new tokens) / step time
        assert 0 < rep[c]["tokens_per_s"] * rep[c]["step_s"] <= 2 * 8 + 1e-6
    # the run directories are removed, the logs are kept
    work = tmp_path / "work"
    assert not any((work / "runs").iterdir())
    assert sorted(f.name for f in (work / "logs").iterdir()) == ["gpu-check-hf-ddp-x1.log", "gpu-check-hf-fsdp2-x1.log"]


def test_without_gpus_every_row_says_why(tmp_path, monkeypatch, capsys):
    """The real (non-smoke) check on a machine without GPUs builds nothing, runs nothing and exits 0."""
    monkeypatch.setattr(gc, "nvidia_smi", lambda field_name: [])  # as here; also on a GPU machine running the tests
    report = tmp_path / "report.json"
    assert gc.main(["--work", str(tmp_path / "work"), "--report", str(report)]) == 0
    table = parse_table(capsys.readouterr().out)
    assert list(table) == [
        "model: qwen2_5_vl_3b, random bf16 weights",
        "hf/ddp x1",
        "hf/fsdp2 x1",
        "vllm/ddp x1",
        "vllm/fsdp2 x1",
    ]
    assert table["model: qwen2_5_vl_3b, random bf16 weights"]["status"] == "skipped"
    assert "no GPU visible" in table["model: qwen2_5_vl_3b, random bf16 weights"]["notes"]
    for c in ("hf/ddp x1", "hf/fsdp2 x1", "vllm/ddp x1", "vllm/fsdp2 x1"):
        assert table[c]["status"] == "skipped"
        assert table[c]["notes"] == "no model (see the model row)"
    assert [r["status"] for r in json.loads(report.read_text())] == ["skipped"] * 5
    assert not (tmp_path / "work" / "qwen2_5_vl_3b-random").exists()


def test_wrapper_is_executable_and_strict():
    text = WRAPPER.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text
    assert "8 minutes" in text
    assert os.access(WRAPPER, os.X_OK)


# ============================================================================ reading a run


def test_summarise_skips_the_first_step_and_takes_medians():
    rows = [
        {"time/step": 10.0, "update/samples": 4, "response/length": 20},  # compilation / warm-up: not timed
        {"eval/reward": 1.0},  # not a step
        {
            "time/step": 2.0,
            "update/samples": 4,
            "response/length": 30,
            "rollout/is_ratio_min": 0.9,
            "rollout/is_ratio_max": 1.2,
            "rollout/logp_abs_diff": 0.01,
        },
        {
            "time/step": 4.0,
            "update/samples": 4,
            "response/length": 10,
            "rollout/is_ratio_min": 0.8,
            "rollout/is_ratio_max": 1.1,
            "rollout/logp_abs_diff": 0.03,
            "vllm/sync_checked": 434,
            "vllm/sync_max_abs_diff": 0.0,
            "vllm/sync_time": 1.234,
        },
    ]
    out = gc.summarise(rows, world=2)
    assert out["steps"] == 3
    assert out["step_s"] == 3.0  # median(2, 4)
    # per step: 2 ranks x 4 samples x length / time -> 2*4*30/2 = 120 and 2*4*10/4 = 20; median 70
    assert out["tokens_per_s"] == 70.0
    # the canary of the last step; the IS-ratio range and the largest |dlogp| over all steps
    assert out["notes"] == "sync canary 0 over 434 tensors, sync 1.23s, IS ratio [0.8, 1.2], |dlogp| 0.03"


def test_summarise_one_step_and_none():
    one = gc.summarise([{"time/step": 5.0, "update/samples": 2, "response/length": 8}], world=1)
    assert one == {"steps": 1, "step_s": 5.0, "tokens_per_s": 2 * 8 / 5.0, "notes": ""}
    assert gc.summarise([], world=4) == {"steps": 0}
    assert gc.summarise([{"eval/reward": 0.5}], world=4) == {"steps": 0}
    # a step without sample counts (or with a zero time) has a step time but no throughput
    nothr = gc.summarise([{"time/step": 1.0}, {"time/step": 3.0, "update/samples": 2}], world=1)
    assert nothr["step_s"] == 3.0 and "tokens_per_s" not in nothr


def test_read_memory_takes_the_max_over_ranks(tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "cuda_max_allocated": 2 * GIB, "max_rss_bytes": GIB}))
    (tmp_path / "rank1.json").write_text(
        json.dumps({"rank": 1, "cuda_max_allocated": 3 * GIB, "max_rss_bytes": GIB // 2})
    )
    (tmp_path / "rank2.json").write_text("{")  # being written: ignored
    (tmp_path / "other.json").write_text(json.dumps({"cuda_max_allocated": 99 * GIB}))  # not a rank file
    assert gc.read_memory(tmp_path) == (3.0, 1.0)
    assert gc.read_memory(tmp_path / "missing") == (None, None)


def test_memory_hook_records_only_in_workers(tmp_path):
    """The generated sitecustomize writes rank<RANK>.json at exit of a worker (LOCAL_RANK set), nothing otherwise."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(gc.MEMORY_HOOK)
    mem = tmp_path / "mem"
    mem.mkdir()
    base = dict(os.environ, PYTHONPATH=str(hook), MMRL_GPU_CHECK_MEMORY_DIR=str(mem))
    base.pop("LOCAL_RANK", None)
    subprocess.run([sys.executable, "-c", "pass"], env=base, check=True, timeout=60)
    assert list(mem.iterdir()) == []  # the launcher (no LOCAL_RANK) records nothing
    subprocess.run(
        [sys.executable, "-c", "x = bytearray(64 * 1024 * 1024)"],
        env=dict(base, LOCAL_RANK="0", RANK="3"),
        check=True,
        timeout=60,
    )
    rec = json.loads((mem / "rank3.json").read_text())
    assert rec["rank"] == 3
    assert rec["max_rss_bytes"] >= 64 * 1024 * 1024
    assert "cuda_max_allocated" not in rec  # torch never imported


def test_last_error_line(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("starting\nValueError: bad box\n  \nstep 1 done\n")
    assert gc._last_error(log) == "ValueError: bad box"
    log.write_text("one\ntwo\n")
    assert gc._last_error(log) == "two"
    log.write_text("")
    assert gc._last_error(log) == "no output"


# ============================================================================ the table


def test_format_table_aligns_columns():
    rows = [
        gc.Row(
            "a",
            "ok",
            steps=3,
            step_s=1.234,
            tokens_per_s=99.6,
            peak_alloc_gib=12.34,
            peak_device_gib=0.5,
            plan_gib=None,
            notes="n1",
        ),
        gc.Row("long-config", "skipped", notes="why"),
        gc.Row("x", "failed"),
    ]
    # column widths: config 11 ("long-config"), status 7 ("skipped"), then the headers' own widths:
    # steps 5, step s 6, tok/s 5, peak alloc GiB 14, peak device GiB 15, plan GiB 8; two spaces between columns
    lines = gc.format_table(rows).split("\n")
    assert lines[0] == (
        "config" + " " * 7 + "status" + " " * 3 + "steps  step s  tok/s  peak alloc GiB  "
        "peak device GiB  plan GiB  notes"
    )
    assert lines[1] == "-" * (11 + 7 + 5 + 6 + 5 + 14 + 15 + 8 + 2 * 8 + len("notes"))
    # 1.234 -> "1.23"; 99.6 tok/s -> "100"; 12.34 GiB -> "12.3"; 0.5 GiB (under 1) -> "0.500"; None -> "-"
    assert lines[2] == (
        "a"
        + " " * 12
        + "ok"
        + " " * 7
        + "3"
        + " " * 6
        + "1.23"
        + " " * 4
        + "100"
        + " " * 4
        + "12.3"
        + " " * 12
        + "0.500"
        + " " * 12
        + "-"
        + " " * 9
        + "n1"
    )
    assert lines[3] == (
        "long-config  skipped  0"
        + " " * 6
        + "-"
        + " " * 7
        + "-"
        + " " * 6
        + "-"
        + " " * 15
        + "-"
        + " " * 16
        + "-"
        + " " * 9
        + "why"
    )
    assert lines[4] == (
        "x"
        + " " * 12
        + "failed"
        + " " * 3
        + "0"
        + " " * 6
        + "-"
        + " " * 7
        + "-"
        + " " * 6
        + "-"
        + " " * 15
        + "-"
        + " " * 16
        + "-"
    )  # no notes: no trailing spaces
    assert len(lines) == 5


def test_gib_cells():
    assert gc._gib(None) == "-"
    assert gc._gib(0.022469) == "0.022"
    assert gc._gib(0.9996) == "1.000"
    assert gc._gib(1.0) == "1.0"
    assert gc._gib(26.07) == "26.1"


# ============================================================================ configurations


def test_train_overrides_of_a_gpu_vllm_run():
    s = gc.Settings(
        ["model=qwen2_5_vl_3b", "model.path=/m"],
        steps=3,
        group_size=4,
        max_new_tokens=32,
        device_gb=80.0,
        extra=["trainer.lr=1e-5"],
    )
    ov = gc.train_overrides(gc.SubRun("vllm", "fsdp2", 2), s, Path("/tmp/r"))
    assert ov[:3] == ["task=vqa_grounding", "model=qwen2_5_vl_3b", "model.path=/m"]
    for o in (
        "trainer.max_steps=3",
        "trainer.batch_size=2",
        "algo.group_size=4",
        "model.max_new_tokens=32",
        "trainer.sft_steps=0",
        "trainer.eval_every=0",
        "trainer.eval_at_end=false",
        "trainer.save_every=0",
        "trainer.strategy=fsdp2",
        "trainer.output_dir=/tmp/r",
        "trainer.run_name=gpu-check-vllm-fsdp2-x2",
        "model.rollout_engine=vllm",
        "model.vllm_sleep=true",
        "model.vllm_gpu_memory_utilization=0.3",
    ):
        assert o in ov, o
    assert "trainer.device=cpu" not in ov
    assert ov[-1] == "trainer.lr=1e-5"  # command-line extras last: they win


def test_train_overrides_load_as_a_config():
    """The overrides are valid mmrl config, and turn off the task's SFT warm start and periodic eval (the default
    vqa_grounding config has trainer.sft_steps=800: a 1-step smoke run would spend minutes in SFT)."""
    from mmrl.config import load_config

    s = gc.Settings(["model=tiny_qwen2_5_vl"], steps=1, group_size=2, max_new_tokens=8, device_gb=80.0, cpu=True)
    ov = gc.train_overrides(gc.SubRun("hf", "ddp", 1), s, Path("/tmp/r"))
    assert "trainer.device=cpu" in ov
    assert not any(o.startswith("model.vllm") for o in ov)
    cfg = load_config(ov)
    assert (cfg.trainer.sft_steps, cfg.trainer.eval_every, cfg.trainer.eval_at_end) == (0, 0, False)
    assert (cfg.trainer.max_steps, cfg.trainer.batch_size, cfg.algo.group_size) == (1, 1, 2)
    assert (cfg.model.name, cfg.model.rollout_engine, cfg.trainer.device) == ("tiny_qwen2_5_vl", "hf", "cpu")
    assert cfg.trainer.run_name == "gpu-check-hf-ddp-x1"


def test_plan_overrides():
    s = gc.Settings([], steps=3, group_size=4, max_new_tokens=32, device_gb=139.8)
    assert gc.plan_overrides(gc.SubRun("hf", "fsdp2", 4), s) == [
        "plan.world_size=4",
        "plan.strategy=fsdp2",
        "plan.device_gb=139.8",
        "plan.images=1",
        "plan.image_tokens=256",
        "plan.optim=model",
    ]
    s80 = gc.Settings([], steps=3, group_size=4, max_new_tokens=32, device_gb=80.0)
    assert gc.plan_overrides(gc.SubRun("vllm", "ddp", 1), s80)[:3] == [
        "plan.world_size=1",
        "plan.strategy=ddp",
        "plan.device_gb=80",
    ]


def test_sub_run_names():
    sub = gc.SubRun("vllm", "fsdp2", 8)
    assert sub.name == "vllm/fsdp2 x8"
    assert gc.run_name(sub) == "gpu-check-vllm-fsdp2-x8"


def test_predicted_gib_for_the_3b_folder(tmp_path):
    """mmrl plan reads the built folder's config.json: FSDP2 over 2 GPUs predicts less per device than DDP (sharded
    model states), the same at world size 1, and the colocated vLLM engine adds its share of the device."""
    config, processor = gc.random_vlm_config("qwen2_5_vl_3b")
    config.save_pretrained(tmp_path)
    s = gc.Settings(
        ["model=qwen2_5_vl_3b", f"model.path={tmp_path}"], steps=3, group_size=4, max_new_tokens=32, device_gb=80.0
    )

    def plan(engine, strategy, world):
        sub = gc.SubRun(engine, strategy, world)
        gib, note = gc.predicted_gib(gc.train_overrides(sub, s, tmp_path / "runs"), gc.plan_overrides(sub, s))
        assert note == ""
        return gib

    ddp1, fsdp1, ddp2, fsdp2 = (
        plan("hf", "ddp", 1),
        plan("hf", "fsdp2", 1),
        plan("hf", "ddp", 2),
        plan("hf", "fsdp2", 2),
    )
    # bf16 weights + grads + AdamW state in bf16 of the 3.09B trained (non-vision) parameters alone are ~17 GiB
    assert 17 < ddp1 < 80
    assert fsdp1 == pytest.approx(ddp1) and ddp2 == pytest.approx(ddp1)
    assert fsdp2 < ddp2 - 5
    assert plan("vllm", "ddp", 1) > ddp1 + 0.3 * 80 * 0.5


def test_predicted_gib_says_why_it_cannot():
    gib, note = gc.predicted_gib(["task=vqa_grounding", "model.bogus=1"], [])
    assert gib is None
    assert note.startswith("plan: ConfigError: unknown key 'model.bogus'")
    assert "\n" not in note


# ============================================================================ skip reasons


def _settings(cpu: bool):
    return gc.Settings([], steps=1, group_size=2, max_new_tokens=8, device_gb=80.0, cpu=cpu)


def test_skip_reasons(monkeypatch):
    ok_model, no_model = gc.Row("model", "ok"), gc.Row("model", "failed")
    later = time.monotonic() + 3600
    monkeypatch.setattr(gc, "_vllm_importable", lambda: False)
    assert (
        gc._skip_reason(gc.SubRun("hf", "ddp", 1), _settings(False), no_model, 8, later)
        == "no model (see the model row)"
    )
    cpu_vllm = gc._skip_reason(gc.SubRun("vllm", "ddp", 1), _settings(True), ok_model, 0, later)
    assert (
        cpu_vllm == "vLLM needs a CUDA GPU (CPU smoke); vLLM not importable here (pip install 'mmrl[vllm]'; "
        "docs/vllm.md)"
    )
    assert gc._skip_reason(gc.SubRun("vllm", "fsdp2", 1), _settings(False), ok_model, 1, later).startswith(
        "vLLM not importable here"
    )
    assert gc._skip_reason(gc.SubRun("hf", "ddp", 1), _settings(True), ok_model, 0, later) == ""  # CPU: no GPU needed
    monkeypatch.setattr(gc, "_vllm_importable", lambda: True)
    assert (
        gc._skip_reason(gc.SubRun("vllm", "ddp", 1), _settings(True), ok_model, 0, later)
        == "vLLM needs a CUDA GPU (CPU smoke)"
    )
    assert gc._skip_reason(gc.SubRun("vllm", "ddp", 1), _settings(False), ok_model, 1, later) == ""
    assert (
        gc._skip_reason(gc.SubRun("hf", "fsdp2", 2), _settings(False), ok_model, 1, later)
        == "2 processes need 2 GPUs, 1 visible"
    )
    soon = gc._skip_reason(gc.SubRun("hf", "ddp", 1), _settings(False), ok_model, 1, time.monotonic() + 30)
    assert soon.startswith("time budget: ") and soon.endswith("s left of the check's budget")


def test_worker_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cpu = gc.worker_env(tmp_path / "hook", tmp_path / "mem", cpu=True)
    assert cpu["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "hook"), str(gc.REPO), "/elsewhere"]
    assert cpu["MMRL_GPU_CHECK_MEMORY_DIR"] == str(tmp_path / "mem")
    assert (cpu["CUDA_VISIBLE_DEVICES"], cpu["OMP_NUM_THREADS"], cpu["PYTHONUNBUFFERED"]) == ("", "1", "1")
    gpu = gc.worker_env(tmp_path / "hook", tmp_path / "mem", cpu=False)
    assert (gpu["CUDA_VISIBLE_DEVICES"], gpu["OMP_NUM_THREADS"]) == ("0,1", "4")


# ============================================================================ the model


def test_random_vlm_config_has_the_published_parameter_count():
    """Built on the meta device (no memory, no weights): exactly Qwen2.5-VL-3B-Instruct's 3,754,622,976 parameters,
    which is also what the planner's table says."""
    import torch
    from transformers import AutoModelForImageTextToText

    from mmrl.planning.architectures import real_vlm

    config, processor = gc.random_vlm_config("qwen2_5_vl_3b")
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == 3_754_622_976
    assert real_vlm("qwen2_5_vl_3b").total_params() == 3_754_622_976
    t, v = config.text_config, config.vision_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads) == (2048, 36, 16, 2)
    assert (v.depth, v.hidden_size, v.out_hidden_size, v.window_size) == (32, 1280, 2048, 112)
    assert list(v.fullatt_block_indexes) == [7, 15, 23, 31]
    assert config.tie_word_embeddings is True
    # the offline tokenizer's special tokens fit the real vocabulary
    tok = processor.tokenizer
    assert max(tok.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|im_end|>"])) < t.vocab_size
    assert config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")


def test_random_vlm_config_refuses_other_families():
    with pytest.raises(ValueError, match="qwen3_vl"):
        gc.random_vlm_config("qwen3_vl_4b")


def test_a_built_model_folder_is_reused(tmp_path):
    (tmp_path / gc.MODEL_MARKER).write_text(json.dumps({"preset": "qwen2_5_vl_3b", "num_parameters": 123}))
    assert gc.build_random_vlm(tmp_path, device="meta") == 123  # nothing built: the marker is read back
    assert sorted(f.name for f in tmp_path.iterdir()) == [gc.MODEL_MARKER]
