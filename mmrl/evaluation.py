"""Evaluation of a policy on a task's items (``Trainer.evaluate``, ``mmrl eval``).

:func:`evaluate_policy` rolls out every eval item (greedy, or ``samples`` seeded samples per item with seeds
fixed per item, so every evaluation sees the same noise), drops probe samples (``Rollout.without_probes``),
scores with the run's reward manager and returns ``eval/*`` metrics: ``eval/n``, ``eval/skipped``,
``eval/reward``, ``eval/reward/<fn>`` and the task's own (``Task.eval_metrics``; ``eval/score`` is the headline).

:func:`evaluate_checkpoint` is ``mmrl eval``: a run's checkpoint evaluated with the run's own saved config (plus
overrides), written to ``<run>/eval/<name>/{results.json,predictions.jsonl}`` with a fingerprint of the eval data
(docs/evaluation.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Sequence

import torch

from mmrl.builders import build_policy, build_rewards, build_task
from mmrl.collector import prepare_batch, sample_prompts
from mmrl.models.configs import model_path
from mmrl.policies.base import Policy
from mmrl.rewards.manager import RewardManager
from mmrl.rollout.noise import mix_seed
from mmrl.tasks.base import Task, TaskConfig, task_data

log = logging.getLogger(__name__)

EVAL_SEED_STREAM = 0xE7A1
"""Mixed into the run seed for the per-item evaluation seeds (disjoint from the training prompts' seeds)."""


def evaluate_policy(
    task: Task,
    policy: Policy,
    rewards: RewardManager,
    items: Sequence[dict],
    *,
    seed: int,
    batch_size: int,
    samples: int = 1,
    greedy: bool = True,
    predictions: list | None = None,
    progress=None,
) -> dict[str, float]:
    """Roll out ``samples`` completions (episodes, images) per item in batches of ``batch_size`` items, score them and
    return the ``eval/*`` metrics (module docstring). Runs inside ``policy.evaluation_outputs()``.

    ``predictions``: when a list is given, one row per scored sample is appended to it (:func:`prediction_row`).
    ``progress``: a :class:`mmrl.progress.PhaseProgress` over the items, advanced per batch with the running mean
    reward."""
    all_items: list[dict] = []
    all_samples: list = []
    per_fn: dict[str, list] = {}
    totals = []
    skipped = 0
    bs = max(1, batch_size)
    with policy.evaluation_outputs():
        for lo in range(0, len(items), bs):
            idx = list(range(lo, min(len(items), lo + bs)))
            batch, sk = prepare_batch(task, idx, [mix_seed(seed, EVAL_SEED_STREAM, i) for i in idx], items)
            skipped += sk
            if not len(batch):
                if progress is not None:
                    progress.update(len(idx))
                continue
            with torch.no_grad():
                ro = policy.rollout(batch, samples, greedy=greedy).without_probes()
            pos = sample_prompts(batch, ro)
            rep = [batch.items[p] for p in pos]
            skipped += int(ro.metrics.get("data/too_long", 0))  # prompts the policy left out (model.max_prompt_tokens)
            columns = task.reward_columns(rep)
            res = rewards([it.get("prompt", "") for it in rep], ro.samples, columns)
            if predictions is not None:
                seen: dict[int, int] = {}
                for j, p in enumerate(pos):
                    k = seen[p] = seen.get(p, -1) + 1
                    total = float(res.total[j]) if bool(res.valid[j]) else math.nan
                    predictions.append(
                        prediction_row(
                            batch.indices[p],
                            k,
                            rep[j],
                            ro.samples[j],
                            total,
                            {n: float(v[j]) for n, v in res.per_fn.items()},
                            {c: vals[j] for c, vals in columns.items()},
                        )
                    )
            all_items += rep
            all_samples += ro.samples
            totals.append(res.total)
            for k, v in res.per_fn.items():
                per_fn.setdefault(k, []).append(v)
            if progress is not None:
                progress.update(len(idx), reward=float(torch.cat(totals).mean()))
    out: dict[str, float] = {"eval/skipped": float(skipped), "eval/n": float(len(all_items))}
    if all_items:
        per_fn_t = {k: torch.cat(v) for k, v in per_fn.items()}
        out["eval/reward"] = float(torch.cat(totals).mean())
        for k, v in per_fn_t.items():
            ok = torch.isfinite(v)
            out[f"eval/reward/{k}"] = float(v[ok].mean()) if ok.any() else math.nan
        out.update(task.eval_metrics(all_items, all_samples, per_fn_t))
    return out


# ---------------------------------------------------------------- predictions and fingerprints


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _json_value(v: Any) -> tuple[bool, Any]:
    """(True, v as plain JSON) when ``v`` is JSON-serialisable without NaN / inf (tuples become lists), else (False, None)."""
    try:
        return True, json.loads(json.dumps(v, allow_nan=False))
    except (TypeError, ValueError, OverflowError):
        return False, None


def json_fields(record: dict) -> dict:
    """The JSON-serialisable fields of a record (images, tensors and NaNs left out)."""
    out = {}
    for k, v in record.items():
        ok, plain = _json_value(v)
        if ok:
            out[str(k)] = plain
    return out


def prediction_row(
    index: int,
    sample_no: int,
    item: dict,
    sample: Any,
    reward: float,
    per_fn: dict[str, float],
    columns: dict[str, Any],
) -> dict:
    """One row of ``predictions.jsonl``: eval item index, sample number within the item, item id, prompt text, raw
    output text (a sample dict's ``text``; null for other samples: images, episodes), total reward and per-function
    rewards (null for NaN / a failed reward), and the item's JSON-serialisable reward columns (the ground truth)."""
    text = sample.get("text") if isinstance(sample, dict) else sample if isinstance(sample, str) else None
    prompt = item.get("prompt")
    return {
        "index": int(index),
        "sample": int(sample_no),
        "id": item.get("id") if _json_value(item.get("id"))[0] else str(item.get("id")),
        "prompt": prompt if isinstance(prompt, str) else None,
        "text": text if isinstance(text, str) else None,
        "reward": _finite_or_none(reward),
        "rewards": {name: _finite_or_none(v) for name, v in per_fn.items()},
        "ground_truth": json_fields(columns),
    }


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def eval_data_files(task_cfg: TaskConfig) -> list[tuple[str, str]]:
    """``(task.<field>, path)`` of the files the eval items are read from: every string field of the task config
    that names an existing file, except ``task.data`` when ``task.eval_data`` is set (training data only)."""
    if not dataclasses.is_dataclass(task_cfg):
        return []
    eval_data = task_data(task_cfg).eval_data
    out = []
    for f in dataclasses.fields(task_cfg):
        v = getattr(task_cfg, f.name)
        if not isinstance(v, str) or not v or (f.name == "data" and eval_data):
            continue
        p = Path(v).expanduser()
        if p.is_file():
            out.append((f"task.{f.name}", str(p.resolve())))
    return out


def data_fingerprint(task_cfg: TaskConfig, items: Sequence[dict]) -> dict:
    """What was evaluated: the eval data files (path, sha256, bytes), the number of items and a sha256 over the
    items' JSON-serialisable fields (in order; media objects left out, media paths included)."""
    files = [
        {"key": key, "path": path, "sha256": file_sha256(path), "bytes": Path(path).stat().st_size}
        for key, path in eval_data_files(task_cfg)
    ]
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps(json_fields(it), sort_keys=True, separators=(",", ":")).encode())
        h.update(b"\n")
    return {"files": files, "items": len(items), "items_sha256": h.hexdigest()}


def describe_eval_data(task_cfg: TaskConfig, n_items: int, n_all: int) -> str:
    """``the held-out eval split of task.data=PATH`` / ``task.eval_data=PATH`` / ``the eval items of task=X (synthetic)``."""
    fields = task_data(task_cfg)
    if fields.eval_data:
        what = f"task.eval_data={fields.eval_data}"
    elif fields.data:
        what = f"the held-out eval split of task.data={fields.data}"
        if fields.num_eval is not None:
            what += f" (its last task.num_eval={fields.num_eval} items)"
    else:
        fmt = fields.data_format
        what = f"the eval items of task={task_cfg.name}" + (f" ({fmt})" if fmt else "")
    return what if n_items >= n_all else f"the first {n_items} of {n_all} of {what}"


# ---------------------------------------------------------------- mmrl eval

EVAL_NAME_KEY = "eval.name"
"""``mmrl eval ... eval.name=NAME``: the folder under ``<run>/eval/`` (default: the checkpoint's ``step_NNNNNN``)."""
_EVAL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclasses.dataclass
class CheckpointEval:
    """What :func:`evaluate_checkpoint` did."""

    metrics: dict[str, float]
    checkpoint: Path | None
    """None: the model of ``model.path`` was evaluated as built (``mmrl eval task=...`` without a checkpoint)."""
    step: int | None
    out_dir: Path
    n_items: int
    data: str
    config: Any
    table: dict | None = None
    """A simulator task's success table (per suite and task; :mod:`mmrl.adapters.vla.success_table`), else None."""


def _first_bad_weight(e: BaseException) -> str:
    """The first missing / unexpected / mis-sized weight named in a load error, else the error's first line."""
    msg = str(e)
    for pattern, what in (
        (r"missing \[['\"]([^'\"]+)", "missing weight"),
        (r"Missing key\(s\) in state_dict: \"([^\"]+)", "missing weight"),
        (r"unexpected \[['\"]([^'\"]+)", "unexpected weight"),
        (r"Unexpected key\(s\) in state_dict: \"([^\"]+)", "unexpected weight"),
        (r"size mismatch for ([^:\s]+)", "size mismatch for"),
    ):
        m = re.search(pattern, msg)
        if m:
            return f"{what} {m.group(1)}"
    m = re.search(r"(\S+) has shape (\([^)]*\)), model \S+ has (\([^)]*\))", msg)  # the VLM policy's shape check
    if m:
        return f"weight {m.group(1)} is {m.group(2)} in the checkpoint, {m.group(3)} in the model"
    first = (msg.strip().splitlines() or [""])[0][:200]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def _split_eval_overrides(overrides: list[str]) -> tuple[str | None, str | None, list[str]]:
    checkpoint = name = None
    rest = []
    for ov in overrides:
        key, _, value = ov.partition("=")
        key = key.lstrip("+")
        if key == "checkpoint":
            checkpoint = value
        elif key == EVAL_NAME_KEY:
            name = value
        else:
            rest.append(ov)
    return checkpoint, name, rest


def build_for_eval(cfg: Any) -> tuple[Task, RewardManager, Policy, torch.device]:
    """Task, reward manager and policy built as :class:`mmrl.trainer.Trainer` builds them (torch threads, seed, the
    accelerator's device, the task's plus the user's rewards), without an optimizer or the training items. The policy
    has its initial weights and is still on the CPU: load a checkpoint, then ``policy.to_device(device)`` unless the
    device is the CPU (the trainer's order)."""
    from accelerate import Accelerator

    tr = cfg.trainer
    if tr.threads > 0:
        torch.set_num_threads(tr.threads)
    device = Accelerator(cpu=(tr.device == "cpu")).device
    torch.manual_seed(tr.seed)
    task = build_task(cfg)  # the task sees checkpoint= (VLA: videos into the run dir)
    rewards = build_rewards(cfg, task)
    return task, rewards, build_policy(cfg, task), device


def evaluate_checkpoint(overrides: list[str]) -> CheckpointEval:
    """``mmrl eval checkpoint=PATH [eval.name=NAME] [key=value ...]`` (docs/evaluation.md).

    ``checkpoint``: a run directory (its newest complete checkpoint) or a ``step_N`` folder. The run's saved
    ``config.yaml`` is the config (:func:`mmrl.config.load_run_config`, overrides on top), so evaluation uses the
    training preprocessing; without a readable one, ``task=`` (and ``model=``) must be given as before. Evaluation is
    :meth:`mmrl.trainer.Trainer.evaluate`'s (same items, trainer.eval.size, seed, batch size, samples, greedy; the task, rewards
    and policy built as the trainer builds them, :func:`build_for_eval`). Writes
    ``results.json`` and ``predictions.jsonl`` into ``<run>/eval/<NAME>/``. A checkpoint that does not fit the
    requested task / model raises a one-line :class:`~mmrl.errors.ConfigError`.
    """
    from mmrl.checkpoint_files import checkpoint_step, resolve_checkpoint
    from mmrl.config import ConfigError, load_config

    checkpoint, name, rest = _split_eval_overrides(list(overrides))
    if name is not None and (not _EVAL_NAME_RE.match(name) or name in (".", "..")):
        raise ConfigError(f"{EVAL_NAME_KEY}={name!r}: use a folder name (letters, digits, '.', '_', '-')")
    if not checkpoint:
        if not any(ov.lstrip("+").split("=", 1)[0] == "task" for ov in rest):
            raise ConfigError(
                "mmrl eval needs checkpoint=PATH (a checkpoint folder or a run directory), or task=NAME "
                "to evaluate the model of model.path as it is"
            )
        ckpt = run_dir = saved_desc = step = None
        cfg = load_config(rest)
        name = name or f"{cfg.task.name}_{cfg.model.name}"
        out_dir = Path(cfg.trainer.output_dir) / "eval" / name
    else:
        try:
            ckpt = resolve_checkpoint(checkpoint)
        except FileNotFoundError as e:
            raise ConfigError(f"checkpoint={checkpoint}: {e}") from None
        run_dir = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None
        cfg, saved_desc = _eval_config(checkpoint, ckpt, run_dir, rest)
        step = checkpoint_step(ckpt)
        if name is None:  # the checkpoint folder's own name (step_000120), so eval/ mirrors checkpoints/
            name = (
                ckpt.name
                if re.match(r"^step_\d+$", ckpt.name)
                else f"step_{step}"
                if step is not None
                else "checkpoint"
            )
        out_dir = (run_dir if run_dir is not None else ckpt) / "eval" / name

    task, rewards, policy, device = build_for_eval(cfg)
    policy.prepare_for_evaluation(max(1, cfg.trainer.batch_size) * max(1, cfg.trainer.eval.samples))
    task.output_dir = out_dir  # simulator tasks write their success table and videos beside results.json
    try:
        if ckpt is not None:
            _load_weights_or_explain(policy, ckpt, cfg, saved_desc)
        if device.type != "cpu":
            policy.to_device(device)
        tr = cfg.trainer
        all_items = list(task.eval_items())
        items = all_items[: tr.eval.size] if tr.eval.size is not None else all_items
        predictions: list[dict] = []
        from mmrl.progress import PhaseProgress

        with PhaseProgress(f"mmrl eval {cfg.task.name}", len(items), unit="item", enabled=tr.logging.progress) as bar:
            metrics = evaluate_policy(
                task,
                policy,
                rewards,
                items,
                seed=tr.seed,
                batch_size=tr.batch_size,
                samples=tr.eval.samples,
                greedy=tr.eval.greedy,
                predictions=predictions,
                progress=bar,
            )
    finally:
        policy.close()
    data = describe_eval_data(cfg.task, len(items), len(all_items))
    table = task.last_eval_table
    _write_eval_outputs(
        out_dir,
        metrics,
        predictions,
        cfg,
        ckpt=ckpt,
        step=step,
        run_dir=run_dir,
        saved_desc=saved_desc,
        data={"description": data, **data_fingerprint(cfg.task, items)},
        table=table,
    )
    return CheckpointEval(
        metrics=metrics,
        checkpoint=ckpt,
        step=step,
        out_dir=out_dir,
        n_items=len(items),
        data=data,
        config=cfg,
        table=table,
    )


def _eval_config(checkpoint: str, ckpt: Path, run_dir: Path | None, overrides: list[str]) -> tuple[Any, str | None]:
    """The run's saved config with ``overrides`` on top and its "task=A model=B" description; without a readable run
    config, the command-line config (which must then name the task)."""
    import yaml

    from mmrl.config import ConfigError, load_config, load_run_config, trained_with

    try:
        if run_dir is None:
            raise FileNotFoundError(f"{ckpt} is not inside a run directory")
        cfg = load_run_config(run_dir, overrides)
        saved_desc = trained_with(yaml.safe_load((run_dir / "config.yaml").read_text()))
    except FileNotFoundError as e:
        if not any(ov.lstrip("+").split("=", 1)[0] == "task" for ov in overrides):
            raise ConfigError(
                f"checkpoint={checkpoint} has no readable run config ({e}); give task=NAME (and the "
                "model=PRESET it was trained with) to evaluate it"
            ) from None
        log.debug("no readable run config for %s (%s): evaluating with the command-line config", ckpt, e)
        cfg, saved_desc = load_config(overrides), None
    cfg.checkpoint = str(ckpt)
    return cfg, saved_desc


def _load_weights_or_explain(policy: Policy, ckpt: Path, cfg: Any, saved_desc: str | None) -> None:
    """Load the checkpoint's weights; weights that do not fit the built model are one ConfigError line saying what
    the checkpoint was trained with and the first differing weight (not a list of ~100 weight names). A damaged
    file is reported as damaged (:class:`~mmrl.checkpoint_files.DamagedCheckpointError`), never as a mismatch."""
    from mmrl.checkpoint_files import CheckpointMismatchError
    from mmrl.config import ConfigError

    try:
        policy.load_pretrained(ckpt / "pretrained_model")
        return
    except CheckpointMismatchError as e:
        detail = e.detail
    except (ConfigError, KeyboardInterrupt):  # DamagedCheckpointError is a ConfigError: damaged stays damaged
        raise
    except Exception as e:  # noqa: BLE001 - the files were validated first: a loader failure means "not this model"
        detail = _first_bad_weight(e)
    path = model_path(cfg.model)
    path = path if path not in (None, cfg.model.name) else None
    model = f"model={cfg.model.name}" + (f" (path {path})" if path else "")
    if saved_desc:
        msg = f"checkpoint {ckpt} was trained with {saved_desc}; it does not fit {model}"
    else:
        msg = (
            f"checkpoint {ckpt} (no run config.yaml tells what it was trained with) does not fit "
            f"task={cfg.task.name} {model}"
        )
    raise ConfigError(f"{msg}: {detail}") from None


def _write_eval_outputs(
    out_dir: Path,
    metrics: dict,
    predictions: list[dict],
    cfg: Any,
    *,
    ckpt: Path | None,
    step: int | None,
    run_dir: Path | None,
    saved_desc: str | None,
    data: dict,
    table: dict | None = None,
) -> None:
    """``results.json`` (metrics, checkpoint, data fingerprint, config, success table) and ``predictions.jsonl`` in
    ``out_dir``."""
    from mmrl.config import to_dict

    results = {
        "metrics": {k: _finite_or_none(float(v)) for k, v in metrics.items()},
        "checkpoint": str(ckpt.resolve()) if ckpt is not None else None,
        "model_path": model_path(cfg.model),
        "success_table": table,
        "step": step,
        "run_dir": str(run_dir.resolve()) if run_dir is not None else None,
        "trained_with": saved_desc,
        "eval_name": out_dir.name,
        "data": data,
        "samples": len(predictions),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": to_dict(cfg),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    with open(out_dir / "predictions.jsonl", "w") as f:
        for row in predictions:
            f.write(json.dumps(row) + "\n")
