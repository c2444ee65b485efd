"""scripts/gpu_check.sh / scripts/gpu_check.py, the prepared GPU check of issue 13.

The CPU smoke run goes through the bash wrapper exactly as a person would run it (tiny offline VLM and π0 at the tiny
builder's sizes, 1 GRPO step per configuration, ~30-45 s on 2 busy cores); the rest are fast tests of the script's
helpers, with values worked out by hand, and of the real-size π0 build on the meta device (shapes, no memory).
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
    # run order: each model with its first row, then the VLM's other configurations
    assert list(table) == [
        "model: tiny_qwen2_5_vl (offline build)",
        "hf/ddp x1",
        "model: pi0 at tiny sizes, random weights (CPU)",
        "pi0/ddp x1",
        "hf/ddp x1 async",
        "hf/fsdp2 x1",
        "vllm/ddp x1",
        "vllm/fsdp2 x1",
    ]
    for c in ("hf/ddp x1", "hf/fsdp2 x1", "hf/ddp x1 async"):
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
    # the asynchronous row: the staleness bound read from its metrics.jsonl; its plan counts the worker's copy
    assert "staleness max 0 <= 1" in table["hf/ddp x1 async"]["notes"]
    assert float(table["hf/ddp x1 async"]["plan GiB"]) > float(table["hf/ddp x1"]["plan GiB"])
    for c in ("vllm/ddp x1", "vllm/fsdp2 x1"):
        row = table[c]
        assert row["status"] == "skipped"
        assert row["step s"] == row["plan GiB"] == "-"
        assert "vLLM needs a CUDA GPU" in row["notes"]
        if importlib.util.find_spec("vllm") is None:
            assert "vLLM not importable here" in row["notes"]
    # π0: the folder built by the real path's builder at the tiny builder's sizes, loaded by model=tiny_pi0
    work = tmp_path / "work"
    folder = work / "tiny_pi0-random"
    tiny_params = gc.pi0_build_arch("tiny_pi0").model_params()
    model = table["model: pi0 at tiny sizes, random weights (CPU)"]
    assert model["status"] == "ok"
    assert model["notes"].startswith(f"{tiny_params:,} parameters, built in ")
    assert json.loads((folder / gc.MODEL_MARKER).read_text())["num_parameters"] == tiny_params == 138_400
    vla = table["pi0/ddp x1"]
    assert vla["status"] == "ok", vla
    assert vla["steps"] == "1"
    assert 0 < float(vla["step s"]) < wall
    assert vla["tok/s"] == "-"  # π0 samples action chunks: its rate is env actions / s, in the notes
    assert 0 < float(vla["peak alloc GiB"]) < 64
    assert vla["peak device GiB"] == "-"
    assert "CPU: peak alloc = peak RSS" in vla["notes"] and "env actions/s" in vla["notes"]
    assert "IS ratio" in vla["notes"]  # the flow policy's rollout vs recomputed log-probs, from metrics.jsonl
    # the plan column is mmrl plan's total for this sub-run's own overrides (the folder's header read back)
    sub, vla_settings = (
        gc.SubRun("flow", "ddp", 1, kind="vla"),
        _vla_settings(gc.vla_model_overrides("tiny_pi0", folder)),
    )
    planned, note = gc.predicted_gib(
        gc.train_overrides(sub, vla_settings, work / "runs"), gc.plan_overrides(sub, vla_settings)
    )
    assert note == "" and 0 < planned < 1
    assert float(vla["plan GiB"]) == pytest.approx(planned, abs=0.0005)
    # the JSON report carries the same rows, unrounded
    rep = {r["config"]: r for r in json.loads(report.read_text())}
    assert list(rep) == list(table)
    for c in ("hf/ddp x1", "hf/fsdp2 x1"):
        assert rep[c]["step_s"] == pytest.approx(float(table[c]["step s"]), abs=0.005)
        # completion tokens / s = 1 rank x (group 2 x batch 1) samples x response length (<= 8 new tokens) / step time
        assert 0 < rep[c]["tokens_per_s"] * rep[c]["step_s"] <= 2 * 8 + 1e-6
        assert rep[c]["actions_per_s"] is None
    # env actions / s = 1 rank x (group 2 x batch 1) episodes x episode length (<= 16 env steps) / step time
    assert rep["pi0/ddp x1"]["tokens_per_s"] is None
    assert 0 < rep["pi0/ddp x1"]["actions_per_s"] * rep["pi0/ddp x1"]["step_s"] <= 2 * 16 + 1e-6
    assert rep["pi0/ddp x1"]["plan_gib"] == pytest.approx(planned)
    # the run directories are removed, the logs are kept
    assert not any((work / "runs").iterdir())
    assert sorted(f.name for f in (work / "logs").iterdir()) == [
        "gpu-check-hf-ddp-x1-async.log",
        "gpu-check-hf-ddp-x1.log",
        "gpu-check-hf-fsdp2-x1.log",
        "gpu-check-pi0-ddp-x1.log",
    ]


def test_without_gpus_every_row_says_why(tmp_path, monkeypatch, capsys):
    """The real (non-smoke) check on a machine without GPUs builds nothing, runs nothing and exits 0."""
    monkeypatch.setattr(gc, "nvidia_smi", lambda field_name: [])  # as here; also on a GPU machine running the tests
    report = tmp_path / "report.json"
    assert gc.main(["--work", str(tmp_path / "work"), "--report", str(report)]) == 0
    table = parse_table(capsys.readouterr().out)
    vlm_model, vla_model = "model: qwen2_5_vl_3b, random bf16 weights", "model: pi0, random weights (bf16 on disk)"
    assert list(table) == [
        vlm_model,
        "hf/ddp x1",
        vla_model,
        "pi0/ddp x1",
        "hf/ddp x1 async",
        "hf/fsdp2 x1",
        "vllm/ddp x1",
        "vllm/fsdp2 x1",
    ]
    for m in (vlm_model, vla_model):
        assert table[m]["status"] == "skipped"
        assert "no GPU visible" in table[m]["notes"]
    for c in ("hf/ddp x1", "pi0/ddp x1", "hf/ddp x1 async", "hf/fsdp2 x1", "vllm/ddp x1", "vllm/fsdp2 x1"):
        assert table[c]["status"] == "skipped"
        assert table[c]["notes"] == "no model (see the model row)"
    assert [r["status"] for r in json.loads(report.read_text())] == ["skipped"] * 8
    assert not (tmp_path / "work" / "qwen2_5_vl_3b-random").exists()
    assert not (tmp_path / "work" / "pi0-random").exists()


def test_only_one_part(tmp_path, monkeypatch, capsys):
    """--only vla: π0's rows alone (a short device session); --only vlm: the VLM's alone."""
    monkeypatch.setattr(gc, "nvidia_smi", lambda field_name: [])
    assert gc.main(["--only", "vla", "--work", str(tmp_path / "work")]) == 0
    table = parse_table(capsys.readouterr().out)
    assert list(table) == ["model: pi0, random weights (bf16 on disk)", "pi0/ddp x1"]
    assert gc.main(["--only", "vlm", "--work", str(tmp_path / "work")]) == 0
    table = parse_table(capsys.readouterr().out)
    assert list(table) == [
        "model: qwen2_5_vl_3b, random bf16 weights",
        "hf/ddp x1",
        "hf/ddp x1 async",
        "hf/fsdp2 x1",
        "vllm/ddp x1",
        "vllm/fsdp2 x1",
    ]
    assert gc.main(["--only", "vlm", "--no-async", "--work", str(tmp_path / "work")]) == 0
    assert "hf/ddp x1 async" not in parse_table(capsys.readouterr().out)


def test_gpu_path_runs_each_part_with_its_model_and_timeout(tmp_path, monkeypatch, capsys):
    """One (faked) 141 GB GPU, builds and sub-runs faked: the order of the table, each part's own timeout, and the
    overrides a π0 sub-run gets (model=pi0, the built folder, its chunk 50; VLM extras not passed to it)."""
    monkeypatch.setattr(gc, "nvidia_smi", lambda field_name: [143771.0])  # MiB
    monkeypatch.setattr(gc, "_vllm_importable", lambda: False)
    built, ran = [], []

    def build(name, folder, preset, deadline, **kw):
        built.append((preset, folder.name, kw.get("device", "cuda")))
        return gc.Row(name, "ok", notes="built")

    def run(sub, s, work, timeout_s):
        ran.append((sub.name, round(timeout_s), list(s.model_overrides), list(s.extra), s.device_gb))
        return gc.Row(sub.name, "ok", steps=s.steps, step_s=1.0)

    monkeypatch.setattr(gc, "_build_model_row", build)
    monkeypatch.setattr(gc, "run_sub", run)
    work = tmp_path / "work"
    assert gc.main(["--work", str(work), "--budget-s", "3600", "model.max_pixels=200704"]) == 0
    table = parse_table(capsys.readouterr().out)
    assert list(table) == [
        "model: qwen2_5_vl_3b, random bf16 weights",
        "hf/ddp x1",
        "model: pi0, random weights (bf16 on disk)",
        "pi0/ddp x1",
        "hf/ddp x1 async",
        "hf/fsdp2 x1",
        "vllm/ddp x1",
        "vllm/fsdp2 x1",
    ]
    assert built == [("qwen2_5_vl_3b", "qwen2_5_vl_3b-random", "cuda"), ("pi0", "pi0-random", "cuda")]
    vlm_model = ["model=qwen2_5_vl_3b", f"model.path={work / 'qwen2_5_vl_3b-random'}"]
    pi0_model = ["model=pi0", f"model.path={work / 'pi0-random'}", "model.chunk=50"]
    gb = 143771.0 / 1024
    assert ran == [
        ("hf/ddp x1", 170, vlm_model, ["model.max_pixels=200704"], gb),
        ("pi0/ddp x1", 150, pi0_model, [], gb),
        ("hf/ddp x1 async", 170, vlm_model, ["model.max_pixels=200704"], gb),
        ("hf/fsdp2 x1", 170, vlm_model, ["model.max_pixels=200704"], gb),
    ]
    assert table["vllm/ddp x1"]["notes"].startswith("vLLM not importable here")


def test_run_order_puts_one_row_of_each_model_first():
    vlm = [gc.SubRun(e, x, 2) for e in ("hf", "vllm") for x in ("ddp", "fsdp2")]
    vla = gc.vla_sub_runs(2)
    assert vla == [gc.SubRun("flow", "ddp", 1, kind="vla"), gc.SubRun("flow", "fsdp2", 2, kind="vla")]
    assert gc.run_order(vlm, vla) == ["vlm", vlm[0], "vla", vla[0], vlm[1], vlm[2], vlm[3], vla[1]]
    assert gc.vla_sub_runs(1) == [gc.SubRun("flow", "ddp", 1, kind="vla")]  # FSDP2 over one GPU: the same numbers
    assert gc.run_order([], gc.vla_sub_runs(1)) == ["vla", gc.SubRun("flow", "ddp", 1, kind="vla")]
    assert gc.run_order(vlm[:1], []) == ["vlm", vlm[0]]


def test_vlm_sub_runs_put_the_async_one_second():
    subs = gc.vlm_sub_runs(2, ["hf", "vllm"], ["ddp", "fsdp2"], asynchronous=True)
    assert [s.name for s in subs] == [
        "hf/ddp x2",
        "hf/ddp x2 async",
        "hf/fsdp2 x2",
        "vllm/ddp x2",
        "vllm/fsdp2 x2",
    ]
    assert subs[1] == gc.SubRun("hf", "ddp", 2, rollout="async")  # DDP learners, the workers on rank 0's GPU
    assert gc.vlm_sub_runs(1, ["hf"], ["ddp"], asynchronous=False) == [gc.SubRun("hf", "ddp", 1)]
    assert gc.vlm_sub_runs(1, [], [], asynchronous=True) == [gc.SubRun("hf", "ddp", 1, rollout="async")]


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


def test_summarise_a_vla_run_counts_env_actions():
    """π0's response/length counts policy calls, not tokens: the rate is env actions executed per second of step."""
    rows = [
        {"time/step": 30.0, "update/samples": 2, "rollout/episode_length": 16.0, "response/length": 2.0},
        {"time/step": 2.0, "update/samples": 2, "rollout/episode_length": 16.0, "response/length": 2.0},
        {
            "time/step": 4.0,
            "update/samples": 2,
            "rollout/episode_length": 12.0,
            "response/length": 2.0,
            "rollout/is_ratio_min": 0.99,
            "rollout/is_ratio_max": 1.01,
            "rollout/logp_abs_diff": 0.002,
        },
    ]
    out = gc.summarise(rows, world=2, kind="vla")
    # per timed step: 2 ranks x 2 episodes x length / time -> 2*2*16/2 = 32 and 2*2*12/4 = 12; median 22
    assert out["actions_per_s"] == 22.0
    assert "tokens_per_s" not in out
    assert (out["steps"], out["step_s"]) == (3, 3.0)
    assert out["notes"] == "22 env actions/s, IS ratio [0.99, 1.01], |dlogp| 0.002"
    assert "actions_per_s" not in gc.summarise(rows, world=2)  # a VLM run: tokens


def test_staleness_check_of_an_async_run():
    """The async row's extra check on its metrics.jsonl rows: async/staleness_max present, never above 1."""
    step = {"time/step": 1.0}
    assert gc.staleness_check([{**step, "async/staleness_max": 0.0}, {**step, "async/staleness_max": 1.0}]) == ""
    # a step that trained no group logs no staleness; the others still count
    assert gc.staleness_check([step, {**step, "async/staleness_max": 1.0}]) == ""
    assert gc.staleness_check([{**step, "async/staleness_max": 2.0}]) == "async/staleness_max 2 > algo.max_staleness=1"
    assert gc.staleness_check([{**step, "async/staleness_max": 2.0}], bound=2) == ""
    assert gc.staleness_check([step, step]).startswith("no async/staleness_max in metrics.jsonl")
    assert gc.staleness_check([]).startswith("no async/staleness_max")


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


def test_memory_hook_skips_the_processes_a_worker_starts(tmp_path):
    """A worker's children (the VLA env workers, spawned helpers) inherit LOCAL_RANK / RANK but must not write the
    rank's file: the last write would be theirs, without the rank's CUDA peak, once the run is killed."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(gc.MEMORY_HOOK)
    mem = tmp_path / "mem"
    mem.mkdir()
    env = dict(os.environ, PYTHONPATH=str(hook), MMRL_GPU_CHECK_MEMORY_DIR=str(mem), LOCAL_RANK="0", RANK="0")
    env.pop("MMRL_GPU_CHECK_RECORDER", None)
    recording = "import threading; print(any(t.name == 'mmrl-gpu-check-memory' for t in threading.enumerate()))"
    code = (
        "import os, subprocess, sys\n"
        f"{recording}\n"
        f"sys.stdout.flush(); subprocess.run([sys.executable, '-c', {recording!r}], check=True)\n"
        "print(os.environ['MMRL_GPU_CHECK_RECORDER'] == str(os.getpid()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "False", "True"]  # the worker records, its child does not
    assert [f.name for f in mem.iterdir()] == ["rank0.json"]


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
        extra=["trainer.optim.lr=1e-5"],
    )
    ov = gc.train_overrides(gc.SubRun("vllm", "fsdp2", 2), s, Path("/tmp/r"))
    assert ov[:3] == ["task=vqa_grounding", "model=qwen2_5_vl_3b", "model.path=/m"]
    for o in (
        "trainer.max_steps=3",
        "trainer.batch_size=2",
        "algo.group_size=4",
        "model.max_new_tokens=32",
        "trainer.warm_start.steps=0",
        "trainer.eval.every=0",
        "trainer.eval.at_end=false",
        "trainer.checkpointing.save_every=0",
        "trainer.strategy=fsdp2",
        "trainer.output_dir=/tmp/r",
        "trainer.run_name=gpu-check-vllm-fsdp2-x2",
        "model.rollout_engine=vllm",
        "model.vllm_sleep=true",
        "model.vllm_gpu_memory_utilization=0.3",
    ):
        assert o in ov, o
    assert "trainer.device=cpu" not in ov
    assert ov[-1] == "trainer.optim.lr=1e-5"  # command-line extras last: they win


def test_train_overrides_load_as_a_config():
    """The overrides are valid mmrl config, and turn off the task's SFT warm start and periodic eval (the default
    vqa_grounding config has trainer.warm_start.steps=800: a 1-step smoke run would spend minutes in SFT)."""
    from mmrl.config import load_config

    s = gc.Settings(["model=tiny_qwen2_5_vl"], steps=1, group_size=2, max_new_tokens=8, device_gb=80.0, cpu=True)
    ov = gc.train_overrides(gc.SubRun("hf", "ddp", 1), s, Path("/tmp/r"))
    assert "trainer.device=cpu" in ov
    assert not any(o.startswith("model.vllm") for o in ov)
    cfg = load_config(ov)
    assert (cfg.trainer.warm_start.steps, cfg.trainer.eval.every, cfg.trainer.eval.at_end) == (0, 0, False)
    assert (cfg.trainer.max_steps, cfg.trainer.batch_size, cfg.algo.group_size) == (1, 1, 2)
    assert (cfg.model.name, cfg.model.rollout_engine, cfg.trainer.device) == ("tiny_qwen2_5_vl", "hf", "cpu")
    assert cfg.trainer.run_name == "gpu-check-hf-ddp-x1"
    assert (cfg.trainer.rollout, cfg.algo.truncated_is) == ("sync", False)
    # the asynchronous sub-run: the same run with the async settings, also valid config (a typo fails here)
    ov_async = gc.train_overrides(gc.SubRun("hf", "ddp", 1, rollout="async"), s, Path("/tmp/r"))
    assert ov_async[-3:] == ["trainer.rollout=async", "algo.max_staleness=1", "algo.truncated_is=true"]
    cfg = load_config(ov_async)
    assert (cfg.trainer.rollout, cfg.trainer.rollout_workers) == ("async", 1)
    assert (cfg.algo.max_staleness, cfg.algo.truncated_is) == (gc.ASYNC_MAX_STALENESS, True) == (1, True)
    assert cfg.trainer.run_name == "gpu-check-hf-ddp-x1-async"
    # otherwise the sync sub-run's overrides, with its own run folder
    assert ov_async[:-3] == [o + "-async" if o.startswith("trainer.run_name=") else o for o in ov]


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
    # π0: the prefix comes from the folder (its cameras, SigLIP tokens, prompt length), AdamW as it holds it
    assert gc.plan_overrides(gc.SubRun("flow", "fsdp2", 2, kind="vla"), s) == [
        "plan.world_size=2",
        "plan.strategy=fsdp2",
        "plan.device_gb=139.8",
    ]


def test_sub_run_names():
    sub = gc.SubRun("vllm", "fsdp2", 8)
    assert sub.name == "vllm/fsdp2 x8"
    assert gc.run_name(sub) == "gpu-check-vllm-fsdp2-x8"
    asynchronous = gc.SubRun("hf", "ddp", 2, rollout="async")
    assert (asynchronous.name, gc.run_name(asynchronous)) == ("hf/ddp x2 async", "gpu-check-hf-ddp-x2-async")
    vla = gc.SubRun("flow", "ddp", 1, kind="vla")
    assert vla.name == "pi0/ddp x1"
    assert gc.run_name(vla) == "gpu-check-pi0-ddp-x1"


def _vla_settings(model_overrides, cpu=True, device_gb=80.0):
    return gc.Settings(model_overrides, steps=1, group_size=2, max_new_tokens=0, device_gb=device_gb, cpu=cpu)


def test_vla_train_overrides():
    """model=pi0 with the built folder and its chunk, task=vla_reach on one task with a few demos, no SFT, no eval,
    no group filter (random weights never succeed), one item per rank and step; the VLM's extras are not added."""
    s = gc.Settings(
        gc.vla_model_overrides("pi0", Path("/w/pi0-random")),
        steps=3,
        group_size=2,
        max_new_tokens=0,
        device_gb=139.8,
    )
    ov = gc.train_overrides(gc.SubRun("flow", "fsdp2", 2, kind="vla"), s, Path("/tmp/r"))
    assert ov[:4] == ["task=vla_reach", "model=pi0", "model.path=/w/pi0-random", "model.chunk=50"]
    for o in (
        "task.tasks=[reach_red]",
        "task.demo_episodes=4",
        "trainer.max_steps=3",
        "trainer.batch_size=2",
        "algo.group_size=2",
        "algo.filter_groups=false",
        "trainer.warm_start.steps=0",
        "trainer.eval.every=0",
        "trainer.eval.at_end=false",
        "trainer.checkpointing.save_every=0",
        "trainer.strategy=fsdp2",
        "trainer.output_dir=/tmp/r",
        "trainer.run_name=gpu-check-pi0-fsdp2-x2",
    ):
        assert o in ov, o
    assert not any(o.startswith(("model.rollout_engine", "model.max_new_tokens", "trainer.device")) for o in ov)
    assert gc.vla_model_overrides("tiny_pi0", Path("/w/t")) == ["model=tiny_pi0", "model.path=/w/t", "model.chunk=4"]


def test_vla_train_overrides_load_as_a_config():
    from mmrl.config import load_config

    ov = gc.train_overrides(
        gc.SubRun("flow", "ddp", 1, kind="vla"), _vla_settings(gc.vla_model_overrides("pi0", Path("/w/p"))), Path("/r")
    )
    cfg = load_config(ov)
    m = cfg.model
    assert (m.name, m.architecture, m.action_head, m.path, m.chunk, m.num_steps) == (
        "pi0",
        "pi0",
        "flow",
        "/w/p",
        50,
        10,
    )
    assert (cfg.task.name, cfg.task.tasks, cfg.task.demo_episodes) == ("vla_reach", ["reach_red"], 4)
    assert (cfg.trainer.warm_start.steps, cfg.trainer.eval.every, cfg.trainer.eval.at_end) == (0, 0, False)
    assert (cfg.trainer.max_steps, cfg.trainer.batch_size, cfg.algo.group_size, cfg.algo.filter_groups) == (
        1,
        1,
        2,
        False,
    )
    assert (cfg.trainer.device, cfg.trainer.run_name) == ("cpu", "gpu-check-pi0-ddp-x1")


def test_vla_task_io_is_the_tasks():
    """The built folder's features are what task=vla_reach feeds the policy (a mismatch is refused at load)."""
    from mmrl.adapters.vla.lerobot.policy import camera_features
    from mmrl.config import load_config
    from mmrl.tasks import get_task_class
    from simulators.tabletop.env import PROPRIO_DIM

    io = gc.VLA_TASK_IO
    task = get_task_class("vla_reach")
    assert io["state_dim"] == PROPRIO_DIM == 7
    assert io["action_dim"] == task.action_dim == 4
    assert io["cameras"] == list(camera_features(list(task.cameras), {}).values()) == ["observation.images.image"]
    side = load_config(["task=vla_reach"]).task.image_size
    assert io["image_shape"] == [3, side, side] == [3, 128, 128]


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
    # π0 loads a 16 GB float32 model first: it needs 90 s left where a VLM row starts with 60
    vla, in75 = gc.SubRun("flow", "ddp", 1, kind="vla"), time.monotonic() + 75
    assert gc._skip_reason(gc.SubRun("hf", "ddp", 1), _settings(False), ok_model, 1, in75) == ""
    assert gc._skip_reason(vla, _settings(False), ok_model, 1, in75).startswith("time budget: ")
    assert gc._skip_reason(vla, _settings(False), ok_model, 1, later) == ""
    assert gc._skip_reason(vla, _settings(True), ok_model, 0, later) == ""
    assert gc._skip_reason(vla, _settings(False), no_model, 1, later) == "no model (see the model row)"
    two = gc.SubRun("flow", "fsdp2", 2, kind="vla")
    assert gc._skip_reason(two, _settings(False), ok_model, 1, later) == "2 processes need 2 GPUs, 1 visible"


def test_vla_build_skipped_when_time_is_short(tmp_path, monkeypatch):
    """With less than VLA_BUILD_MIN_S left π0 is not built (its row says why), unless a built folder is there."""
    monkeypatch.setattr(gc, "_build_model_row", lambda name, *a, **k: gc.Row(name, "ok", notes="built"))
    soon = time.monotonic() + 100
    row, ov = gc._model_row("vla", False, tmp_path, soon, gpus=1)
    assert (row.config, row.status, ov) == ("model: pi0, random weights (bf16 on disk)", "skipped", [])
    assert row.notes.startswith("time budget: ") and row.notes.endswith("s left, a π0 build and run need 120s")
    folder = tmp_path / "pi0-random"
    folder.mkdir()
    (folder / gc.MODEL_MARKER).write_text(json.dumps({**gc.pi0_build_info("pi0"), "num_parameters": 1}))
    row, ov = gc._model_row("vla", False, tmp_path, soon, gpus=1)
    assert row.status == "ok" and ov == ["model=pi0", f"model.path={folder}", "model.chunk=50"]
    row, ov = gc._model_row("vla", False, tmp_path, soon, gpus=0)
    assert row.status == "skipped" and row.notes.startswith("no GPU visible") and ov == []


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


def test_random_pi0_has_the_published_parameter_count():
    """π0 at its published size, on the meta device (no memory): mmrl's model has exactly the planner's
    3,238,046,480 parameters (SigLIP So400m + projector, Gemma 2B, the 300M expert), the checkpoint with LeRobot's
    unused LM heads 4,028,019,472; the loader reads the same sizes back from the tensors."""
    from mmrl.adapters.vla.lerobot import checkpoint as ck
    from mmrl.planning.lerobot import published_arch

    arch = gc.pi0_build_arch("pi0")
    assert arch == published_arch("pi0")
    tensors = gc.random_pi0_tensors(arch, device="meta")
    model = sum(t.numel() for k, t in tensors.items() if k not in ck.PI0_UNUSED_TENSORS)
    assert model == arch.model_params() == 3_238_046_480
    assert sum(t.numel() for t in tensors.values()) == arch.checkpoint_params() == 4_028_019_472
    assert model == pytest.approx(3.24e9, rel=1e-3)
    mmrl_named, unused = ck.to_mmrl_names(tensors, prefixes=ck.PI0_PREFIXES, unused_names=ck.PI0_UNUSED_TENSORS)
    assert sorted(unused) == sorted(ck.PI0_UNUSED_TENSORS)
    read = ck._pi0_config({"type": "pi0", "chunk_size": 50, "image_resolution": [224, 224]}, mmrl_named)
    built = gc.pi0_config(arch)
    for name in ("vocab_size", "width", "depth", "intermediate", "num_heads", "num_kv_heads", "head_dim"):
        assert getattr(read, name) == getattr(built, name), name
    for name in ("expert_width", "expert_intermediate", "max_state_dim", "max_action_dim", "image_size"):
        assert getattr(read, name) == getattr(built, name), name
    assert read.vision_config == built.vision_config
    assert (built.width, built.depth, built.intermediate, built.head_dim, built.vocab_size) == (
        2048,
        18,
        16384,
        256,
        257152,
    )
    assert (built.expert_width, built.expert_intermediate, built.vision_config["hidden_size"]) == (1024, 4096, 1152)


def test_predicted_gib_for_the_pi0_folder(tmp_path):
    """The real-size folder's files (config.json, processors, tokenizer) and its model.safetensors header (shapes
    from the meta device, no data: all mmrl plan reads) plan like the published π0 for the sub-run's overrides."""
    from mmrl.planning.lerobot import arch_from_folder

    arch = gc.pi0_build_arch("pi0")
    gc.write_pi0_io_files(tmp_path, arch)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["type"], cfg["chunk_size"], cfg["image_resolution"], cfg["tokenizer_max_length"]) == (
        "pi0",
        50,
        [224, 224],
        48,
    )
    assert list(cfg["input_features"]) == ["observation.images.image", "observation.state"]
    assert (tmp_path / "tokenizer" / "tokenizer_config.json").is_file()
    shapes = {k: tuple(t.shape) for k, t in gc.random_pi0_tensors(arch, device="meta").items()}
    (tmp_path / "model.safetensors").write_bytes(gc.safetensors_header(shapes, "bfloat16"))
    read = arch_from_folder(tmp_path)
    assert (read.model_params(), read.checkpoint_params()) == (3_238_046_480, 4_028_019_472)
    assert (read.cameras, read.tokens_per_image, read.chunk) == (1, 256, 50)

    def plan(strategy, world):
        s = _vla_settings(gc.vla_model_overrides("pi0", tmp_path), cpu=False, device_gb=139.8)
        sub = gc.SubRun("flow", strategy, world, kind="vla")
        gib, note = gc.predicted_gib(gc.train_overrides(sub, s, tmp_path / "runs"), gc.plan_overrides(sub, s))
        assert note == ""
        return gib

    # float32 weights 12.06 + gradients of the 2.82e9 trainable 10.52 + AdamW 21.03 + 1 GiB overhead = 44.6 GiB
    # before activations (4 rows: 2 episodes x 2 policy calls of 304 prefix tokens, 9 expert passes each)
    ddp = plan("ddp", 1)
    assert 44.6 < ddp < 139.8
    assert plan("fsdp2", 2) < ddp - 10  # sharded model states


def test_safetensors_writer_round_trip(tmp_path):
    """write_safetensors streams tensors one at a time; safetensors reads them back (cast to the file's dtype)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    from mmrl.planning.lerobot import read_safetensors_shapes

    torch.manual_seed(0)
    tensors = {
        "b.weight": torch.randn(3, 5),
        "a.bias": torch.randn(7),
        "scalar": torch.tensor(2.5),
        "t": torch.randn(4, 6).t(),  # not contiguous
        "empty": torch.zeros(0, 3),
    }
    for dtype in ("bfloat16", "float32"):
        path = tmp_path / f"{dtype}.safetensors"
        gc.write_safetensors(path, tensors, dtype=dtype)
        back = load_file(str(path))
        assert sorted(back) == sorted(tensors)
        for name, t in tensors.items():
            assert back[name].dtype == getattr(torch, dtype)
            assert torch.equal(back[name], t.to(getattr(torch, dtype))), name
        with safe_open(str(path), "pt") as f:
            assert f.metadata() == {"format": "pt"}
        assert read_safetensors_shapes(path) == {k: tuple(t.shape) for k, t in tensors.items()}
        assert not (tmp_path / f"{dtype}.safetensors.tmp").exists()
    header = gc.safetensors_header({"x": (2, 3), "y": (5,)}, "bfloat16")
    n = int.from_bytes(header[:8], "little")
    assert len(header) == 8 + n and n % 8 == 0
    assert json.loads(header[8:]) == {
        "x": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
        "y": {"dtype": "BF16", "shape": [5], "data_offsets": [12, 22]},
    }


def test_tiny_pi0_folder_is_the_tiny_builders(tmp_path):
    """At the tiny builder's sizes the folder builder writes exactly the tensors (names, shapes) that save_policy
    writes for build_tiny_pi0 with the same features, and mmrl's loader reads it back; a folder is reused only when
    its marker records the same build."""
    from mmrl.adapters.vla.lerobot.checkpoint import load_policy, save_policy
    from mmrl.adapters.vla.lerobot.tiny import build_tiny_pi0
    from mmrl.planning.lerobot import read_safetensors_shapes

    folder = tmp_path / "tiny_pi0-random"
    n = gc.build_random_pi0(folder, "tiny_pi0", device="cpu")
    assert n == 138_400
    io = gc.VLA_TASK_IO
    ref = build_tiny_pi0(
        cameras=tuple(io["cameras"]),
        image_shape=tuple(io["image_shape"]),
        state_dim=io["state_dim"],
        action_dim=io["action_dim"],
        chunk_size=4,
        num_steps=4,
    )
    save_policy(ref, tmp_path / "ref")
    assert read_safetensors_shapes(folder / "model.safetensors") == read_safetensors_shapes(
        tmp_path / "ref" / "model.safetensors"
    )
    pipe = load_policy(folder, tokenizer_path=str(folder / "tokenizer"))
    assert sum(p.numel() for p in pipe.model.parameters()) == n
    assert (pipe.spec.image_keys, pipe.spec.state_dim, pipe.spec.action_dim) == (io["cameras"], 7, 4)
    assert (pipe.config.chunk_size, pipe.config.num_steps) == (4, 4)
    # reused: the weights file is not rewritten
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert gc.build_random_pi0(folder, "tiny_pi0", device="cpu") == n
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    # another build recorded in the marker: rebuilt
    marker = json.loads((folder / gc.MODEL_MARKER).read_text())
    (folder / gc.MODEL_MARKER).write_text(json.dumps({**marker, "io": {**marker["io"], "state_dim": 8}}))
    assert gc.reusable_build(folder, gc.pi0_build_info("tiny_pi0")) is None
    assert gc.build_random_pi0(folder, "tiny_pi0", device="cpu") == n
    assert json.loads((folder / gc.MODEL_MARKER).read_text()) == marker


def _published_pi0_params() -> int:
    """π0's parameters from the published configs (Black et al. 2024, "3.3 billion parameters": PaliGemma's SigLIP
    So400m/14 at 224 px and Gemma 2B, plus the 300M action expert; LeRobot's PI0Config for the projections), summed
    here by hand, module by module, as mmrl's PI0Model holds them (no LM heads: no output reads them)."""
    w, f, patch, depth = 1152, 4304, 14, 27  # SigLIP So400m/14
    tokens = (224 // patch) ** 2
    block = 4 * (w * w + w) + (w * f + f) + (f * w + w) + 4 * w  # q/k/v/o + MLP (with biases), 2 LayerNorms
    siglip = 3 * patch * patch * w + w + tokens * w + depth * block + 2 * w  # patch conv, positions, post-LN
    projector = 1152 * 2048 + 2048
    q, kv = 8 * 256, 1 * 256  # 8 query heads, 1 key/value head, head dim 256 (VLM and expert alike)
    gemma = 257152 * 2048 + 18 * (2048 * q + 2 * 2048 * kv + q * 2048 + 3 * 2048 * 16384 + 2 * 2048)
    e = 1024  # gemma_300m expert: 18 layers, MLP 4096, + its final norm
    expert = 18 * (e * q + 2 * e * kv + q * e + 3 * e * 4096 + 2 * e) + e
    a = s = 32  # max_action_dim, max_state_dim
    suffix = (a * e + e) + (e * a + a) + (2 * e * e + e) + (e * e + e) + (s * e + e)  # action in/out, time MLP, state
    return siglip + projector + gemma + expert + suffix


def test_pi0_builds():
    import yaml

    pi0 = gc.pi0_build_arch("pi0")
    assert (pi0.chunk, pi0.num_steps, pi0.tokenizer_max_length) == (50, 10, 48)  # LeRobot's PI0Config defaults
    assert pi0.model_params() == _published_pi0_params() == 3_238_046_480
    assert abs(pi0.model_params() / 3.3e9 - 1) < 0.02  # the paper's "3.3 billion"

    # the tiny build: the tiny_pi0 preset's chunk and Euler steps, and exactly the parameters of the module the tiny
    # builder makes with them (counted on the module, not by the planner's formula)
    from mmrl.adapters.vla.lerobot.tiny import build_tiny_pi0

    preset = yaml.safe_load((ROOT / "configs" / "model" / "tiny_pi0.yaml").read_text())
    tiny = gc.pi0_build_arch("tiny_pi0")
    assert (tiny.chunk, tiny.num_steps) == (preset["chunk"], preset["num_steps"]) == (4, 4)
    built = build_tiny_pi0(chunk_size=tiny.chunk, num_steps=tiny.num_steps, state_dim=gc.VLA_TASK_IO["state_dim"])
    assert tiny.model_params() == sum(p.numel() for p in built.model.parameters()) == 138_400
    with pytest.raises(ValueError, match="tiny_pi05"):
        gc.pi0_build_arch("tiny_pi05")


def test_a_built_model_folder_is_reused(tmp_path):
    (tmp_path / gc.MODEL_MARKER).write_text(json.dumps({"preset": "qwen2_5_vl_3b", "num_parameters": 123}))
    assert gc.build_random_vlm(tmp_path, device="meta") == 123  # nothing built: the marker is read back
    assert sorted(f.name for f in tmp_path.iterdir()) == [gc.MODEL_MARKER]
