"""mmrl's SmolVLA against LeRobot 0.6.1 on the same tiny checkpoint (fixture written by scripts/lerobot_fixtures.py).

The fixture folder is what LeRobot's ``save_pretrained`` writes (config.json, model.safetensors, processor files with
the normalisation statistics) plus ``reference.safetensors``: fixed raw inputs, a fixed initial noise, LeRobot's
action chunk and its flow-matching loss on fixed (actions, noise, time).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file, save_file  # noqa: E402

from mmrl.adapters.vla.lerobot import LeRobotCheckpointError  # noqa: E402
from mmrl.adapters.vla.lerobot.checkpoint import load_smolvla, save_smolvla  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot"
FIXTURE = FIXTURES / "smolvla_tiny"
VARIANTS = ("smolvla_tiny", "smolvla_tiny_skip")  # see VARIANTS in scripts/lerobot_fixtures.py
CAMERAS = ("observation.images.image", "observation.images.image2")
ACTION_TOL = 1e-4
LOSS_TOL = 1e-5


def _reference(folder: Path) -> dict:
    ref = load_file(str(folder / "reference.safetensors"))
    meta = json.loads((folder / "reference.json").read_text())
    ref["tasks"], ref["cameras"] = meta["tasks"], meta["cameras"]
    return ref


@pytest.fixture(scope="module")
def reference() -> dict:
    return _reference(FIXTURE)


@pytest.fixture(scope="module")
def pipeline():
    return load_smolvla(FIXTURE)


@pytest.fixture(scope="module", params=VARIANTS)
def case(request):
    """(pipeline, reference) of each committed fixture."""
    return load_smolvla(FIXTURES / request.param), _reference(FIXTURES / request.param)


def _images(ref) -> dict:
    return {key: ref[key] for key in ref["cameras"]}


def _predict(pipe, ref, **kwargs):
    return pipe.predict_action_chunk(_images(ref), ref["observation.state"], ref["tasks"], ref["noise"], **kwargs)


def _loss(pipe, ref, **kwargs):
    with torch.no_grad():
        return _train_loss(pipe, ref, **kwargs)


def _train_loss(pipe, ref, **kwargs):
    images, state, tasks = _images(ref), ref["observation.state"], ref["tasks"]
    return pipe.flow_loss(images, state, tasks, ref["train_actions"], ref["train_noise"], ref["train_time"], **kwargs)


# ---------------------------------------------------------------------------------------------- parity


def test_preprocessing_matches_lerobot(case):
    pipeline, reference = case
    obs = pipeline.prepare(_images(reference), reference["observation.state"], reference["tasks"])
    assert torch.equal(obs.lang_tokens, reference["lang_tokens"])
    assert torch.equal(obs.lang_mask, reference["lang_mask"].bool())
    state_dim = reference["state_normalized"].shape[-1]
    assert (obs.state[:, :state_dim] - reference["state_normalized"]).abs().max() < 1e-6
    assert torch.all(obs.state[:, state_dim:] == 0)  # zero-padded to max_state_dim
    actions = pipeline.normalizer.normalize("action", reference["train_actions"])
    assert (actions - reference["train_actions_normalized"]).abs().max() < 1e-6


def test_action_chunk_matches_lerobot(case):
    pipeline, reference = case
    model_space = _predict(pipeline, reference, unnormalize=False)
    actions = _predict(pipeline, reference)
    assert actions.shape == reference["action_chunk"].shape
    assert (model_space - reference["action_chunk_normalized"]).abs().max().item() < ACTION_TOL
    assert (actions - reference["action_chunk"]).abs().max().item() < ACTION_TOL


def test_flow_loss_matches_lerobot(case):
    pipeline, reference = case
    assert abs(_loss(pipeline, reference).item() - reference["loss"].item()) < LOSS_TOL
    per_sample = _loss(pipeline, reference, reduction="none")
    assert (per_sample - reference["loss_per_sample"]).abs().max().item() < LOSS_TOL


def test_noise_changes_actions_and_cache_expands(case):
    """The fixture is sensitive to its inputs, and a prefix cache shared by group members gives their actions."""
    pipeline, reference = case
    other = _predict(pipeline, {**reference, "noise": reference["noise"].flip(0)})
    assert (other - reference["action_chunk"]).abs().max() > 1e-2
    obs = pipeline.prepare(_images(reference), reference["observation.state"], reference["tasks"])
    cache = pipeline.encode(obs).expand(2)
    noise = reference["noise"].repeat_interleave(2, dim=0)
    with torch.no_grad():
        grouped = pipeline.model.sample_actions(cache, noise)[:, :, : pipeline.spec.action_dim]
    expected = reference["action_chunk_normalized"].repeat_interleave(2, dim=0)
    assert (grouped - expected).abs().max().item() < ACTION_TOL


def test_loss_backpropagates_to_the_expert(pipeline, reference):
    pipeline.zero_grad()
    loss = _train_loss(pipeline, reference)
    loss.backward()
    grads = [p.grad for name, p in pipeline.model.named_parameters() if name.startswith("expert_layers.")]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert pipeline.model.state_proj.weight.grad.abs().sum() > 0
    pipeline.zero_grad()


def test_flow_chain_drives_the_expert(pipeline, reference):
    """mmrl's RL flow head (flow_chain) runs SmolVLA through FlowExpertView: ODE = LeRobot's sampler, SDE log-probs
    recompute, and its flow-matching loss is LeRobot's on the real action dims."""
    from mmrl.adapters.vla import flow_chain
    from mmrl.adapters.vla.lerobot.smolvla import FlowExpertView

    expert = FlowExpertView(pipeline.model)
    obs = pipeline.prepare(_images(reference), reference["observation.state"], reference["tasks"])
    dim_mask = torch.arange(pipeline.config.max_action_dim) < pipeline.spec.action_dim
    with torch.no_grad():
        cache = pipeline.encode(obs)
        ode = flow_chain.sample_chunk(expert, cache, reference["noise"], mode="ode")
        assert (ode.actions[:, :, : pipeline.spec.action_dim] - reference["action_chunk_normalized"]).abs().max() < 1e-4
        group, noise = cache.expand(2), reference["noise"].repeat_interleave(2, 0)
        gen = torch.Generator().manual_seed(0)
        sde = flow_chain.sample_chunk(expert, group, noise, mode="flow_sde", generator=gen, dim_mask=dim_mask)
        kw = {"mode": "flow_sde", "exec_mask": None, "dim_mask": dim_mask, "noise_level": sde.noise_level}
        again = flow_chain.chunk_log_prob(expert, group, sde.chain, sde.stochastic, **kw)
        assert torch.isfinite(sde.log_prob).all() and (again - sde.log_prob).abs().max() < 1e-4
        actions = pipeline.normalizer.normalize("action", reference["train_actions"])
        actions = torch.nn.functional.pad(actions, (0, pipeline.config.max_action_dim - actions.shape[-1]))
        loss = flow_chain.flow_matching_loss(
            expert, cache, actions, dim_mask, noise=reference["train_noise"], time=reference["train_time"]
        )
    assert abs(loss.item() - reference["loss"].item()) < LOSS_TOL


# ---------------------------------------------------------------------------------------------- save


def test_save_writes_lerobot_layout_and_reloads(pipeline, reference, tmp_path):
    out = save_smolvla(pipeline, tmp_path / "saved")
    original = {p.name for p in FIXTURE.iterdir() if p.is_file() and not p.name.startswith("reference")}
    assert original <= {p.name for p in out.iterdir()}
    assert set(load_file(str(out / "model.safetensors"))) == set(load_file(str(FIXTURE / "model.safetensors")))
    reloaded = load_smolvla(out, vlm_path=FIXTURE / "vlm")
    assert (_predict(reloaded, reference) - reference["action_chunk"]).abs().max().item() < ACTION_TOL


def test_trained_step_round_trips_through_the_saved_folder(reference, tmp_path):
    """After one training step the saved folder reloads to the same actions (LeRobot's side: the fixture script)."""
    from mmrl.adapters.vla.lerobot.roundtrip import train_step_and_save

    summary = train_step_and_save(FIXTURE, tmp_path / "trained")
    assert summary["action_change"] > 1e-3  # the step changed the policy
    mmrl_outputs = load_file(str(tmp_path / "trained" / "mmrl_outputs.safetensors"))
    reloaded = load_smolvla(tmp_path / "trained")
    assert (_predict(reloaded, reference) - mmrl_outputs["action_chunk"]).abs().max().item() < 1e-6


def test_tiny_smolvla_builds_trains_and_round_trips(tmp_path):
    from mmrl.adapters.vla.lerobot.checkpoint import UNUSED_TENSORS
    from mmrl.adapters.vla.lerobot.tiny import build_tiny_smolvla

    pipe = build_tiny_smolvla(chunk_size=4, num_steps=3, stats={"action": {"mean": [0.5] * 7, "std": [2.0] * 7}})
    gen = torch.Generator().manual_seed(0)
    frames = {key: torch.randint(0, 256, (2, 96, 128, 3), dtype=torch.uint8, generator=gen) for key in CAMERAS}
    state, noise = torch.randn(2, 8, generator=gen), torch.randn(2, 4, 32, generator=gen)
    actions = pipe.predict_action_chunk(frames, state, "put the bowl on the plate", noise)
    assert actions.shape == (2, 4, 7) and torch.isfinite(actions).all()
    loss = pipe.flow_loss(frames, state, ["a", "b"], torch.randn(2, 4, 7, generator=gen))
    loss.backward()
    assert torch.isfinite(loss) and pipe.model.action_out_proj.weight.grad.abs().sum() > 0
    out = save_smolvla(pipe, tmp_path / "tiny")
    assert set(UNUSED_TENSORS) <= set(load_file(str(out / "model.safetensors")))
    assert (out / "vlm" / "tokenizer.json").is_file() and (out / "vlm" / "config.json").is_file()
    reloaded = load_smolvla(out)
    again = reloaded.predict_action_chunk(frames, state, "put the bowl on the plate", noise)
    assert (again - actions).abs().max().item() < 1e-6


# ---------------------------------------------------------------------------------------------- errors


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, dst)
    return dst


def _one_line_error(folder: Path, *needles: str) -> str:
    with pytest.raises(LeRobotCheckpointError) as info:
        load_smolvla(folder, vlm_path=FIXTURE / "vlm")
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_not_a_policy_folder(tmp_path):
    _one_line_error(tmp_path / "nowhere", "does not exist")
    (tmp_path / "empty").mkdir()
    _one_line_error(tmp_path / "empty", "config.json")


def test_wrong_policy_type(tmp_path):
    folder = _copy(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "type": "pi0"}))
    _one_line_error(folder, "'pi0'", "smolvla")


def test_missing_and_extra_tensors(tmp_path):
    folder = _copy(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    name = "model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, str(folder / "model.safetensors"))
    _one_line_error(folder, name, "missing")
    save_file({**tensors, "model.extra_head.weight": torch.zeros(2)}, str(folder / "model.safetensors"))
    _one_line_error(folder, "model.extra_head.weight")
    wrong = dict(tensors)
    wrong[name] = torch.zeros(3, 3)
    save_file(wrong, str(folder / "model.safetensors"))
    _one_line_error(folder, name, "shape")


def test_missing_state_feature_and_statistics(tmp_path):
    folder = _copy(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    inputs = {k: v for k, v in cfg["input_features"].items() if k != "observation.state"}
    (folder / "config.json").write_text(json.dumps({**cfg, "input_features": inputs}))
    _one_line_error(folder, "'observation.state'")

    folder = _copy(tmp_path / "b")
    stats_file = folder / "policy_preprocessor_step_5_normalizer_processor.safetensors"
    stats = load_file(str(stats_file))
    save_file({k: v for k, v in stats.items() if not k.startswith("observation.state.")}, str(stats_file))
    _one_line_error(folder, "observation.state", "std")


def test_unmappable_inputs_are_one_line(pipeline, reference):
    images = _images(reference)
    state, tasks = reference["observation.state"], reference["tasks"]
    with pytest.raises(LeRobotCheckpointError, match="'observation.images.wrist'") as info:
        pipeline.predict_action_chunk({**images, "observation.images.wrist": images[CAMERAS[1]]}, state, tasks)
    assert "\n" not in str(info.value)
    with pytest.raises(LeRobotCheckpointError, match="'observation.images.image2' is missing"):
        pipeline.predict_action_chunk({CAMERAS[0]: images[CAMERAS[0]]}, state, tasks)
    with pytest.raises(LeRobotCheckpointError, match="observation.state"):
        pipeline.predict_action_chunk(images, state[:, :5], tasks)


def test_careless_inputs_are_one_line(pipeline, reference):
    images, state, tasks = _images(reference), reference["observation.state"], reference["tasks"]
    cases = [
        ({**images, CAMERAS[0]: images[CAMERAS[0]][:, :1]}, state, tasks, None, "3, H, W"),  # grey frames
        ({**images, CAMERAS[0]: images[CAMERAS[0]][:1]}, state, tasks, None, "3, H, W"),  # batch mismatch
        (images, state, tasks[:1], None, "task strings"),
        (images, state, tasks, reference["noise"][:, :, :7], "noise"),
    ]
    for frames, st, tk, noise, needle in cases:
        with pytest.raises(LeRobotCheckpointError, match=needle) as info:
            pipeline.predict_action_chunk(frames, st, tk, noise)
        assert "\n" not in str(info.value)
    with pytest.raises(LeRobotCheckpointError, match="actions must be"):
        pipeline.flow_loss(images, state, tasks, reference["train_actions"][:, :, :3])


def test_damaged_files_are_one_line(tmp_path):
    folder = _copy(tmp_path)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    _one_line_error(folder, "model.safetensors", "cannot be read")
    folder = _copy(tmp_path / "b")
    (folder / "policy_preprocessor.json").write_text("{ not json")
    _one_line_error(folder, "policy_preprocessor.json", "not valid JSON")
    folder = _copy(tmp_path / "c")
    (folder / "policy_postprocessor_step_0_unnormalizer_processor.safetensors").unlink()
    _one_line_error(folder, "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
