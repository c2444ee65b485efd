"""The notebooks are executed here (small settings through their MMRL_NB_* parameters), so they cannot rot.

notebooks/diffusion_rl.ipynb runs end to end in a fresh kernel of this interpreter, offline, with a
private model cache: 3 RL steps of 2 prompts x 4 samples on a tiny SD3 pre-trained for 10 steps
(~30 s on a busy 2-core machine, most of it building and pre-training the tiny pipeline).
"""

from __future__ import annotations

import ast
import base64
import io
import json
import math
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "diffusion_rl.ipynb"

#: The smoke settings CI runs the notebook with.
SMALL = {
    "MMRL_NB_STEPS": "3",
    "MMRL_NB_BATCH": "2",
    "MMRL_NB_GROUP": "4",
    "MMRL_NB_EVAL": "4",
    "MMRL_NB_PRETRAIN": "10",
    "MMRL_NB_PRETRAIN_BATCH": "8",
    "MMRL_NB_GPU": "0",
}
TILE = 32  # tiny_sd3 image side (TinyDiffusionSpec.resolution)
SCALE = 4  # show_grid's default enlargement


def _cells(kind: str) -> list[dict]:
    nb = json.loads(NOTEBOOK.read_text())
    return [c for c in nb["cells"] if c["cell_type"] == kind]


def _source(cell: dict) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


# ---------------------------------------------------------------- static checks (fast)


def test_notebook_is_stored_without_outputs():
    for cell in _cells("code"):
        assert cell.get("outputs") == [], f"clear the outputs before committing: {_source(cell)[:60]!r}"
        assert cell.get("execution_count") is None


def test_parameters_cell_is_first_and_reads_every_knob_from_the_environment(monkeypatch):
    first = _source(_cells("code")[0])
    for var in (*SMALL, "MMRL_NB_OUTPUT"):
        assert f'"{var}"' in first, f"{var} is not read by the parameters cell"
    ns: dict = {}
    for var in SMALL:
        monkeypatch.setenv(var, SMALL[var])
    exec(compile(first, "parameters", "exec"), ns)
    assert (ns["STEPS"], ns["BATCH"], ns["GROUP"], ns["EVAL_PROMPTS"]) == (3, 2, 4, 4)
    assert (ns["PRETRAIN_STEPS"], ns["PRETRAIN_BATCH"], ns["RUN_GPU_EXAMPLE"]) == (10, 8, False)


def test_parameter_defaults_are_the_task_config(monkeypatch):
    for var in (*SMALL, "MMRL_NB_OUTPUT"):
        monkeypatch.delenv(var, raising=False)
    ns: dict = {}
    exec(compile(_source(_cells("code")[0]), "parameters", "exec"), ns)
    from mmrl.config import load_config

    cfg = load_config(["task=t2i_color"])  # the composed config: the YAML states only what differs from a default
    assert ns["STEPS"] == cfg.trainer.max_steps
    assert ns["BATCH"] == cfg.trainer.batch_size
    assert ns["GROUP"] == cfg.algo.group_size
    assert ns["EVAL_PROMPTS"] == cfg.trainer.eval.size
    assert ns["PRETRAIN_STEPS"] == cfg.task.pretrain_steps
    assert ns["OUTPUT_DIR"] == "runs" and ns["RUN_GPU_EXAMPLE"] is True


def _uses_gpu_recipe(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "GPU_RECIPES"
        for n in ast.walk(node)
    )


def test_gpu_training_is_guarded_by_cuda_availability():
    """A statement that builds a trainer from the real-model recipes sits in `if torch.cuda.is_available() ...:`."""
    found = 0
    for cell in _cells("code"):
        tree = ast.parse(_source(cell).replace("%matplotlib inline", ""))
        for stmt in tree.body:
            if not _uses_gpu_recipe(stmt):
                continue
            found += 1
            assert isinstance(stmt, ast.If) and "torch.cuda.is_available()" in ast.unparse(stmt.test), (
                f"GPU_RECIPES[...] used outside an `if torch.cuda.is_available()` block: {ast.unparse(stmt)[:80]}"
            )
            assert not any(_uses_gpu_recipe(s) for s in stmt.orelse)
    assert found == 1
    text = "".join(_source(c) for c in _cells("code"))
    assert "sd3_5_medium" in text and "flux1_dev" in text


# ---------------------------------------------------------------- execution


def _kernel_spec(root: Path) -> str:
    """A kernelspec running this very interpreter (so the kernel sees this venv's packages)."""
    name = "mmrl-nbtest-python"
    d = root / "kernels" / name
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "mmrl test kernel",
                "language": "python",
            }
        )
    )
    return name


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    import nbclient
    import nbformat

    tmp = tmp_path_factory.mktemp("nb")
    mp = pytest.MonkeyPatch()
    try:
        for var, val in SMALL.items():
            mp.setenv(var, val)
        mp.setenv("MMRL_NB_OUTPUT", str(tmp / "runs"))
        mp.setenv("MMRL_CACHE", str(tmp / "cache"))  # private cache: no dependency on what was built before
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("JUPYTER_PATH", str(tmp / "jupyter"))
        kernel = _kernel_spec(tmp / "jupyter")
        nb = nbformat.read(str(NOTEBOOK), as_version=4)
        client = nbclient.NotebookClient(
            nb, timeout=240, kernel_name=kernel, resources={"metadata": {"path": str(tmp)}}
        )
        client.execute()
    finally:
        mp.undo()
    return nb, tmp / "runs" / "t2i_color_notebook"


def _outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _stdout(nb) -> str:
    return "".join(o.get("text", "") for o in _outputs(nb) if o.output_type == "stream" and o.name == "stdout")


@pytest.mark.timeout(420)
def test_notebook_trains_and_prints_final_metrics(executed):
    nb, run_dir = executed
    assert not [o for o in _outputs(nb) if o.output_type == "error"]
    line = next(ln for ln in _stdout(nb).splitlines() if ln.startswith("final metrics:"))
    summary = json.loads(line[len("final metrics:") :])
    assert summary["steps"] == 3
    for key in ("eval/score", "reward/mean", "eval_score_before"):
        assert math.isfinite(summary[key]) and 0.0 <= summary[key] <= 1.0, key
    assert summary["policy/entropy"] > 0  # a Gaussian SDE step has a positive per-dimension entropy here
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # step 0: the baseline eval; steps 1..3: training, with an eval each (eval.every = max(1, 3 // 5) = 1)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r.get("eval/score") is not None for r in rows)
    assert rows[-1]["eval/score"] == pytest.approx(summary["eval/score"])


@pytest.mark.timeout(420)
def test_notebook_displays_grids_and_curves(executed):
    from PIL import Image

    nb, run_dir = executed
    pngs = [o.data["image/png"] for o in _outputs(nb) if o.output_type == "display_data" and "image/png" in o.data]
    assert len(pngs) == 3  # before grid, after grid, curves
    sizes = [Image.open(io.BytesIO(base64.b64decode(p))).size for p in pngs]
    # 4 eval prompts in one row of 4 tiles of 32 px, enlarged 4x: 512 x 128
    assert sizes[0] == sizes[1] == (4 * TILE * SCALE, TILE * SCALE)
    assert sizes[2][0] > sizes[2][1]  # the two-panel curve figure is wide
    for name in ("before.png", "after.png"):
        assert Image.open(run_dir / name).size == (4 * TILE, TILE)
    stdout = _stdout(nb)
    assert "GPU example skipped" in stdout  # MMRL_NB_GPU=0: the real-model cell must not train
    assert "sd3_5_medium" in stdout and "flux1_dev" in stdout
    assert os.environ.get("MMRL_NB_OUTPUT") != str(run_dir.parent)  # the fixture restored the environment


# ---------------------------------------------------------------- scripts/diffusion_grids.py (the docs images)


def _grids_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("diffusion_grids", ROOT / "scripts" / "diffusion_grids.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_short_caption():
    g = _grids_module()
    assert g.short_caption("a red circle on a blue background") == ["red circle", "on blue"]
    assert g.short_caption("an orange cat on a gray background") == ["orange cat", "on gray"]
    assert g.short_caption("photo of a cat") == ["photo of", "a cat"]  # 4 words: 2 + 2
    assert g.short_caption("a b c") == ["a b", "c"]  # ceil(3 / 2) = 2 words first
    assert g.short_caption("cat") == ["cat"]


def test_split_grid_and_labelled_grid_geometry():
    from PIL import Image

    g = _grids_module()
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255)]
    grid = Image.new("RGB", (3 * 2, 2 * 2), (9, 9, 9))  # 5 tiles of 2 px in 3 columns (one slot left empty)
    for k, c in enumerate(colours):
        grid.paste(Image.new("RGB", (2, 2), c), ((k % 3) * 2, (k // 3) * 2))
    tiles = g.split_grid(grid, 2, 5, 3)
    assert [t.getpixel((1, 1)) for t in tiles] == colours
    with pytest.raises(ValueError, match="cannot hold"):
        g.split_grid(grid, 2, 7, 3)  # 7 tiles need 3 rows of 2 px, the grid has 2

    captions = [["x"], ["y", "z"], ["w"], ["v", "u", "t"], ["s"]]
    out = g.labelled_grid(tiles, captions, cols=3, scale=4)
    # tiles 8 px; cell height 8 + 3 caption lines x 11 px + 4 = 45; 2 rows -> 90; 3 columns x 8 = 24
    assert out.size == (24, 90)
    assert out.getpixel((8 + 4, 45 + 4)) == colours[4]  # tile 4: row 1, column 1, enlarged
    assert out.getpixel((16 + 4, 45 + 4)) == (255, 255, 255)  # the empty sixth slot stays white
    with pytest.raises(ValueError, match="one caption per tile"):
        g.labelled_grid(tiles, captions[:4], cols=3, scale=4)
    with pytest.raises(ValueError, match="scale"):
        g.labelled_grid(tiles, captions, cols=3, scale=0)


def test_tile_rewards_are_the_task_colour_rule():
    from PIL import Image

    from mmrl.config import load_config
    from mmrl.tasks.diffusion.t2i_color import T2IColorTask

    g = _grids_module()
    cfg = load_config(["task=t2i_color"])
    task = T2IColorTask(cfg.task, cfg)
    item = next(it for it in task.eval_items() if it["color"] == "red" and it["background"] == "green")
    red, green = item["object_color"], item["background_color"]
    exact = Image.new("RGB", (32, 32), green)
    exact.paste(Image.new("RGB", (16, 16), red), (8, 8))  # the rule's centre is pixels 8..23 of 32
    all_bg = Image.new("RGB", (32, 32), green)  # centre wrong (0), border right (1): sqrt(0 * 1) = 0
    all_obj = Image.new("RGB", (32, 32), red)  # centre right (1), border wrong (0): 0
    assert g.tile_rewards(task, [item] * 3, [exact, all_bg, all_obj]) == pytest.approx([1.0, 0.0, 0.0])
