#!/usr/bin/env python3
"""The prepared GPU check of issue 13, for the day a GPU is lent for a few minutes (run by scripts/gpu_check.sh).

It builds a real-size Qwen2.5-VL-3B from its published architecture (:data:`mmrl.planning.architectures.REAL_VLM_CONFIGS`,
3,754,622,976 parameters) with random bf16 weights and mmrl's offline tokenizer / processor (nothing is downloaded),
then runs a few GRPO steps of ``task=vqa_grounding`` through the real launcher,

    python -m torch.distributed.run --standalone --nproc_per_node N -m mmrl.cli train ... trainer.strategy=ddp|fsdp2

for every (rollout engine, strategy) pair: HF ``generate`` and, where ``import vllm`` works, the colocated vLLM engine
(its weight-sync canary and the importance ratios are read from the run's metrics), under DDP and FSDP2 on all
visible GPUs. It prints ONE summary table: per configuration the median step time, completion tokens per second,
peak GPU memory (torch's allocator peak, max over ranks, and the device's peak as nvidia-smi saw it) and ``mmrl
plan``'s predicted per-device total for the same overrides (:func:`mmrl.planning.report.build_plan`).

Time: everything runs under one budget (``--budget-s``, default 450 s, so the check ends inside 8 minutes); each
sub-run has its own timeout, a sub-run is stopped as soon as its last step is logged (the final checkpoint of a 3B
model is not what is measured), and what cannot run (no GPU, no vLLM, no time left, a failure) is one row of the
table saying why. ``--cpu-smoke`` runs the same path with the tiny offline VLM, 1 step, on CPU (the test of this
script, tests/trainer/test_gpu_check.py).

Measuring memory: every worker process of a sub-run imports a generated ``sitecustomize.py`` (on PYTHONPATH) that,
when ``MMRL_GPU_CHECK_MEMORY_DIR`` is set, writes ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` and
the peak RSS of its rank twice a second and at exit; nothing in mmrl changes for it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
MODEL_MARKER = "gpu_check_model.json"
"""Written last into a built model folder: a complete folder is reused by the next check."""

MEMORY_HOOK = '''"""Written by scripts/gpu_check.py: peak memory of this worker, for the check's summary table."""
import atexit
import json
import os
import sys
import threading


def _mmrl_gpu_check_record():
    out = {"rank": int(os.environ.get("RANK", "0"))}
    try:
        import resource

        out["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:  # noqa: BLE001 - not on this platform
        pass
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated())
            out["cuda_max_reserved"] = int(torch.cuda.max_memory_reserved())
    except Exception as e:  # noqa: BLE001 - a record is better than a crash of the run it measures
        out["error"] = repr(e)
    path = os.path.join(os.environ["MMRL_GPU_CHECK_MEMORY_DIR"], "rank%d.json" % out["rank"])
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


def _mmrl_gpu_check_loop():
    import time

    while True:
        time.sleep(0.5)
        _mmrl_gpu_check_record()


if os.environ.get("MMRL_GPU_CHECK_MEMORY_DIR") and "LOCAL_RANK" in os.environ:  # workers, not the launcher
    atexit.register(_mmrl_gpu_check_record)
    threading.Thread(target=_mmrl_gpu_check_loop, name="mmrl-gpu-check-memory", daemon=True).start()
'''


# ============================================================================ configurations


@dataclass(frozen=True)
class SubRun:
    """One row of the table: a rollout engine and a training strategy on ``world`` processes."""

    engine: str
    """hf (transformers generate) or vllm (the colocated engine)."""
    strategy: str
    """ddp or fsdp2 (``trainer.strategy``)."""
    world: int
    """Processes (GPUs) of the run."""

    @property
    def name(self) -> str:
        return f"{self.engine}/{self.strategy} x{self.world}"


@dataclass
class Row:
    """What the table prints for one configuration (None: not measured)."""

    config: str
    status: str
    """ok, failed, timeout or skipped."""
    steps: int = 0
    step_s: float | None = None
    tokens_per_s: float | None = None
    peak_alloc_gib: float | None = None
    """torch.cuda.max_memory_allocated, max over ranks (on CPU: the peak RSS, marked in notes)."""
    peak_device_gib: float | None = None
    """Peak memory used on the device as nvidia-smi reported it (CUDA context, allocator cache and vLLM included)."""
    plan_gib: float | None = None
    """mmrl plan's predicted per-device total for the same overrides."""
    notes: str = ""


@dataclass
class Settings:
    """What every sub-run shares."""

    model_overrides: list[str]
    """model=... and model.path=..."""
    steps: int
    group_size: int
    max_new_tokens: int
    device_gb: float
    """Memory of one device, for the planner's fit line."""
    cpu: bool = False
    extra: list[str] = field(default_factory=list)
    """More train overrides from the command line (after ``--``)."""


def train_overrides(sub: SubRun, s: Settings, run_root: Path) -> list[str]:
    """The ``mmrl train`` overrides of one sub-run (also given to ``mmrl plan``)."""
    ov = [
        "task=vqa_grounding",
        *s.model_overrides,
        "task.num_train=32",
        "task.num_eval=0",
        "task.image_sizes=[[448,448]]",
        f"trainer.max_steps={s.steps}",
        f"trainer.batch_size={sub.world}",
        f"algo.group_size={s.group_size}",
        f"model.max_new_tokens={s.max_new_tokens}",
        "trainer.sft_steps=0",
        "trainer.eval_every=0",
        "trainer.eval_at_end=false",
        "trainer.save_every=0",
        "trainer.plot=false",
        "trainer.tensorboard=false",
        "trainer.progress=false",
        "trainer.seed=0",
        f"trainer.strategy={sub.strategy}",
        f"trainer.output_dir={run_root}",
        f"trainer.run_name={run_name(sub)}",
        f"model.rollout_engine={sub.engine}",
    ]
    if s.cpu:
        ov.append("trainer.device=cpu")
    if sub.engine == "vllm":
        ov += ["model.vllm_gpu_memory_utilization=0.3", "model.vllm_sleep=true", "model.max_prompt_tokens=1024"]
    return ov + list(s.extra)


def run_name(sub: SubRun) -> str:
    """The run directory name of a sub-run (letters, digits, '-')."""
    return f"gpu-check-{sub.engine}-{sub.strategy}-x{sub.world}"


def plan_overrides(sub: SubRun, s: Settings) -> list[str]:
    """The ``plan.*`` settings matching a sub-run: its world size and strategy, the device, one image of 448 x 448
    (256 vision tokens) per prompt and the optimizer the trainer builds (torch AdamW, state in the model dtype)."""
    return [
        f"plan.world_size={sub.world}",
        f"plan.strategy={sub.strategy}",
        f"plan.device_gb={s.device_gb:g}",
        "plan.images=1",
        "plan.image_tokens=256",
        "plan.optim=model",
    ]


def predicted_gib(overrides: Sequence[str], plan: Sequence[str]) -> tuple[float | None, str]:
    """``mmrl plan``'s per-device total (GiB) for ``overrides`` + ``plan``, computed in this process (nothing is
    loaded); (None, reason) when the planner refuses them."""
    from mmrl.planning.report import build_plan

    try:
        _, _, _, _, bd, _ = build_plan([*overrides, *plan])
    except Exception as e:  # noqa: BLE001 - a row says why instead of stopping the check
        return None, f"plan: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return bd.total / GIB, ""


# ============================================================================ reading a run


def summarise(rows: Sequence[dict], world: int) -> dict:
    """Step time, throughput and rollout-engine notes from a run's ``metrics.jsonl`` rows.

    ``step_s``: the median ``time/step`` over the steps after the first (the first pays for compilation and
    caches) or the only step; ``tokens_per_s``: completion tokens of a step over all ranks (``world x update/samples x
    response/length``, each rank's own numbers) divided by its step time, median over the same steps."""
    steps = [r for r in rows if r.get("time/step") is not None]
    if not steps:
        return {"steps": 0}
    timed = steps[1:] if len(steps) > 1 else steps
    out: dict = {"steps": len(steps), "step_s": statistics.median(r["time/step"] for r in timed)}
    rates = [
        world * r["update/samples"] * r["response/length"] / r["time/step"]
        for r in timed
        if r.get("update/samples") is not None and r.get("response/length") is not None and r["time/step"] > 0
    ]
    if rates:
        out["tokens_per_s"] = statistics.median(rates)
    last = steps[-1]
    notes = []
    if last.get("vllm/sync_checked") is not None:
        notes.append(
            f"sync canary {last.get('vllm/sync_max_abs_diff', float('nan')):g} over "
            f"{int(last['vllm/sync_checked'])} tensors, sync {last.get('vllm/sync_time', float('nan')):.2f}s"
        )
    lo = [r["rollout/is_ratio_min"] for r in steps if r.get("rollout/is_ratio_min") is not None]
    hi = [r["rollout/is_ratio_max"] for r in steps if r.get("rollout/is_ratio_max") is not None]
    if lo and hi:
        notes.append(f"IS ratio [{min(lo):.3g}, {max(hi):.3g}]")
    gap = [r["rollout/logp_abs_diff"] for r in steps if r.get("rollout/logp_abs_diff") is not None]
    if gap:
        notes.append(f"|dlogp| {max(gap):.2g}")
    out["notes"] = ", ".join(notes)
    return out


def read_memory(folder: Path) -> tuple[float | None, float | None]:
    """(max over ranks of torch's allocator peak, max over ranks of the peak RSS), in GiB, from the hook's files."""
    alloc, rss = [], []
    for f in sorted(folder.glob("rank*.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("cuda_max_allocated") is not None:
            alloc.append(rec["cuda_max_allocated"] / GIB)
        if rec.get("max_rss_bytes") is not None:
            rss.append(rec["max_rss_bytes"] / GIB)
    return (max(alloc) if alloc else None), (max(rss) if rss else None)


# ============================================================================ the table


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _gib(x: float | None) -> str:
    """A memory column: one decimal, three under 1 GiB (a tiny CPU-smoke model's 0.022 GiB is not 0.0)."""
    return _num(x, ".3f" if x is not None and abs(x) < 1 else ".1f")


def format_table(rows: Sequence[Row]) -> str:
    """The summary: one line per configuration, columns aligned, notes last."""
    head = ["config", "status", "steps", "step s", "tok/s", "peak alloc GiB", "peak device GiB", "plan GiB", "notes"]
    body = [
        [
            r.config,
            r.status,
            str(r.steps),
            _num(r.step_s, ".2f"),
            _num(r.tokens_per_s, ".0f"),
            _gib(r.peak_alloc_gib),
            _gib(r.peak_device_gib),
            _gib(r.plan_gib),
            r.notes,
        ]
        for r in rows
    ]
    width = [max(len(line[i]) for line in [head, *body]) for i in range(len(head) - 1)]
    fmt = lambda line: "  ".join(c.ljust(w) for c, w in zip(line, width)) + "  " + line[-1]  # noqa: E731
    rule = "-" * (sum(width) + 2 * len(width) + len("notes"))
    return "\n".join([fmt(head), rule, *(fmt(b).rstrip() for b in body)])


# ============================================================================ processes


class DeviceMemoryPoller:
    """Peak ``memory.used`` (GiB, max over GPUs) from ``nvidia-smi`` sampled every ``period_s`` while running;
    ``peak`` stays None without nvidia-smi."""

    def __init__(self, period_s: float = 0.25) -> None:
        self.period_s = period_s
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DeviceMemoryPoller:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            used = nvidia_smi("memory.used")
            if used:
                gib = max(used) / 1024
                self.peak = gib if self.peak is None else max(self.peak, gib)
            self._stop.wait(self.period_s)


def nvidia_smi(field_name: str) -> list[float]:
    """One numeric ``nvidia-smi --query-gpu`` field per visible GPU ([] without nvidia-smi or on an error)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={field_name}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return [float(x) for x in out.split() if x.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


def _kill(proc: subprocess.Popen, wait_s: float = 20.0) -> None:
    """End a launcher and its workers (they share the process group started for it) and wait until they are gone.

    SIGKILL, not SIGTERM: the trainer answers SIGTERM by finishing its step and saving a checkpoint, which for a 3B
    model costs the check's time and disk and is not what is measured. Waiting for the whole group (not only the
    launcher) lets the next sub-run find the GPUs' memory freed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s:
        try:
            os.killpg(proc.pid, 0)  # a member of the group is still alive
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)


def worker_env(hook_dir: Path, memory_dir: Path, *, cpu: bool) -> dict[str, str]:
    """The environment of a sub-run: this repo and the memory hook first on PYTHONPATH, unbuffered output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(hook_dir), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["MMRL_GPU_CHECK_MEMORY_DIR"] = str(memory_dir)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("OMP_NUM_THREADS", "1" if cpu else "4")
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_sub(sub: SubRun, s: Settings, work: Path, timeout_s: float) -> Row:
    """Launch one sub-run through torchrun, stop it once its last step is logged, and read its numbers."""
    run_root = work / "runs"
    run_dir = run_root / run_name(sub)
    shutil.rmtree(run_dir, ignore_errors=True)
    memory_dir = work / "memory" / run_name(sub)
    shutil.rmtree(memory_dir, ignore_errors=True)
    memory_dir.mkdir(parents=True)
    overrides = train_overrides(sub, s, run_root)
    plan, plan_note = predicted_gib(overrides, plan_overrides(sub, s))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={sub.world}",
        "-m",
        "mmrl.cli",
        "train",
        *overrides,
    ]
    log_path = work / "logs" / f"{run_name(sub)}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    status, detail = "timeout", f"no result within {timeout_s:.0f}s"
    t0 = time.monotonic()
    with open(log_path, "w") as log_file, DeviceMemoryPoller() as poller:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=worker_env(work / "hook", memory_dir, cpu=s.cpu),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while time.monotonic() - t0 < timeout_s:
                done = proc.poll() is not None
                rows = _metrics(run_dir)
                if sum(1 for r in rows if r.get("time/step") is not None) >= s.steps:
                    time.sleep(1.0)  # one more tick of the memory hook after the last step
                    status, detail = "ok", ""
                    break
                if done:
                    status, detail = "failed", f"exit code {proc.returncode}: {_last_error(log_path)}"
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                _kill(proc)  # past the last step only the final checkpoint is left: not part of the check
    summary = summarise(_metrics(run_dir), sub.world)
    alloc, rss = read_memory(memory_dir)
    notes = [n for n in (summary.get("notes", ""), detail, plan_note) if n]
    if s.cpu and rss is not None:
        alloc = rss
        notes.insert(0, "CPU: peak alloc = peak RSS per process")
    row = Row(
        config=sub.name,
        status=status,
        steps=summary.get("steps", 0),
        step_s=summary.get("step_s"),
        tokens_per_s=summary.get("tokens_per_s"),
        peak_alloc_gib=alloc,
        peak_device_gib=poller.peak,
        plan_gib=plan,
        notes="; ".join(notes),
    )
    shutil.rmtree(run_dir, ignore_errors=True)  # a 3B run's checkpoint files would fill the disk
    return row


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line being written
    return rows


def _last_error(log_path: Path) -> str:
    """The last line of a sub-run's log that looks like an error (for the table's notes)."""
    lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error:" in ln or "aborted" in ln:
            return ln[:200]
    return lines[-1][:200] if lines else "no output"


# ============================================================================ the model


def build_random_vlm(folder: Path, preset: str = "qwen2_5_vl_3b", *, device: str = "cuda") -> int:
    """Save a Qwen-VL of ``preset``'s published architecture with random bf16 weights into ``folder`` (mmrl's
    offline tokenizer and the family's real processor, as the tiny builds have); returns its parameter count.

    The config is the tiny builder's (:func:`mmrl.models.tiny_vlm._build_config`: special token ids, rotary
    settings) with the sizes of ``REAL_VLM_CONFIGS[preset]``; a folder with :data:`MODEL_MARKER` is reused."""
    if (folder / MODEL_MARKER).is_file():
        return int(json.loads((folder / MODEL_MARKER).read_text())["num_parameters"])
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    config, processor = random_vlm_config(preset)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    tok = processor.tokenizer
    model.generation_config = GenerationConfig(
        bos_token_id=tok.pad_token_id, pad_token_id=tok.pad_token_id, eos_token_id=[tok.eos_token_id, tok.pad_token_id]
    )
    n = sum(p.numel() for p in model.parameters())
    model.to("cpu").save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    (folder / MODEL_MARKER).write_text(json.dumps({"preset": preset, "num_parameters": n}))
    return n


def random_vlm_config(preset: str):
    """(transformers config, processor) of ``preset``'s published architecture with mmrl's offline tokenizer."""
    from mmrl.models import tiny_vlm as tv
    from mmrl.models.tokenizer_builder import QWEN_VL_CHAT_TEMPLATE, build_bpe_tokenizer, default_vlm_corpus
    from mmrl.planning.architectures import REAL_VLM_CONFIGS

    _, published, _ = REAL_VLM_CONFIGS[preset]
    family = published["model_type"]
    if family != "qwen2_5_vl":
        raise ValueError(f"the GPU check builds Qwen2.5-VL presets; {preset} is {family}")
    spec = tv.TinyVLMSpec(family=family, limits=tv.ProcessorLimits(image_max_tokens=1280))
    tokenizer = build_bpe_tokenizer(
        default_vlm_corpus(), vocab_size=spec.bpe_vocab_size, chat_template=QWEN_VL_CHAT_TEMPLATE
    )
    processor = tv._build_processor(spec, tokenizer)
    tiny = tv._build_config(spec, tokenizer)
    d = tiny.to_dict()
    text = {k: v for k, v in d["text_config"].items() if k != "layer_types"}  # derived from the layer count
    text.update(
        {
            k: published[k]
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
            )
        }
    )
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    text["rope_parameters"] = dict(text["rope_parameters"], mrope_section=tv.mrope_section(head_dim, family))
    vision = dict(d["vision_config"])
    vision.update({k: v for k, v in published["vision_config"].items() if k != "in_chans"})
    vision.update(
        in_channels=published["vision_config"].get("in_chans", 3),
        window_size=112,
        fullatt_block_indexes=[7, 15, 23, 31],
    )  # the published Qwen2.5-VL values
    config = type(tiny).from_dict(
        {
            **d,
            "text_config": text,
            "vision_config": vision,
            "tie_word_embeddings": bool(published["tie_word_embeddings"]),
        }
    )
    return config, processor


# ============================================================================ main


def _gpu_count() -> int:
    return len(nvidia_smi("memory.total"))


def _vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny offline VLM, 1 step, on CPU: the table logic only")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mmrl_gpu_check"), help="model, runs, logs (large)")
    ap.add_argument("--report", type=Path, default=None, help="also write the rows as JSON here")
    ap.add_argument("--budget-s", type=float, default=450.0, help="whole check, model build included")
    ap.add_argument("--sub-timeout-s", type=float, default=170.0, help="one sub-run at most")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per sub-run (default 3; smoke 1)")
    ap.add_argument("--nproc", type=int, default=None, help="processes per sub-run (default: the visible GPUs)")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--strategies", default="ddp,fsdp2")
    ap.add_argument("--build-model", type=Path, default=None, help=argparse.SUPPRESS)  # the build's own process
    ap.add_argument("extra", nargs="*", help="more `mmrl train` overrides for every sub-run")
    args = ap.parse_args(argv)
    if args.build_model is not None:
        print(json.dumps({"num_parameters": build_random_vlm(args.build_model)}))
        return 0
    start = time.monotonic()
    deadline = start + args.budget_s
    work = args.work.resolve()
    (work / "hook").mkdir(parents=True, exist_ok=True)
    (work / "hook" / "sitecustomize.py").write_text(MEMORY_HOOK)
    rows: list[Row] = []
    gpus = 0 if args.cpu_smoke else _gpu_count()
    world = args.nproc or max(1, gpus)
    if args.cpu_smoke:
        settings = Settings(
            ["model=tiny_qwen2_5_vl"],
            steps=args.steps or 1,
            group_size=2,
            max_new_tokens=8,
            device_gb=80.0,
            cpu=True,
            extra=args.extra,
        )
        model_row = Row("model: tiny_qwen2_5_vl (offline build)", "ok", notes="CPU smoke: not a measurement")
    else:
        mem = nvidia_smi("memory.total")
        settings = Settings(
            [],
            steps=args.steps or 3,
            group_size=4,
            max_new_tokens=32,
            device_gb=(min(mem) / 1024) if mem else 80.0,
            extra=args.extra,
        )
        model_row = _build_model_row(work / "qwen2_5_vl_3b-random", deadline, gpus)
        if model_row.status == "ok":
            settings.model_overrides = ["model=qwen2_5_vl_3b", f"model.path={work / 'qwen2_5_vl_3b-random'}"]
    rows.append(model_row)
    for engine in [e for e in args.engines.split(",") if e]:
        for strategy in [x for x in args.strategies.split(",") if x]:
            sub = SubRun(engine, strategy, world)
            why = _skip_reason(sub, settings, model_row, gpus, deadline)
            if why:
                rows.append(Row(sub.name, "skipped", notes=why))
                continue
            left = deadline - time.monotonic()
            rows.append(run_sub(sub, settings, work, timeout_s=min(args.sub_timeout_s, left - 10)))
    table = format_table(rows)
    print(
        f"\nmmrl GPU check ({'CPU smoke' if args.cpu_smoke else f'{gpus} GPU(s)'}, "
        f"{time.monotonic() - start:.0f}s; logs in {work / 'logs'})"
    )
    print(table)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0 if all(r.status in ("ok", "skipped") for r in rows) else 1


def _build_model_row(folder: Path, deadline: float, gpus: int) -> Row:
    """Build the random-weight model in its own process (its GPU memory is freed before the sub-runs)."""
    name = "model: qwen2_5_vl_3b, random bf16 weights"
    if gpus == 0:
        return Row(name, "skipped", notes="no GPU visible (nvidia-smi lists none); use --cpu-smoke on CPU")
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--build-model", str(folder)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=max(30.0, min(180.0, deadline - t0 - 60)),
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
        )
    except subprocess.TimeoutExpired:
        return Row(name, "timeout", notes="the model build did not finish in time")
    if p.returncode != 0:
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        return Row(name, "failed", notes=(err[-1] if err else f"exit code {p.returncode}")[:200])
    n = json.loads(p.stdout.strip().splitlines()[-1])["num_parameters"]
    return Row(name, "ok", step_s=None, notes=f"{n:,} parameters, built in {time.monotonic() - t0:.0f}s")


def _skip_reason(sub: SubRun, s: Settings, model_row: Row, gpus: int, deadline: float) -> str:
    """Why a sub-run cannot run now ('' when it can)."""
    if model_row.status != "ok":
        return "no model (see the model row)"
    if sub.engine == "vllm":
        why = (["vLLM needs a CUDA GPU (CPU smoke)"] if s.cpu else []) + (
            [] if _vllm_importable() else ["vLLM not importable here (pip install 'mmrl[vllm]'; docs/vllm.md)"]
        )
        if why:
            return "; ".join(why)
    if not s.cpu and gpus < sub.world:
        return f"{sub.world} processes need {sub.world} GPUs, {gpus} visible"
    left = deadline - time.monotonic()
    if left < 60:
        return f"time budget: {left:.0f}s left of the check's budget"
    return ""


if __name__ == "__main__":
    sys.exit(main())
