"""Damaged or inconsistent LeRobot policy folders are one line naming the file and the key, never a traceback or a
hub request: a config.json whose values have the wrong JSON type or that is not an object, a ``type`` that disagrees
with the weights, and a VLM that is not where config.json's ``vlm_model_name`` says (issue 42, items 9, 11, 12)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from mmrl.adapters.vla.lerobot import LeRobotCheckpointError  # noqa: E402
from mmrl.adapters.vla.lerobot.policy import load_lerobot_folder  # noqa: E402
from mmrl.errors import ConfigError  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot"


def _copy(tmp_path: Path, name: str = "smolvla_tiny", **changes) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _one_line(folder: Path) -> str:
    with pytest.raises(LeRobotCheckpointError) as info:
        load_lerobot_folder(str(folder))
    assert isinstance(info.value, ConfigError)  # mmrl train / eval: one line, exit 2
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", ["smolvla_tiny", "pi0_tiny"])
@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("chunk_size", "fifty", "expected an integer"),
        ("chunk_size", 5.5, "expected an integer"),
        ("max_period", "4", "expected a number"),
        ("resize_imgs_with_padding", "32x32", "expected [height, width]"),
    ],
)
def test_a_config_value_of_the_wrong_type_names_the_file_and_key(tmp_path, name, key, value, expected):
    folder = _copy(tmp_path, name, **{key: value})
    message = _one_line(folder)
    assert message.startswith(f"{folder / 'config.json'}: '{key}' is {json.dumps(value)}") and expected in message


def test_a_feature_without_a_shape_list_names_the_feature(tmp_path):
    folder = _copy(tmp_path, output_features={"action": {"type": "ACTION", "shape": "7"}})
    assert "'output_features.action.shape' is \"7\"" in _one_line(folder)


@pytest.mark.parametrize("content, kind", [("[1, 2, 3]", "list"), ('"smolvla"', "string")])
def test_a_config_json_that_is_not_an_object_is_one_line(tmp_path, content, kind):
    folder = _copy(tmp_path)
    (folder / "config.json").write_text(content)
    assert _one_line(folder) == f"{folder / 'config.json'}: holds a JSON {kind}, expected a JSON object ({{...}})"


def test_a_type_that_disagrees_with_the_weights_says_so(tmp_path):
    smolvla_as_pi0 = _copy(tmp_path, type="pi0")
    message = _one_line(smolvla_as_pi0)
    assert message.startswith(f'{smolvla_as_pi0 / "config.json"} says "type": "pi0" but ')
    assert "holds a SmolVLA policy's weights" in message and "the type and the weights disagree" in message
    assert 'set "type" to "smolvla"' in message
    pi0_as_smolvla = _copy(tmp_path, "pi0_tiny", type="smolvla")
    message = _one_line(pi0_as_smolvla)
    assert "holds a π0 / π0.5 policy's weights" in message and 'set "type" to "pi0" or "pi05"' in message


@pytest.fixture
def no_hub(monkeypatch):
    """The hub is reachable as far as the environment says (no HF_HUB_OFFLINE), and any from_pretrained call fails
    the test: a missing local folder must be refused before one."""
    import transformers

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    calls = []

    def refuse(name, *a, **kw):
        calls.append(name)
        raise AssertionError(f"from_pretrained({name!r}) was called")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    return calls


def test_a_missing_vlm_folder_names_real_keys_and_asks_no_hub(tmp_path, no_hub):
    folder = _copy(tmp_path, vlm_model_name="vlm")  # the tiny builder's layout, without its vlm/ folder
    shutil.rmtree(folder / "vlm")
    message = _one_line(folder)
    assert no_hub == []
    assert message.startswith(f"{folder / 'config.json'}: vlm_model_name 'vlm' names a VLM folder that is not")
    assert str(folder / "vlm") in message and "set vlm_model_name to a folder or hub id" in message
    assert "vlm_path" not in message


def test_a_null_vlm_model_name_is_one_line_not_a_download_of_none(tmp_path, no_hub):
    folder = _copy(tmp_path, vlm_model_name=None)
    message = _one_line(folder)
    assert no_hub == [] and "'None'" not in message
    assert message.startswith(f"{folder / 'config.json'}: vlm_model_name is null; set it to the VLM's folder")
