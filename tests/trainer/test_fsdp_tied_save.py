"""The saved model folder is the same whichever strategy wrote it: a 2-process trainer.strategy=fsdp2 run (gloo, CPU)
writes the tiny LM's tied embedding once, as a single-process save_pretrained does (issue 22), and with LoRA the
same adapter files."""

from pathlib import Path

from safetensors.torch import load_file

from tests.helpers import run_results, run_script

SHORT = ["trainer.strategy=fsdp2", "trainer.batch_size=2", "algo.group_size=2"]
"""One short fsdp2 step of toy_arithmetic with the tiny LM (tie_word_embeddings=True, see mmrl/models/tiny_lm.py)."""


def saved_folder(out: Path) -> Path:
    """The pretrained_model/ folder of the newest checkpoint of a :func:`tests.helpers.run_script` run."""
    return sorted((out / "run" / "checkpoints").glob("step_*"))[-1] / "pretrained_model"


def run_one_and_two(tmp_path: Path, *extra: str) -> tuple[Path, Path]:
    """The pretrained_model/ folders of the same one-step fsdp2 run in 1 and in 2 processes."""
    run_script(tmp_path / "one", 1, *SHORT, *extra)
    run_script(tmp_path / "two", 1, *SHORT, *extra, processes=2)
    return saved_folder(tmp_path / "one"), saved_folder(tmp_path / "two")


def assert_same_tensors(one: Path, two: Path, name: str) -> dict:
    """File ``name`` holds the same keys in both folders and values equal within fp noise (the two runs train alike,
    tests/trainer/test_fsdp.py); returns the 2-process tensors."""
    a, b = load_file(str(one / name)), load_file(str(two / name))
    assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 2e-5, f"{name}: max difference {worst}"
    return b


def test_fsdp2_save_writes_a_tied_weight_once_like_one_process(tmp_path):
    one, two = run_one_and_two(tmp_path)
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    saved = assert_same_tensors(one, two, "model.safetensors")
    assert "model.embed_tokens.weight" in saved and "lm_head.weight" not in saved  # tied: written once
    params, _ = run_results(tmp_path / "two")  # the gathered trained weights: the file holds exactly them
    assert all(float((saved[k] - params["lm." + k]).abs().max()) == 0.0 for k in saved)


def test_fsdp2_lora_save_writes_the_same_adapter_files(tmp_path):
    one, two = run_one_and_two(tmp_path, "model.lora.enabled=true")
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    assert not (two / "model.safetensors").exists()
    saved = assert_same_tensors(one, two, "adapter_model.safetensors")
    assert saved and all("lora_" in k for k in saved)
