"""`mmrl eval checkpoint=<run>`: a run evaluated as trained (its saved config.yaml, no task=), with results.json,
predictions.jsonl and the eval data's fingerprint; overrides on top; one-line errors for checkpoints that do not fit.

One tiny run (module fixture, ~15 s): task=vqa_grounding on a user VLM-R1 REC file (10 records, the last 4 held out for
evaluation), tiny Qwen3-VL, a short SFT warm start so the greedy answers are JSON boxes (non-zero eval numbers), 2 GRPO
steps and the final greedy eval logged in metrics.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image, ImageDraw

from mmrl.cli import main
from mmrl.config import ConfigError, load_config, load_run_config
from mmrl.evaluation import evaluate_policy
from mmrl.trainer import Trainer

COLORS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}
N_RECORDS, N_EVAL = 10, 4
PREDICTION_KEYS = {"index", "sample", "id", "prompt", "text", "reward", "rewards", "ground_truth"}


def write_rec_file(root: Path) -> Path:
    """A VLM-R1 REC JSONL (image, problem, solution box in pixels, normal_caption) and its 128x128 images."""
    records = []
    for i in range(N_RECORDS):
        color = list(COLORS)[i % 3]
        x, y = 8 + 7 * i, 12 + 6 * i
        box = [x, y, x + 40, y + 36]
        img = Image.new("RGB", (128, 128), (240, 240, 240))
        ImageDraw.Draw(img).rectangle(box, fill=COLORS[color])
        img.save(root / f"img{i}.png")
        records.append(
            {
                "image": f"img{i}.png",
                "solution": box,
                "normal_caption": f"the {color} box",
                "problem": f"Please provide the bounding box coordinate of the region this sentence describes: "
                f"the {color} box.",
            }
        )
    path = root / "rec.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_cli")
    rec = write_rec_file(root)
    cfg = load_config(
        [
            "task=vqa_grounding",
            "task.data_format=vlm_r1",
            f"task.data={rec}",
            f"task.image_root={root}",
            f"task.num_eval={N_EVAL}",
            f"trainer.output_dir={root}",
            "trainer.run_name=run",
            "trainer.warm_start.steps=150",
            "trainer.warm_start.batch_size=4",
            "trainer.max_steps=2",
            "trainer.batch_size=2",
            "algo.group_size=2",
            "model.max_new_tokens=40",
            "trainer.eval.every=0",
            "trainer.eval.at_end=true",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
        ]
    )
    tr = Trainer(cfg)
    tr.fit()
    last = [json.loads(line) for line in (tr.run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    # what the trained policy answers, in memory (the CLI must reproduce these texts from the checkpoint)
    rows: list = []
    evaluate_policy(
        tr.task,
        tr.policy,
        tr.rewards,
        list(tr.task.eval_items()),
        seed=cfg.trainer.seed,
        batch_size=cfg.trainer.batch_size,
        predictions=rows,
    )
    return SimpleNamespace(root=root, rec=rec, run_dir=tr.run_dir, last=last, rows=rows)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_of_a_run_reproduces_its_final_eval(run, capsys):
    assert run.last["step"] == 2 and run.last["eval/n"] == N_EVAL
    assert run.last["eval/reward/format"] > 0  # the warm start makes the eval answers JSON: the numbers are not all 0
    capsys.readouterr()
    assert main(["eval", f"checkpoint={run.run_dir}"]) == 0  # no task=: the run's own config.yaml
    out, err = capsys.readouterr()
    metrics = json.loads(out)  # stdout: the metrics as JSON; stderr: the table and the summary line
    assert metrics["eval/n"] == run.last["eval/n"] and metrics["eval/score"] == round(run.last["eval/score"], 4)
    assert "eval/score" in err and f"evaluated {N_EVAL} items ({N_EVAL} samples) of " in err
    assert f"task.data={run.rec}" in err and "(step 2)" in err

    out_dir = run.run_dir / "eval" / "step_000002"
    results = json.loads((out_dir / "results.json").read_text())
    for key in ("eval/score", "eval/n", "eval/reward", "eval/mean_iou", "eval/reward/format"):
        assert results["metrics"][key] == run.last[key], key  # exactly the numbers of the run's final eval
    assert results["step"] == 2 and results["checkpoint"] == str(
        (run.run_dir / "checkpoints" / "step_000002").resolve()
    )
    assert results["trained_with"] == "task=vqa_grounding model=tiny_qwen3_vl"
    assert results["config"]["task"]["data"] == str(run.rec) and results["config"]["checkpoint"]
    data = results["data"]
    assert data["items"] == N_EVAL  # the run's held-out split: the last task.num_eval records of the REC file
    (f,) = data["files"]
    assert f["key"] == "task.data" and f["path"] == str(run.rec.resolve())
    assert f["sha256"] == hashlib.sha256(run.rec.read_bytes()).hexdigest() and len(data["items_sha256"]) == 64

    preds = read_jsonl(out_dir / "predictions.jsonl")
    assert len(preds) == N_EVAL and all(set(p) == PREDICTION_KEYS for p in preds)
    assert [p["index"] for p in preds] == list(range(N_EVAL))
    assert [p["id"] for p in preds] == [f"rec.jsonl:{i}" for i in range(N_RECORDS - N_EVAL + 1, N_RECORDS + 1)]
    assert [p["text"] for p in preds] == [r["text"] for r in run.rows]  # the trained weights' answers, token for token
    first = preds[0]
    assert "the red box" in first["prompt"] or "the blue box" in first["prompt"] or "the green box" in first["prompt"]
    assert set(first["rewards"]) == {"grounding", "format", "duplicate"}
    assert first["ground_truth"]["gt_boxes"] and first["ground_truth"]["image_size"] == [128, 128]
    mean_format = sum(p["rewards"]["format"] for p in preds) / len(preds)
    assert mean_format == pytest.approx(run.last["eval/reward/format"])


def test_overrides_on_top_of_the_saved_config(run, capsys):
    assert (
        main(
            [
                "eval",
                f"checkpoint={run.run_dir / 'checkpoints' / 'step_000002'}",
                "trainer.eval.size=1",
                "eval.name=first_item",
            ]
        )
        == 0
    )
    capsys.readouterr()
    results = json.loads((run.run_dir / "eval" / "first_item" / "results.json").read_text())
    assert results["metrics"]["eval/n"] == 1 and results["data"]["items"] == 1
    assert "the first 1 of 4 of" in results["data"]["description"]
    assert len(read_jsonl(run.run_dir / "eval" / "first_item" / "predictions.jsonl")) == 1
    assert results["config"]["trainer"]["eval"]["size"] == 1 and results["config"]["task"]["num_eval"] == N_EVAL
    # another eval file of the same format, same preprocessing
    other = run.root / "other.jsonl"
    other.write_text("".join(run.rec.read_text().splitlines(keepends=True)[:3]))
    assert main(["eval", f"checkpoint={run.run_dir}", f"task.eval_data={other}", "eval.name=other"]) == 0
    assert f"of task.eval_data={other} with checkpoint" in capsys.readouterr().err
    data = json.loads((run.run_dir / "eval" / "other" / "results.json").read_text())["data"]
    assert data["items"] == 3 and [f["key"] for f in data["files"]] == ["task.eval_data"]
    # the same function, directly: the saved config plus overrides; a misspelt key is the usual one-line error
    cfg = load_run_config(run.run_dir, ["trainer.eval.size=2", "task=vqa_grounding"])  # its own task: a no-op
    assert cfg.trainer.eval.size == 2 and cfg.task.data == str(run.rec) and cfg.model.name == "tiny_qwen3_vl"
    with pytest.raises(ConfigError, match="unknown key 'trainer.eval_sise'"):
        load_run_config(run.run_dir, ["trainer.eval_sise=2"])


def test_mismatched_task_or_model_is_one_line(run, capsys):
    trained = "trained with task=vqa_grounding model=tiny_qwen3_vl"
    assert main(["eval", f"checkpoint={run.run_dir}", "task=toy_arithmetic"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and trained in err and "task=toy_arithmetic" in err
    # a real process: exit code 2, one line on stderr, no traceback
    p = subprocess.run(
        [sys.executable, "-m", "mmrl.cli", "eval", f"checkpoint={run.run_dir}", "model=tiny_qwen2_vl"],
        capture_output=True,
        text=True,
        cwd=run.root,
    )
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert trained in p.stderr and "model=tiny_qwen2_vl" in p.stderr


def test_checkpoint_without_run_config_falls_back_to_task_and_model(run, capsys):
    bare = run.root / "bare"
    shutil.copytree(run.run_dir / "checkpoints" / "step_000002", bare / "checkpoints" / "step_000002")
    assert main(["eval", f"checkpoint={bare}"]) == 2  # no config.yaml: task= is needed, as before
    err = capsys.readouterr().err
    assert "has no readable run config" in err and "task=" in err
    # weights that do not fit the model built from the command line: one line naming the first bad weight
    assert (
        main(
            [
                "eval",
                f"checkpoint={bare}",
                "task=vqa_grounding",
                "model=tiny_qwen2_vl",
                "task.num_train=2",
                "task.num_eval=1",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not fit task=vqa_grounding model=tiny_qwen2_vl: weight model." in err
