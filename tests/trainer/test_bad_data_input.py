"""Bad data input stops the run before training with ONE line naming the file (and row), or is skipped and counted.

Each error family runs `python -m mmrl.cli train ...` at least once as a subprocess (exit code, one error line on
stderr, no traceback); the rest go through `mmrl.cli.main([...])` in-process. Skips are checked in metrics.jsonl
(`data/too_long`, `data/load_skipped`, `data/empty_steps`, `eval/skipped`) and in the load-time warning line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from PIL import Image  # noqa: E402

from mmrl.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
INSTR = "Please provide the bounding box coordinate of the region this sentence describes: "
TINY = [
    "trainer.max_steps=1",
    "trainer.batch_size=2",
    "algo.group_size=2",
    "trainer.warm_start.steps=0",
    "trainer.checkpointing.overwrite=true",
    "trainer.logging.progress=false",
    "trainer.logging.plot=false",
    "trainer.logging.tensorboard=false",
    "trainer.eval.size=2",
    "model.max_new_tokens=4",
    "trainer.device=cpu",
]


def run_cli(*args: str, out: Path, name: str = "run") -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "mmrl.cli",
        "train",
        *TINY,
        *args,
        f"trainer.output_dir={out}",
        f"trainer.run_name={name}",
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def in_process(capsys, *args: str, out: Path) -> tuple[int, str]:
    rc = main(["train", *TINY, *args, f"trainer.output_dir={out}", "trainer.run_name=run"])
    return rc, capsys.readouterr().err


def error_line(stderr: str) -> str:
    """The one `mmrl train: ...` line of stderr (log lines are INFO/WARNING lines and are left aside)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.startswith("mmrl train: ")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def metrics(run_dir: Path) -> dict:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return rows[-1]


# ----------------------------------------------------------------------------- data


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad_data")
    Image.new("RGB", (64, 48), (220, 220, 220)).save(d / "img.png")
    ok = {"image": "img.png", "problem": INSTR + "the grey square.", "solution": [5, 5, 30, 30]}
    bad = {"three": [5, 5, 30], "reversed": [30, 5, 5, 30], "outside": [100, 60, 120, 80]}
    for name, box in bad.items():
        rows = [ok, {**ok, "solution": box}, ok, ok]
        (d / f"r1_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # canonical JSONL: the second question makes a prompt of ~440 tokens, the others ~145
    rows = [
        {"image": "img.png", "question": f"the thing {i}", "boxes": [{"bbox": [5, 5, 30, 30]}], "bbox_frame": "pixels"}
        for i in range(4)
    ]
    rows[1]["question"] = "the thing " + "very " * 100
    (d / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "long_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    # Charades-STA over two real (synthetic) videos; one 33,000-character sentence
    from mmrl.adapters.video.synthetic import make_video_dataset

    recs = make_video_dataset(d / "videos", 2, 0, "temporal", duration_s=4.0, fps=4, size=(64, 48))
    ids = [Path(r["video"]).stem for r in recs]
    lines = [f"{ids[i % 2]} 1.0 2.0##the circle appears" for i in range(5)]
    lines.insert(1, f"{ids[0]} 1.0 2.0##" + "x" * 33000)
    (d / "charades.txt").write_text("\n".join(lines) + "\n")
    (d / "empty.txt").write_text("\n\n")
    return d


def vlm_r1(data: Path, name: str, *extra: str) -> list[str]:
    return [
        "task=vqa_grounding",
        "task.data_format=vlm_r1",
        f"task.data={data / f'r1_{name}.jsonl'}",
        f"task.image_root={data}",
        "task.num_eval=1",
        *extra,
    ]


def charades(data: Path, ann: str = "charades.txt", *extra: str) -> list[str]:
    return [
        "task=video_temporal_grounding",
        "task.data_format=charades",
        f"task.data={data / ann}",
        f"task.video_root={data / 'videos'}",
        "task.num_eval=1",
        *extra,
    ]


# ----------------------------------------------------------------------------- 1. missing files


def test_missing_data_file_subprocess(data, tmp_path):
    p = run_cli("task=vqa_grounding", "task.data_format=jsonl", "task.data=/no/such.json", out=tmp_path)
    assert p.returncode == 2
    assert error_line(p.stderr) == (
        "mmrl train: error: task.data=/no/such.json: file not found; give the path of an existing jsonl file"
    )
    p = run_cli(*charades(data)[:2], "task.data=/no/such.txt", f"task.video_root={data}", out=tmp_path)
    assert p.returncode == 2 and "task.data=/no/such.txt: file not found" in error_line(p.stderr)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["task.eval_data=/no/such.json"], "task.eval_data=/no/such.json: file not found"),
        (["task.data_format=synthetic", "task.data=/no/such.json"], "task.data_format=synthetic ignores task.data"),
    ],
)
def test_missing_eval_file_and_ignored_data_in_process(data, tmp_path, capsys, args, needle):
    rc, err = in_process(capsys, *vlm_r1(data, "three"), *args, out=tmp_path)
    assert rc == 2 and needle in error_line(err)
    rc, err = in_process(capsys, *charades(data), *args, out=tmp_path)
    assert rc == 2 and needle in error_line(err)


# ----------------------------------------------------------------------------- 2. empty Charades file


def test_empty_charades_file_is_one_line(data, tmp_path, capsys):
    p = run_cli(*charades(data, "empty.txt"), out=tmp_path)
    assert p.returncode == 2
    assert error_line(p.stderr).endswith(
        f"task.data={data / 'empty.txt'}: no usable rows (the file has no annotation "
        "lines); give a non-empty annotation file"
    )
    # eval items are read at the first evaluation (here after the one step): still one line
    rc, err = in_process(capsys, *charades(data, "charades.txt", f"task.eval_data={data / 'empty.txt'}"), out=tmp_path)
    assert rc == 2 and f"task.eval_data={data / 'empty.txt'}: no usable rows" in error_line(err)


# ----------------------------------------------------------------------------- 3./4. bad VLM-R1 boxes


def test_bad_vlm_r1_boxes_are_one_line_naming_file_and_row(data, tmp_path, capsys):
    p = run_cli(*vlm_r1(data, "outside"), out=tmp_path)
    assert p.returncode == 2
    line = error_line(p.stderr)
    assert (
        "r1_outside.jsonl:2: box 0 lies entirely outside the image ([100.0, 60.0, 120.0, 80.0] vs pixels extent 64x48)"
        in line
    )
    assert "task.on_invalid_box=skip" in line
    for name, needle in (
        ("three", "r1_three.jsonl:2: no [x1, y1, x2, y2] box found in the answer [5, 5, 30]"),
        ("reversed", "r1_reversed.jsonl:2: box 0 has x2 < x1 ([30.0, 5.0, 5.0, 30.0])"),
    ):
        rc, err = in_process(capsys, *vlm_r1(data, name), out=tmp_path)
        assert rc == 2 and needle in error_line(err)


def test_on_invalid_box_skip_counts_the_rows(data, tmp_path):
    p = run_cli(*vlm_r1(data, "outside", "task.on_invalid_box=skip"), out=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    skip_lines = [ln for ln in p.stderr.splitlines() if "skipped 1 of 4 rows of" in ln]
    assert len(skip_lines) == 1 and skip_lines[0].startswith("WARNING ")
    assert f"rows of {data / 'r1_outside.jsonl'}: box outside the image (first: " in skip_lines[0]
    assert metrics(tmp_path / "run")["data/load_skipped"] == 1.0

    from mmrl.config import ConfigError
    from mmrl.tasks.grounding.vqa_grounding.task import VQAGroundingConfig, VQAGroundingTask

    for name in ("three", "reversed"):  # the same policy for every unusable box
        cfg = VQAGroundingConfig(
            data_format="vlm_r1",
            data=str(data / f"r1_{name}.jsonl"),
            image_root=str(data),
            num_eval=1,
            box_frame="norm1000",
            on_invalid_box="skip",
        )
        task = VQAGroundingTask(cfg, None)
        assert len(task.train_items()) == 2 and task.load_skipped["train"] == 1
    with pytest.raises(ConfigError, match="task.on_invalid_box: 'drop' is not valid; choose from error, skip"):
        VQAGroundingConfig(on_invalid_box="drop").validate()


# ----------------------------------------------------------------------------- 5. prompts over model.max_prompt_tokens


def test_too_long_prompt_is_skipped_and_counted(data, tmp_path):
    p = run_cli(
        "task=vqa_grounding",
        "task.data_format=jsonl",
        f"task.data={data / 'long.jsonl'}",
        f"task.eval_data={data / 'long_eval.jsonl'}",
        "trainer.batch_size=4",
        "model.max_prompt_tokens=200",
        out=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "model.max_prompt_tokens=200" in p.stderr
    m = metrics(tmp_path / "run")
    assert m["data/too_long"] == 1.0 and m["update/samples"] == 6.0  # 3 prompts x 2 samples trained
    assert m["eval/skipped"] == 1.0 and m["eval/n"] == 1.0


def test_every_prompt_too_long_gives_an_empty_step(data, tmp_path):
    """With no skip limit, a step whose prompts are all too long is empty (counted); a run of only such steps trained
    nothing, which is an error (exit 1, no checkpoint)."""
    p = run_cli(
        "task=vqa_grounding",
        "task.data_format=jsonl",
        f"task.data={data / 'long.jsonl'}",
        f"task.eval_data={data / 'long_eval.jsonl'}",
        "model.max_prompt_tokens=20",
        "trainer.limits.data_skip_threshold=1.0",
        out=tmp_path,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "trained nothing: 1 step(s) ran" in error_line(p.stderr)
    m = metrics(tmp_path / "run")
    assert m["data/too_long"] == 2.0 and m["data/empty_steps"] == 1.0 and m["data/skipped"] == 2.0
    assert m["eval/skipped"] == 2.0 and m["eval/n"] == 0.0
    # too-long prompts count as skipped items: a run where they all are stops at trainer.limits.data_skip_threshold
    p = run_cli(
        "task=vqa_grounding",
        "task.data_format=jsonl",
        f"task.data={data / 'long.jsonl'}",
        f"task.eval_data={data / 'long_eval.jsonl'}",
        "model.max_prompt_tokens=20",
        "trainer.max_steps=3",
        out=tmp_path,
        name="aborted",
    )
    assert p.returncode == 1 and "data items were skipped" in error_line(p.stderr)


def test_too_long_prompt_in_the_warm_start_is_one_line(data, tmp_path, capsys):
    # RL and evaluation skip such prompts; SFT cannot train on them: one line naming the limit, exit 2
    rc, err = in_process(
        capsys,
        "task=vqa_grounding",
        "task.data_format=jsonl",
        f"task.data={data / 'long.jsonl'}",
        f"task.eval_data={data / 'long_eval.jsonl'}",
        "model.max_prompt_tokens=20",
        "trainer.warm_start.steps=1",
        "trainer.eval.at_end=false",
        out=tmp_path,
    )
    assert rc == 2 and "model.max_prompt_tokens=20" in error_line(err)


def test_policy_rollout_leaves_out_too_long_prompts():
    import torch

    from mmrl.models.configs import VLMConfig
    from mmrl.models.presets import resolve_vlm
    from mmrl.models.tiny_vlm import load_vlm
    from mmrl.policies.base import PromptBatch
    from mmrl.policies.vlm import PromptTooLongError, VLMPolicy

    lm, proc = load_vlm(resolve_vlm("tiny_qwen3_vl"))
    policy = VLMPolicy(lm, proc, VLMConfig(max_new_tokens=3, max_prompt_tokens=100))
    img = Image.new("RGB", (32, 32), (200, 30, 30))
    items = [{"image": img, "prompt": "a"}, {"image": img, "prompt": "b " * 200}, {"image": img, "prompt": "c"}]
    ro = policy.rollout(PromptBatch(items=items, indices=[7, 8, 9], seeds=[11, 22, 33]), 2)
    assert ro.prompt_index.tolist() == [0, 0, 2, 2] and ro.group_id.tolist() == [11, 11, 33, 33]
    assert ro.metrics["data/too_long"] == 1.0 and len(ro.samples) == 4
    empty = policy.rollout(PromptBatch(items=items[1:2], indices=[8], seeds=[22]), 2)
    assert empty.batch_size == 0 and empty.metrics == {"data/too_long": 1.0}
    assert torch.equal(empty.prompt_index, torch.zeros(0, dtype=torch.long))
    with pytest.raises(PromptTooLongError):  # direct preprocessing (SFT, sample_meta) still refuses
        policy.preprocess(items[1:2])


# ----------------------------------------------------------------------------- 6. text length guard at load time


def test_overlong_charades_sentence_is_skipped_at_load(data, tmp_path):
    p = run_cli(*charades(data), out=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "task.max_prompt_chars" in ln]
    assert len(lines) == 1 and "skipped 1 of 5 items with prompts over task.max_prompt_chars=4000" in lines[0]
    assert "charades.txt:2" in lines[0]
    assert metrics(tmp_path / "run")["data/load_skipped"] == 1.0


def test_text_guard_in_every_loader(data, tmp_path):
    from mmrl.config import ConfigError
    from mmrl.tasks.grounding.vqa_grounding.task import VQAGroundingConfig, VQAGroundingTask
    from mmrl.tasks.video.video_qa import VideoQAConfig, VideoQATask
    from mmrl.tasks.video.video_temporal_grounding import VideoTemporalGroundingConfig, VideoTemporalGroundingTask

    qa = tmp_path / "qa.jsonl"
    rec = {
        "video": "v.mp4",
        "question": "What colour?",
        "question_type": "multiple_choice",
        "options": ["red", "blue"],
        "answer": "A",
    }
    qa.write_text("".join(json.dumps(r) + "\n" for r in (rec, {**rec, "question": "y" * 5000}, rec)))
    task = VideoQATask(VideoQAConfig(data_format="jsonl", data=str(qa), num_eval=0), None)
    assert len(task.train_items()) == 2 and task.load_skipped["train"] == 1
    cfg = VideoTemporalGroundingConfig(
        data_format="charades",
        data=str(data / "charades.txt"),
        video_root=str(data / "videos"),
        num_eval=0,
        max_prompt_chars=10,
    )
    with pytest.raises(ConfigError, match="no usable train items: all 6 have prompts over task.max_prompt_chars=10"):
        VideoTemporalGroundingTask(cfg, None).train_items()
    with pytest.raises(ConfigError, match="task.max_prompt_chars must be >= 1"):
        VideoQAConfig(max_prompt_chars=0).validate()
    long_jsonl = VQAGroundingConfig(
        data_format="jsonl", data=str(data / "long.jsonl"), num_eval=0, box_frame="norm1000", max_prompt_chars=500
    )
    grounding = VQAGroundingTask(long_jsonl, None)
    assert len(grounding.train_items()) == 3 and grounding.load_skipped["train"] == 1
