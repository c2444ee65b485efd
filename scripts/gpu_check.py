#!/usr/bin/env python3
"""The prepared GPU check of issue 13, for the day a GPU is lent for a few minutes (run by scripts/gpu_check.sh).

It measures two real-size models with random weights, built offline (nothing is downloaded):

* **VLM**: a Qwen2.5-VL-3B from its published architecture (:data:`mmrl.planning.architectures.REAL_VLM_CONFIGS`,
  3,754,622,976 parameters, bf16) with mmrl's offline tokenizer / processor; a few GRPO steps of
  ``task=vqa_grounding`` per (rollout engine, strategy) through the real launcher,

      python -m torch.distributed.run --standalone --nproc_per_node N -m mmrl.cli train ... trainer.strategy=ddp|fsdp2

  with HF ``generate`` and, where ``import vllm`` works, the colocated vLLM engine (its weight-sync canary and the
  importance ratios are read from the run's metrics), under DDP and FSDP2 on all visible GPUs; and one asynchronous
  sub-run (``hf/ddp xN async``: ``trainer.rollout=async algo.max_staleness=1 algo.truncated_is=true``, a rollout
  worker process on rank 0's GPU), whose row also checks ``async/staleness_max <= 1`` in its ``metrics.jsonl``;
* **flow VLA**: a LeRobot-format π0 folder at π0's published size (:func:`mmrl.planning.lerobot.published_arch`:
  SigLIP So400m + Gemma 2B + the 300M action expert, 3,238,046,480 parameters; weights stored in bf16, trained in
  float32 as the LeRobot policies do) with the tiny builder's byte-level Gemma tokenizer and processor files, for
  ``task=vla_reach``'s camera, state and actions; a few GRPO steps of ``mmrl train task=vla_reach model=pi0
  model.path=<folder> model.chunk=50`` (2 episodes per item, one process; with several GPUs also FSDP2 over them).

It prints ONE summary table: per configuration the median step time, completion tokens per second (VLM; the π0 rows
say ``-`` there and give the env actions executed per second of step time in their notes), peak GPU memory (torch's
allocator peak, max over ranks, and the device's peak as nvidia-smi saw it) and ``mmrl plan``'s predicted per-device
total for the same overrides (:func:`mmrl.planning.report.build_plan`).

Time: everything runs under one budget (``--budget-s``, default 450 s, so the check ends inside 8 minutes); each
sub-run has its own timeout (``--sub-timeout-s``, π0's ``--vla-timeout-s``), a sub-run is stopped as soon as its last
step is logged (the final checkpoint of a 3B model is not what is measured), and what cannot run (no GPU, no vLLM, no
time left, a failure) is one row of the table saying why. Order, for when the time runs out first: the VLM's model
and its hf/ddp row, then π0's model and its row, then the VLM's asynchronous row, its other (engine, strategy) rows,
then π0's FSDP2 row (several GPUs only): one measurement of each model before the variants of either. ``--only vla`` (``--only vlm``)
runs one part alone, e.g. in a short device session. ``--cpu-smoke`` runs the same path on CPU, 1 step each: the tiny
offline VLM, and π0 at the tiny builder's sizes written by the same folder builder (``model=tiny_pi0
model.path=<folder>``): the test of this script (tests/trainer/test_gpu_check.py).

Measuring memory: every worker process of a sub-run imports a generated ``sitecustomize.py`` (on PYTHONPATH) that,
when ``MMRL_GPU_CHECK_MEMORY_DIR`` is set, writes ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` and
the peak RSS of its rank twice a second and at exit (only the rank itself: the processes it starts, such as the VLA
env workers, inherit a marker and record nothing); nothing in mmrl changes for it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

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


if (
    os.environ.get("MMRL_GPU_CHECK_MEMORY_DIR")
    and "LOCAL_RANK" in os.environ  # workers, not the launcher
    and not os.environ.get("MMRL_GPU_CHECK_RECORDER")  # not a process a worker started (env workers, helpers)
):
    os.environ["MMRL_GPU_CHECK_RECORDER"] = str(os.getpid())  # inherited by this worker's children
    atexit.register(_mmrl_gpu_check_record)
    threading.Thread(target=_mmrl_gpu_check_loop, name="mmrl-gpu-check-memory", daemon=True).start()
'''


# ============================================================================ configurations


@dataclass(frozen=True)
class SubRun:
    """One row of the table: a model, its rollout engine and a training strategy on ``world`` processes."""

    engine: str
    """hf (transformers generate) or vllm (the colocated engine); flow for π0 (the policy's own flow sampler)."""
    strategy: str
    """ddp or fsdp2 (``trainer.strategy``)."""
    world: int
    """Processes (GPUs) of the run."""
    kind: str = "vlm"
    """vlm (Qwen2.5-VL, task=vqa_grounding) or vla (π0, task=vla_reach)."""
    rollout: str = "sync"
    """sync, or async (``trainer.rollout=async``: rollout worker processes on rank 0's GPU, :data:`ASYNC_OVERRIDES`)."""

    @property
    def name(self) -> str:
        if self.kind == "vla":
            return f"pi0/{self.strategy} x{self.world}"
        return f"{self.engine}/{self.strategy} x{self.world}" + (" async" if self.rollout == "async" else "")


ASYNC_MAX_STALENESS = 1
ASYNC_OVERRIDES = ["trainer.rollout=async", f"algo.max_staleness={ASYNC_MAX_STALENESS}", "algo.truncated_is=true"]
"""The asynchronous sub-run's settings (docs/async.md): one rollout worker (the default), samples at most one version
old, weighted by the decoupled objective's truncated importance weights. Its row fails when ``async/staleness_max``
is missing from the run's metrics or exceeds the bound (:func:`staleness_check`); the workers' memory is in the
device peak (nvidia-smi), not in the allocator peak (the hook records the learner ranks only)."""


@dataclass
class Row:
    """What the table prints for one configuration (None: not measured)."""

    config: str
    status: str
    """ok, failed, timeout or skipped."""
    steps: int = 0
    step_s: float | None = None
    tokens_per_s: float | None = None
    actions_per_s: float | None = None
    """π0 rows: env actions executed per second of step time, all ranks (in the notes; tok/s is '-')."""
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
    """model=... and model.path=... (π0: and model.chunk=...)"""
    steps: int
    group_size: int
    max_new_tokens: int
    """VLM only (π0 samples action chunks)."""
    device_gb: float
    """Memory of one device, for the planner's fit line."""
    cpu: bool = False
    extra: list[str] = field(default_factory=list)
    """More train overrides from the command line (after ``--``)."""


def train_overrides(sub: SubRun, s: Settings, run_root: Path) -> list[str]:
    """The ``mmrl train`` overrides of one sub-run (also given to ``mmrl plan``)."""
    if sub.kind == "vla":
        return vla_train_overrides(sub, s, run_root)
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
        *_measured_run(sub, run_root),
        f"model.rollout_engine={sub.engine}",
    ]
    if s.cpu:
        ov.append("trainer.device=cpu")
    if sub.engine == "vllm":
        ov += ["model.vllm_gpu_memory_utilization=0.3", "model.vllm_sleep=true", "model.max_prompt_tokens=1024"]
    if sub.rollout == "async":
        ov += ASYNC_OVERRIDES
    return ov + list(s.extra)


def _measured_run(sub: SubRun, run_root: Path) -> list[str]:
    """The trainer overrides every sub-run shares: no warm start, evaluation, checkpoints or plots (only the RL steps
    are measured), seed 0, the sub-run's strategy and run folder."""
    return [
        "trainer.warm_start.steps=0",
        "trainer.eval.every=0",
        "trainer.eval.at_end=false",
        "trainer.checkpointing.save_every=0",
        "trainer.logging.plot=false",
        "trainer.logging.tensorboard=false",
        "trainer.logging.progress=false",
        "trainer.seed=0",
        f"trainer.strategy={sub.strategy}",
        f"trainer.output_dir={run_root}",
        f"trainer.run_name={run_name(sub)}",
    ]


def vla_train_overrides(sub: SubRun, s: Settings, run_root: Path) -> list[str]:
    """The ``mmrl train`` overrides of a π0 sub-run: ``task=vla_reach`` on one tabletop task, no SFT, ``world`` items x
    ``group_size`` episodes per GRPO step. A few demos are still collected (they give the task's action range and
    state statistics); groups are not filtered (random weights never succeed: every group would be dropped and no
    step would train)."""
    ov = [
        "task=vla_reach",
        *s.model_overrides,
        "task.tasks=[reach_red]",
        "task.demo_episodes=4",
        f"trainer.max_steps={s.steps}",
        f"trainer.batch_size={sub.world}",
        f"algo.group_size={s.group_size}",
        "algo.filter_groups=false",
        *_measured_run(sub, run_root),
    ]
    if s.cpu:
        ov.append("trainer.device=cpu")
    return ov + list(s.extra)


def run_name(sub: SubRun) -> str:
    """The run directory name of a sub-run (letters, digits, '-')."""
    if sub.kind == "vla":
        return f"gpu-check-pi0-{sub.strategy}-x{sub.world}"
    return f"gpu-check-{sub.engine}-{sub.strategy}-x{sub.world}" + ("-async" if sub.rollout == "async" else "")


def plan_overrides(sub: SubRun, s: Settings) -> list[str]:
    """The ``plan.*`` settings matching a sub-run: its world size and strategy, the device, one image of 448 x 448
    (256 vision tokens) per prompt and the optimizer the trainer builds (torch AdamW, state in the model dtype).

    π0: world size, strategy and device only; the planner reads the prefix from the built folder (its one camera
    feature x 256 SigLIP tokens + the 48-token prompt) and plans what these policies hold (float32 weights, AdamW
    with fp32 moments, the vision tower frozen as ``model.freeze_vision_tower`` says)."""
    if sub.kind == "vla":
        return [f"plan.world_size={sub.world}", f"plan.strategy={sub.strategy}", f"plan.device_gb={s.device_gb:g}"]
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


def summarise(rows: Sequence[dict], world: int, kind: str = "vlm") -> dict:
    """Step time, throughput and rollout-engine notes from a run's ``metrics.jsonl`` rows.

    ``step_s``: the median ``time/step`` over the steps after the first (the first pays for compilation and
    caches) or the only step; ``tokens_per_s``: completion tokens of a step over all ranks (``world x update/samples x
    response/length``, each rank's own numbers) divided by its step time, median over the same steps. ``kind="vla"``
    (π0, whose ``response/length`` counts policy calls, not tokens): ``actions_per_s`` instead, the env actions
    executed in a step over all ranks (``world x update/samples x rollout/episode_length``) over its step time, also
    the first note."""
    steps = [r for r in rows if r.get("time/step") is not None]
    if not steps:
        return {"steps": 0}
    timed = steps[1:] if len(steps) > 1 else steps
    out: dict = {"steps": len(steps), "step_s": statistics.median(r["time/step"] for r in timed)}
    per_sample, key = (
        ("rollout/episode_length", "actions_per_s") if kind == "vla" else ("response/length", "tokens_per_s")
    )
    rates = [
        world * r["update/samples"] * r[per_sample] / r["time/step"]
        for r in timed
        if r.get("update/samples") is not None and r.get(per_sample) is not None and r["time/step"] > 0
    ]
    if rates:
        out[key] = statistics.median(rates)
    last = steps[-1]
    notes = [f"{out['actions_per_s']:.0f} env actions/s"] if "actions_per_s" in out else []
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


def staleness_check(rows: Sequence[dict], bound: int = ASYNC_MAX_STALENESS) -> str:
    """Why an asynchronous run's ``metrics.jsonl`` rows break the staleness bound ('' when they keep it): a step that
    trained groups logs ``async/staleness_max``, the versions between the weights that sampled a trained group and the
    learner's; at least one step must have, and none may exceed ``algo.max_staleness``."""
    seen = [r["async/staleness_max"] for r in rows if r.get("async/staleness_max") is not None]
    if not seen:
        return "no async/staleness_max in metrics.jsonl (not an asynchronous run?)"
    if max(seen) > bound:
        return f"async/staleness_max {max(seen):g} > algo.max_staleness={bound}"
    return ""


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
    metrics = _metrics(run_dir)
    summary = summarise(metrics, sub.world, sub.kind)
    if sub.rollout == "async":
        broken = staleness_check(metrics)
        if status == "ok" and broken:
            status, detail = "failed", broken
        elif status == "ok":
            worst = max(r["async/staleness_max"] for r in metrics if r.get("async/staleness_max") is not None)
            detail = f"staleness max {worst:g} <= {ASYNC_MAX_STALENESS}; peak alloc: learner ranks only"
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
        actions_per_s=summary.get("actions_per_s"),
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


# ---------------------------------------------------------------------------------------------- π0

VLA_TASK_IO = {"cameras": ["observation.images.image"], "image_shape": [3, 128, 128], "state_dim": 7, "action_dim": 4}
"""What ``task=vla_reach`` gives a LeRobot policy, and so the features of a built π0 folder: its one camera ``image``
(mapped to LeRobot's LIBERO name by default), 128 px frames (configs/task/vla_reach.yaml), the tabletop env's 7-dim
proprio and its 4-dim action (dx, dy, dz, gripper)."""

PI0_BUILDS = ("pi0", "tiny_pi0")
"""π0 folders the check builds (also the model presets that load them): the published size (GPU), the tiny
builder's (the CPU smoke)."""

SAFETENSORS_DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}
"""torch dtype name -> (safetensors dtype code, bytes per element)."""


def pi0_build_arch(preset: str):
    """The sizes of a π0 build (:class:`mmrl.planning.lerobot.FlowVLAArch`): ``pi0`` the published ones (chunk 50,
    K = 10, 48 prompt tokens), ``tiny_pi0`` the tiny builder's with the tiny_pi0 preset's chunk 4 and K = 4."""
    from mmrl.planning.lerobot import published_arch, tiny_arch

    if preset == "pi0":
        return published_arch("pi0")
    if preset == "tiny_pi0":
        return tiny_arch("pi0", chunk=4, num_steps=4, state_dim=VLA_TASK_IO["state_dim"])
    raise ValueError(f"no π0 build {preset!r} ({', '.join(PI0_BUILDS)})")


def vla_model_overrides(preset: str, folder: Path) -> list[str]:
    """``model=<preset> model.path=<folder> model.chunk=<the build's chunk_size>`` (a run refuses another chunk)."""
    return [f"model={preset}", f"model.path={folder}", f"model.chunk={pi0_build_arch(preset).chunk}"]


def pi0_config(arch):
    """mmrl's ``PI0Config`` for ``arch``'s sizes: what ``checkpoint._pi0_config`` reads back from the tensors (SigLIP
    with 16 heads and no pooling head, Gemma blocks with one key/value head)."""
    from mmrl.adapters.vla.lerobot.pi0 import SIGLIP_HEADS, PI0Config

    v = arch.vision
    return PI0Config(
        vision_config={
            "hidden_size": v.width,
            "intermediate_size": v.intermediate,
            "num_hidden_layers": v.depth,
            "num_attention_heads": SIGLIP_HEADS,
            "num_channels": v.channels,
            "patch_size": v.patch,
            "image_size": v.image_size,
            "layer_norm_eps": 1e-6,
            "hidden_act": "gelu_pytorch_tanh",
            "vision_use_head": False,
        },
        vocab_size=arch.vocab,
        width=arch.width,
        depth=arch.layers,
        intermediate=arch.intermediate,
        num_heads=arch.heads,
        num_kv_heads=arch.kv_heads,
        head_dim=arch.head_dim,
        expert_width=arch.expert_width,
        expert_intermediate=arch.expert_intermediate,
        chunk_size=arch.chunk,
        max_state_dim=arch.max_state_dim,
        max_action_dim=arch.max_action_dim,
        num_steps=arch.num_steps,
        image_size=v.image_size,
    )


def random_pi0_tensors(arch, *, device: str = "cpu", seed: int = 0) -> dict:
    """LeRobot-named random float32 tensors of a π0 of ``arch``'s sizes, made on ``device`` (``meta``: shapes only):
    the model's (the tiny builder's init: N(0, 0.02) matrices, zero biases, Gemma norms 0; transformers' own SigLIP
    init) and the three LeRobot saves that no output reads (PaliGemma's LM head and final norm, the expert's LM
    head)."""
    import torch

    from mmrl.adapters.vla.lerobot.checkpoint import PI0_PREFIXES, PI0_UNUSED_TENSORS, to_lerobot_names
    from mmrl.adapters.vla.lerobot.pi0 import PI0Model
    from mmrl.adapters.vla.lerobot.tiny import _init_weights

    torch.manual_seed(seed)
    with torch.device(device):
        model = PI0Model(pi0_config(arch))
        _init_weights(model, skip=("vision_tower.",), norm_value=0.0)  # Gemma's RMSNorm scales by 1 + w
        tensors = to_lerobot_names(dict(model.state_dict()), prefixes=PI0_PREFIXES)
        lm_head, lm_norm, expert_head = PI0_UNUSED_TENSORS
        tensors[lm_head] = 0.02 * torch.randn(arch.vocab, arch.width)
        tensors[lm_norm] = torch.zeros(arch.width)
        tensors[expert_head] = 0.02 * torch.randn(arch.vocab, arch.expert_width)
    return tensors


def write_pi0_io_files(folder: Path, arch) -> None:
    """Every file of a π0 folder but its weights, for :data:`VLA_TASK_IO`: LeRobot's config.json, the processor files
    with their normalisation statistics (mean 0, std 1) and the byte-level Gemma tokenizer in ``tokenizer/`` (its
    ids are small, the embedding keeps the real vocabulary's rows). None of them depends on the model's sizes, so
    they are what ``save_policy`` writes for the tiny builder's π0 with the same features, chunk, K, image resolution
    and prompt length; its tiny model.safetensors is overwritten afterwards."""
    from mmrl.adapters.vla.lerobot.checkpoint import save_policy
    from mmrl.adapters.vla.lerobot.tiny import build_tiny_pi0

    io = VLA_TASK_IO
    pipeline = build_tiny_pi0(
        cameras=tuple(io["cameras"]),
        image_shape=tuple(io["image_shape"]),
        state_dim=io["state_dim"],
        action_dim=io["action_dim"],
        chunk_size=arch.chunk,
        num_steps=arch.num_steps,
        max_state_dim=arch.max_state_dim,
        max_action_dim=arch.max_action_dim,
        image_size=arch.vision.image_size,
        tokenizer_max_length=arch.tokenizer_max_length,
    )
    save_policy(pipeline, folder)


def safetensors_header(
    shapes: Mapping[str, Sequence[int]], dtype: str, metadata: Mapping[str, str] | None = None
) -> bytes:
    """The start of a safetensors file holding tensors of ``shapes`` back to back (in this order) in ``dtype``: the
    header's length (8 bytes, little-endian) and its JSON, padded with spaces to a multiple of 8 bytes."""
    code, size = SAFETENSORS_DTYPES[dtype]
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, shape in shapes.items():
        end = offset + math.prod(shape) * size
        header[name] = {"dtype": code, "shape": [int(x) for x in shape], "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(path: Path, tensors: Mapping[str, Any], dtype: str = "bfloat16") -> None:
    """Write ``tensors`` (on any device) as a safetensors file in ``dtype``, one at a time: each is cast on its device,
    copied to the host and written, so the host holds one tensor, never the model (safetensors' ``save_file`` wants
    them all on the host at once). Written to a temporary name, then renamed."""
    import torch

    target = getattr(torch, dtype)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(safetensors_header({k: tuple(v.shape) for k, v in tensors.items()}, dtype, {"format": "pt"}))
        for t in tensors.values():
            host = t.detach().to(target).contiguous().cpu()
            f.write(host.reshape(-1).view(torch.uint8).numpy().data)
    os.replace(tmp, path)


def pi0_build_info(preset: str) -> dict[str, Any]:
    """What a π0 folder's :data:`MODEL_MARKER` records about its build (a folder is reused only for the same)."""
    return {"preset": preset, "dtype": "bfloat16", "io": VLA_TASK_IO}


def reusable_build(folder: Path, build: Mapping[str, Any]) -> int | None:
    """The parameter count recorded in ``folder``'s :data:`MODEL_MARKER` when it records ``build``, else None."""
    try:
        marker = json.loads((folder / MODEL_MARKER).read_text())
    except (OSError, ValueError):
        return None
    same = all(marker.get(k) == json.loads(json.dumps(v)) for k, v in build.items())
    return int(marker["num_parameters"]) if same and "num_parameters" in marker else None


def build_random_pi0(folder: Path, preset: str = "pi0", *, device: str = "cuda") -> int:
    """Save a LeRobot π0 folder of ``preset``'s sizes (:func:`pi0_build_arch`) with random weights into ``folder``,
    which ``model=<preset> model.path=<folder>`` loads; returns the model's parameter count (without the LM heads
    LeRobot also saves, as ``mmrl plan`` counts).

    The tensors are made on ``device`` (a GPU: the host never holds the float32 model) and streamed into
    model.safetensors in bf16 (:func:`write_safetensors`: the host holds one tensor at a time, at most the 1 GB
    embedding; 8 GB on disk instead of 16 in float32); the loader casts them to float32. A folder whose
    :data:`MODEL_MARKER` records the same build is reused."""
    build = pi0_build_info(preset)
    n = reusable_build(folder, build)
    if n is not None:
        return n
    from mmrl.adapters.vla.lerobot.checkpoint import PI0_UNUSED_TENSORS

    arch = pi0_build_arch(preset)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    write_pi0_io_files(folder, arch)
    tensors = random_pi0_tensors(arch, device=device)
    n = sum(t.numel() for k, t in tensors.items() if k not in PI0_UNUSED_TENSORS)
    write_safetensors(folder / "model.safetensors", tensors, dtype=build["dtype"])
    (folder / MODEL_MARKER).write_text(json.dumps({**build, "num_parameters": n}))
    return n


# ============================================================================ main

VLM_MODEL_ROW = "model: qwen2_5_vl_3b, random bf16 weights"
VLA_MODEL_ROW = "model: pi0, random weights (bf16 on disk)"
VLA_SMOKE_MODEL_ROW = "model: pi0 at tiny sizes, random weights (CPU)"
NO_GPU = "no GPU visible (nvidia-smi lists none); use --cpu-smoke on CPU"
MIN_SUB_S = {"vlm": 60.0, "vla": 90.0}
"""Budget a sub-run needs left to start (π0 first loads a 16 GB float32 model on the host)."""
VLA_BUILD_MIN_S = 120.0
"""Budget π0's build needs left to start (the build, up to 150 s, and then its sub-run); a built folder is reused."""


def _gpu_count() -> int:
    return len(nvidia_smi("memory.total"))


def _vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vlm_sub_runs(world: int, engines: Sequence[str], strategies: Sequence[str], *, asynchronous: bool) -> list[SubRun]:
    """The VLM's sub-runs: every (engine, strategy), and the asynchronous one (hf, ddp over ``world`` processes, its
    workers on rank 0's GPU) second, right after the first: it is the only check of ``trainer.rollout=async``."""
    subs = [SubRun(e, x, world) for e in engines for x in strategies]
    if asynchronous:
        subs.insert(min(1, len(subs)), SubRun("hf", "ddp", world, rollout="async"))
    return subs


def vla_sub_runs(world: int) -> list[SubRun]:
    """π0's sub-runs: GRPO in one process (DDP), and FSDP2 over ``world`` processes when there are several."""
    subs = [SubRun("flow", "ddp", 1, kind="vla")]
    if world > 1:
        subs.append(SubRun("flow", "fsdp2", world, kind="vla"))
    return subs


def run_order(vlm: Sequence[SubRun], vla: Sequence[SubRun]) -> list[str | SubRun]:
    """The check's steps in order ('vlm' / 'vla': build that model, then its rows), what is worth most first should
    the budget run out: each model with its first sub-run (the VLM's, then π0's) before the other sub-runs of either
    (the VLM's other engines and strategies, then π0's FSDP2 run). A part without sub-runs is left out."""
    order: list[str | SubRun] = []
    for kind, subs in (("vlm", vlm), ("vla", vla)):
        if subs:
            order += [kind, subs[0]]
    return order + list(vlm[1:]) + list(vla[1:])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="tiny offline VLM and tiny π0, 1 step each, on CPU: the table logic"
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/mmrl_gpu_check"), help="models, runs, logs (large)")
    ap.add_argument("--report", type=Path, default=None, help="also write the rows as JSON here")
    ap.add_argument("--budget-s", type=float, default=450.0, help="whole check, model builds included")
    ap.add_argument("--sub-timeout-s", type=float, default=170.0, help="one VLM sub-run at most")
    ap.add_argument(
        "--vla-timeout-s", type=float, default=150.0, help="one π0 sub-run at most (its model load included)"
    )
    ap.add_argument("--only", choices=("vlm", "vla"), default=None, help="one part only: vlm (Qwen2.5-VL) or vla (π0)")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per sub-run (default 3; smoke 1)")
    ap.add_argument("--nproc", type=int, default=None, help="processes per sub-run (default: the visible GPUs)")
    ap.add_argument("--engines", default="hf,vllm", help="VLM rollout engines")
    ap.add_argument("--strategies", default="ddp,fsdp2", help="VLM training strategies")
    ap.add_argument(
        "--no-async",
        action="store_true",
        help="leave out the VLM's asynchronous sub-run (hf/ddp, trainer.rollout=async)",
    )
    ap.add_argument("--build-model", type=Path, default=None, help=argparse.SUPPRESS)  # the build's own process
    ap.add_argument("--build-preset", default="qwen2_5_vl_3b", help=argparse.SUPPRESS)
    ap.add_argument("--build-device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help="more `mmrl train` overrides for the VLM sub-runs")
    args = ap.parse_args(argv)
    if args.build_model is not None:
        build = build_random_pi0 if args.build_preset in PI0_BUILDS else build_random_vlm
        print(json.dumps({"num_parameters": build(args.build_model, args.build_preset, device=args.build_device)}))
        return 0
    start = time.monotonic()
    deadline = start + args.budget_s
    work = args.work.resolve()
    (work / "hook").mkdir(parents=True, exist_ok=True)
    (work / "hook" / "sitecustomize.py").write_text(MEMORY_HOOK)
    rows: list[Row] = []
    gpus = 0 if args.cpu_smoke else _gpu_count()
    world = args.nproc or max(1, gpus)
    mem = [] if args.cpu_smoke else nvidia_smi("memory.total")
    device_gb = (min(mem) / 1024) if mem else 80.0
    steps = args.steps or (1 if args.cpu_smoke else 3)
    smoke = args.cpu_smoke
    settings = {
        "vlm": Settings(
            [],
            steps=steps,
            group_size=2 if smoke else 4,
            max_new_tokens=8 if smoke else 32,
            device_gb=device_gb,
            cpu=smoke,
            extra=args.extra,
        ),
        "vla": Settings([], steps=steps, group_size=2, max_new_tokens=0, device_gb=device_gb, cpu=smoke),
    }
    vlm_subs = (
        []
        if args.only == "vla"
        else vlm_sub_runs(world, _names(args.engines), _names(args.strategies), asynchronous=not args.no_async)
    )
    vla_subs = [] if args.only == "vlm" else vla_sub_runs(world)
    model_rows: dict[str, Row] = {}
    for step in run_order(vlm_subs, vla_subs):
        if isinstance(step, str):
            row, settings[step].model_overrides = _model_row(step, smoke, work, deadline, gpus)
            model_rows[step] = row
            rows.append(row)
            continue
        s = settings[step.kind]
        why = _skip_reason(step, s, model_rows[step.kind], gpus, deadline)
        if why:
            rows.append(Row(step.name, "skipped", notes=why))
            continue
        limit = args.vla_timeout_s if step.kind == "vla" else args.sub_timeout_s
        rows.append(run_sub(step, s, work, timeout_s=min(limit, deadline - time.monotonic() - 10)))
    table = format_table(rows)
    print(
        f"\nmmrl GPU check ({'CPU smoke' if smoke else f'{gpus} GPU(s)'}, "
        f"{time.monotonic() - start:.0f}s; logs in {work / 'logs'})"
    )
    print(table)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0 if all(r.status in ("ok", "skipped") for r in rows) else 1


def _names(csv: str) -> list[str]:
    return [x for x in csv.split(",") if x]


def _model_row(kind: str, smoke: bool, work: Path, deadline: float, gpus: int) -> tuple[Row, list[str]]:
    """The model row of ``kind`` (vlm / vla) and the model overrides of its sub-runs ([] when there is no model).

    CPU smoke: the VLM is the tiny preset the run builds itself; π0 is built at the tiny builder's sizes by the same
    folder builder as on a GPU, on CPU. Otherwise the real sizes, built on the GPU (skipped without one, and π0 when
    the budget left cannot hold its build and run)."""
    if kind == "vlm":
        if smoke:
            return Row("model: tiny_qwen2_5_vl (offline build)", "ok", notes="CPU smoke: not a measurement"), [
                "model=tiny_qwen2_5_vl"
            ]
        if gpus == 0:
            return Row(VLM_MODEL_ROW, "skipped", notes=NO_GPU), []
        folder = work / "qwen2_5_vl_3b-random"
        row = _build_model_row(VLM_MODEL_ROW, folder, "qwen2_5_vl_3b", deadline)
        return row, (["model=qwen2_5_vl_3b", f"model.path={folder}"] if row.status == "ok" else [])
    preset, name = ("tiny_pi0", VLA_SMOKE_MODEL_ROW) if smoke else ("pi0", VLA_MODEL_ROW)
    folder = work / f"{preset}-random"
    if not smoke and gpus == 0:
        return Row(name, "skipped", notes=NO_GPU), []
    left = deadline - time.monotonic()
    if left < VLA_BUILD_MIN_S and not _is_built(folder, preset):
        return Row(
            name, "skipped", notes=f"time budget: {left:.0f}s left, a π0 build and run need {VLA_BUILD_MIN_S:.0f}s"
        ), []
    row = _build_model_row(
        name, folder, preset, deadline, device="cpu" if smoke else "cuda", max_s=150.0, reserve_s=90.0
    )
    return row, (vla_model_overrides(preset, folder) if row.status == "ok" else [])


def _is_built(folder: Path, preset: str) -> bool:
    """Whether ``folder`` holds a complete build of ``preset`` (its builder reuses it)."""
    if preset in PI0_BUILDS:
        return reusable_build(folder, pi0_build_info(preset)) is not None
    return (folder / MODEL_MARKER).is_file()


def _build_model_row(
    name: str,
    folder: Path,
    preset: str,
    deadline: float,
    *,
    device: str = "cuda",
    max_s: float = 180.0,
    reserve_s: float = 60.0,
) -> Row:
    """Build a random-weight model in its own process (its GPU memory is freed before the sub-runs), for at most
    ``max_s`` and leaving ``reserve_s`` of the budget for a sub-run."""
    t0 = time.monotonic()
    reused = _is_built(folder, preset)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--build-model", str(folder), "--build-preset", preset]
    try:
        p = subprocess.run(
            [*cmd, "--build-device", device],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=max(30.0, min(max_s, deadline - t0 - reserve_s)),
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
        )
    except subprocess.TimeoutExpired:
        return Row(name, "timeout", notes="the model build did not finish in time")
    if p.returncode != 0:
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        return Row(name, "failed", notes=(err[-1] if err else f"exit code {p.returncode}")[:200])
    n = json.loads(p.stdout.strip().splitlines()[-1])["num_parameters"]
    how = "reused" if reused else "built"
    return Row(name, "ok", notes=f"{n:,} parameters, {how} in {time.monotonic() - t0:.0f}s")


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
    if left < MIN_SUB_S[sub.kind]:
        return f"time budget: {left:.0f}s left of the check's budget"
    return ""


if __name__ == "__main__":
    sys.exit(main())
