"""mmrl's π0 and π0.5 against LeRobot 0.6.1 on the same tiny checkpoints (fixtures by scripts/lerobot_fixtures.py).

``tests/fixtures/lerobot/pi0_tiny`` (``pi05_tiny``) is what LeRobot's ``save_pretrained`` writes for a tiny ``pi0``
(``pi05``) policy (config.json, model.safetensors, processor files with the normalisation statistics, a tiny
tokenizer folder) plus ``reference.safetensors``: fixed raw inputs, a fixed initial noise, LeRobot's pre-processed
tensors, its action chunk and its flow-matching loss on fixed (actions, noise, time).
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
from mmrl.adapters.vla.lerobot.checkpoint import load_pi0, load_policy  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lerobot"
FIXTURE = FIXTURES / "pi0_tiny"
VARIANTS = ("pi0_tiny", "pi05_tiny")  # see VARIANTS in scripts/lerobot_fixtures.py
ACTION_TOL = 1e-4
LOSS_TOL = 1e-5
EXPERT_K = "model.paligemma_with_expert.gemma_expert.model.layers.1.self_attn.k_proj.weight"
EMBED = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
LM_HEAD = "model.paligemma_with_expert.paligemma.lm_head.weight"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    return load_pi0(FIXTURE)


@pytest.fixture(scope="module")
def pi05():
    return load_pi0(FIXTURES / "pi05_tiny"), _reference(FIXTURES / "pi05_tiny")


@pytest.fixture(scope="module", params=VARIANTS)
def case(request, pipeline, reference, pi05):
    """(pipeline, reference) of each committed fixture."""
    return (pipeline, reference) if request.param == "pi0_tiny" else pi05


def _images(ref) -> dict:
    return {key: ref[key] for key in ref["cameras"]}


def _predict(pipe, ref, **kwargs):
    return pipe.predict_action_chunk(_images(ref), ref["observation.state"], ref["tasks"], ref["noise"], **kwargs)


def _train_loss(pipe, ref, **kwargs):
    images, state, tasks = _images(ref), ref["observation.state"], ref["tasks"]
    return pipe.flow_loss(images, state, tasks, ref["train_actions"], ref["train_noise"], ref["train_time"], **kwargs)


# ---------------------------------------------------------------------------------------------- parity


def test_sizes_are_read_from_the_tensors(pipeline):
    """LeRobot's config.json says gemma_2b / gemma_300m; the fixture's real sizes come from the tensor shapes."""
    cfg = pipeline.config
    assert pipeline.lerobot_config["paligemma_variant"] == "gemma_2b"
    assert (cfg.width, cfg.depth, cfg.intermediate, cfg.vocab_size) == (64, 3, 128, 260)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (8, 1, 8)
    assert (cfg.expert_width, cfg.expert_intermediate) == (32, 64)
    assert (cfg.max_state_dim, cfg.max_action_dim, cfg.chunk_size, cfg.num_steps) == (16, 12, 6, 10)
    vision = cfg.vision_config
    assert (vision["hidden_size"], vision["num_hidden_layers"], vision["patch_size"], cfg.image_size) == (32, 2, 8, 32)


def test_preprocessing_matches_lerobot(case):
    pipeline, reference = case
    obs = pipeline.prepare(_images(reference), reference["observation.state"], reference["tasks"])
    assert torch.equal(obs.lang_tokens, reference["lang_tokens"])  # <bos>, text + newline, truncated/padded to 48
    assert torch.equal(obs.lang_mask, reference["lang_mask"].bool())
    for camera, image in zip(reference["cameras"], obs.images, strict=True):
        assert image.shape == (2, 3, 32, 32)
        assert (image - reference[f"image_preprocessed.{camera}"]).abs().max().item() < 1e-6  # centred padding
    state_dim = reference["state_normalized"].shape[-1]
    assert (obs.state[:, :state_dim] - reference["state_normalized"]).abs().max() < 1e-6
    assert obs.state.shape[-1] == 16 and torch.all(obs.state[:, state_dim:] == 0)  # π0.5 does not read it
    actions = pipeline.normalizer.normalize("action", reference["train_actions"])
    assert (actions - reference["train_actions_normalized"]).abs().max() < 1e-6


def test_action_chunk_matches_lerobot(case):
    pipeline, reference = case
    model_space = _predict(pipeline, reference, unnormalize=False)
    actions = _predict(pipeline, reference)
    assert actions.shape == reference["action_chunk"].shape == (2, 6, 7)
    assert (model_space - reference["action_chunk_normalized"]).abs().max().item() < ACTION_TOL
    assert (actions - reference["action_chunk"]).abs().max().item() < ACTION_TOL


def test_flow_loss_matches_lerobot(case):
    pipeline, reference = case
    with torch.no_grad():
        loss = _train_loss(pipeline, reference)
        per_sample = _train_loss(pipeline, reference, reduction="none")
    assert abs(loss.item() - reference["loss"].item()) < LOSS_TOL
    assert (per_sample - reference["loss_per_sample"]).abs().max().item() < LOSS_TOL


def test_prefix_is_encoded_once_and_shared(case):
    """One PaliGemma pass per observation, K expert passes; a cache expanded to a group gives each member's actions."""
    pipeline, reference = case
    calls = {"vlm": 0, "expert": 0}
    hooks = [
        pipeline.model.vlm_layers[0].input_layernorm.register_forward_hook(
            lambda *_: calls.__setitem__("vlm", calls["vlm"] + 1)
        ),
        pipeline.model.expert_layers[0].input_layernorm.register_forward_hook(
            lambda *_: calls.__setitem__("expert", calls["expert"] + 1)
        ),
    ]
    try:
        _predict(pipeline, reference)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == {"vlm": 1, "expert": pipeline.config.num_steps}

    other = _predict(pipeline, {**reference, "noise": reference["noise"].flip(0)})
    assert (other - reference["action_chunk"]).abs().max() > 1e-2  # the noise matters
    obs = pipeline.prepare(_images(reference), reference["observation.state"], reference["tasks"])
    with torch.no_grad():
        cache = pipeline.encode(obs).expand(2)
        grouped = pipeline.model.sample_actions(cache, reference["noise"].repeat_interleave(2, dim=0))
    expected = reference["action_chunk_normalized"].repeat_interleave(2, dim=0)
    assert (grouped[:, :, : pipeline.spec.action_dim] - expected).abs().max().item() < ACTION_TOL


def test_state_changes_actions(case):
    """The state reaches the actions (π0: the expert's state token; π0.5: the discretised state in the prompt)."""
    pipeline, reference = case
    moved = pipeline.predict_action_chunk(
        _images(reference), reference["observation.state"] + 1.0, reference["tasks"], reference["noise"]
    )
    assert (moved - reference["action_chunk"]).abs().max() > 1e-2


def test_loss_backpropagates_to_the_expert(pipeline, reference):
    pipeline.zero_grad()
    loss = _train_loss(pipeline, reference)
    loss.backward()
    model = pipeline.model
    grads = {name: p.grad for name, p in model.named_parameters() if name.startswith("expert_layers.")}
    assert grads and all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads.values())
    for module in (model.action_in_proj, model.action_out_proj, model.state_proj, model.action_time_mlp_in):
        assert module.weight.grad.abs().sum() > 0
    assert model.vlm_layers[0].self_attn.k_proj.weight.grad.abs().sum() > 0  # through the shared attention
    pipeline.zero_grad()


def test_pi05_prompt_holds_the_discretised_state(pi05):
    """π0.5's prompt: the normalised state in 256 bins over [-1, 1] (below -1: -1), no state token in the expert."""
    from mmrl.adapters.vla.lerobot.pi05 import PI05Model
    from mmrl.adapters.vla.lerobot.processing import state_prompts

    pipeline, reference = pi05
    assert isinstance(pipeline.model, PI05Model) and not hasattr(pipeline.model, "state_proj")
    assert state_prompts(["pick_up\n"], torch.tensor([[-1.5, -1.0, 0.0, 0.999, 1.0]])) == [
        "Task: pick up, State: -1 0 128 255 255;\nAction: "
    ]
    text = pipeline.tokenizer.decode(reference["lang_tokens"][0][reference["lang_mask"][0].bool()])
    assert text == "<bos>" + state_prompts(reference["tasks"][:1], reference["state_normalized"][:1])[0]


def test_pi05_loss_backpropagates_through_the_time_conditioning(pi05):
    pipeline, reference = pi05
    pipeline.zero_grad()
    _train_loss(pipeline, reference).backward()
    model = pipeline.model
    for module in (model.time_mlp_in, model.time_mlp_out, model.expert_norm.dense):
        assert module.weight.grad.abs().sum() > 0
    for layer in model.expert_layers:
        assert layer.input_layernorm.dense.weight.grad.abs().sum() > 0
        assert layer.post_attention_layernorm.dense.weight.grad.abs().sum() > 0
    pipeline.zero_grad()


def test_flow_chain_drives_the_expert(case):
    """mmrl's RL flow head (flow_chain) runs π0 / π0.5 through FlowExpertView: its ODE sampler is LeRobot's and its
    flow-matching loss LeRobot's on the real action dims."""
    pipeline, reference = case
    from mmrl.adapters.vla import flow_chain
    from mmrl.adapters.vla.lerobot.smolvla import FlowExpertView

    expert = FlowExpertView(pipeline.model)
    obs = pipeline.prepare(_images(reference), reference["observation.state"], reference["tasks"])
    dim_mask = torch.arange(pipeline.config.max_action_dim) < pipeline.spec.action_dim
    with torch.no_grad():
        cache = pipeline.encode(obs)
        ode = flow_chain.sample_chunk(expert, cache, reference["noise"], mode="ode")
        actions = pipeline.normalizer.normalize("action", reference["train_actions"])
        actions = torch.nn.functional.pad(actions, (0, pipeline.config.max_action_dim - actions.shape[-1]))
        loss = flow_chain.flow_matching_loss(
            expert, cache, actions, dim_mask, noise=reference["train_noise"], time=reference["train_time"]
        )
    diff = (ode.actions[:, :, : pipeline.spec.action_dim] - reference["action_chunk_normalized"]).abs().max()
    assert diff.item() < ACTION_TOL
    assert abs(loss.item() - reference["loss"].item()) < LOSS_TOL


def test_load_policy_dispatches_on_the_type(pipeline):
    from mmrl.adapters.vla.lerobot.pipeline import PI0Pipeline, SmolVLAPipeline

    assert isinstance(pipeline, PI0Pipeline)
    from mmrl.adapters.vla.lerobot.pi05 import PI05Model

    smolvla = load_policy(FIXTURES / "smolvla_tiny")
    assert type(smolvla) is SmolVLAPipeline and type(load_policy(FIXTURE)) is PI0Pipeline
    assert type(load_policy(FIXTURES / "pi05_tiny").model) is PI05Model


def test_hub_layout_loads_like_lerobot(reference, tmp_path):
    """openpi-converted hub checkpoints: no ``model.`` prefix, ``time_mlp_*`` names, only the LM head (which LeRobot
    copies into the token embedding)."""
    folder = _copy(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    hub = {}
    for name, tensor in tensors.items():
        if name == EMBED:
            continue
        value = tensors[EMBED] if name == LM_HEAD else tensor
        hub[name.removeprefix("model.").replace("action_time_mlp_", "time_mlp_")] = value
    assert "time_mlp_in.weight" in hub and "paligemma_with_expert.paligemma.lm_head.weight" in hub
    save_file(hub, str(folder / "model.safetensors"))
    pipe = load_pi0(folder)
    assert (_predict(pipe, reference) - reference["action_chunk"]).abs().max().item() < ACTION_TOL


def test_pi05_hub_layout_loads_like_lerobot(pi05, tmp_path):
    """π0.5 hub names: ``action_time_mlp_*`` for its time MLP and a stray ``state_proj`` (LeRobot renames / drops them)."""
    _, reference = pi05
    folder = tmp_path / "pi05"
    shutil.copytree(FIXTURES / "pi05_tiny", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    hub = {name.removeprefix("model.").replace("time_mlp_", "action_time_mlp_"): t for name, t in tensors.items()}
    hub["state_proj.weight"] = torch.zeros(32, 16)
    assert "action_time_mlp_in.weight" in hub
    save_file(hub, str(folder / "model.safetensors"))
    pipe = load_pi0(folder)
    assert (_predict(pipe, reference) - reference["action_chunk"]).abs().max().item() < ACTION_TOL


def test_save_writes_lerobot_layout_and_reloads(case, tmp_path, monkeypatch):
    """``save_policy`` writes LeRobot's file and tensor names (LeRobot itself reloads such a folder: the fixture
    script's ``--roundtrip``); the local tokenizer travels with it, so the folder reloads from anywhere."""
    from mmrl.adapters.vla.lerobot.checkpoint import save_policy

    pipeline, reference = case
    source = Path(pipeline.source_folder)
    out = save_policy(pipeline, tmp_path / "saved")
    original = {p.name for p in source.iterdir() if not p.name.startswith("reference")}
    assert original == {p.name for p in out.iterdir()}  # config, weights, processors, tokenizer/
    assert set(load_file(str(out / "model.safetensors"))) == set(load_file(str(source / "model.safetensors")))
    monkeypatch.chdir(tmp_path)  # the pre-processor's relative tokenizer path no longer resolves from here
    reloaded = load_policy(out)
    assert (_predict(reloaded, reference) - reference["action_chunk"]).abs().max().item() < ACTION_TOL


# ---------------------------------------------------------------------------------------------- errors


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, dst)
    return dst


def _one_line_error(loader, folder: Path, *needles: str) -> str:
    with pytest.raises(LeRobotCheckpointError) as info:
        loader(folder)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def _edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))


def test_unknown_policy_type_is_one_line(tmp_path):
    folder = tmp_path / "act_policy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"type": "act", "chunk_size": 100}))
    _one_line_error(load_policy, folder, "'act'", "not supported", "smolvla, pi0, pi05")
    _one_line_error(load_pi0, folder, "'act'", "not 'pi0'")
    _one_line_error(load_policy, tmp_path / "nowhere", "does not exist")
    (tmp_path / "empty").mkdir()
    _one_line_error(load_policy, tmp_path / "empty", "config.json")


def test_smolvla_folder_is_not_pi0(tmp_path):
    _one_line_error(load_pi0, FIXTURES / "smolvla_tiny", "'smolvla'", "not 'pi0'")


def test_missing_and_extra_tensors(tmp_path):
    folder = _copy(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k != EXPERT_K}, str(folder / "model.safetensors"))
    _one_line_error(load_pi0, folder, EXPERT_K, "missing")
    save_file({**tensors, "model.extra_head.weight": torch.zeros(2)}, str(folder / "model.safetensors"))
    _one_line_error(load_pi0, folder, "model.extra_head.weight", "π0")
    wrong = {**tensors, EXPERT_K: torch.zeros(16, 32)}
    save_file(wrong, str(folder / "model.safetensors"))
    _one_line_error(load_pi0, folder, EXPERT_K, "shape")


def test_inconsistent_sizes_are_one_line(tmp_path):
    folder = _copy(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    prefix = "model.paligemma_with_expert.gemma_expert.model.layers.2."
    save_file({k: v for k, v in tensors.items() if not k.startswith(prefix)}, str(folder / "model.safetensors"))
    _one_line_error(load_pi0, folder, "3 PaliGemma layers and 2 action-expert layers")

    folder = _copy(tmp_path / "b")
    _edit_config(folder, image_resolution=[224, 224])
    _one_line_error(load_pi0, folder, "image_resolution", "224")

    folder = _copy(tmp_path / "c")
    _edit_config(folder, max_state_dim=32)
    _one_line_error(load_pi0, folder, "max_state_dim=32", "16")


def test_unsupported_options_are_one_line(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, use_relative_actions=True)
    _one_line_error(load_pi0, folder, "use_relative_actions")

    folder = _copy(tmp_path / "b")
    pre = json.loads((folder / "policy_preprocessor.json").read_text())
    for step in pre["steps"]:
        if step["registry_name"] == "relative_actions_processor":
            step["config"]["enabled"] = True
    (folder / "policy_preprocessor.json").write_text(json.dumps(pre))
    _one_line_error(load_pi0, folder, "relative_actions_processor", "enabled")

    folder = _copy(tmp_path / "c")
    shutil.rmtree(folder / "tokenizer")
    pre = json.loads((folder / "policy_preprocessor.json").read_text())
    for step in pre["steps"]:
        if step["registry_name"] == "tokenizer_processor":
            step["config"]["tokenizer_name"] = str(tmp_path / "no_such_tokenizer")
    (folder / "policy_preprocessor.json").write_text(json.dumps(pre))
    _one_line_error(load_pi0, folder, "tokenizer", "no_such_tokenizer")


def test_unmappable_inputs_are_one_line(pipeline, reference):
    images, state, tasks = _images(reference), reference["observation.state"], reference["tasks"]
    cases = [
        ({**images, "observation.images.wrist": images[reference["cameras"][1]]}, state, tasks, None, "wrist"),
        ({reference["cameras"][0]: images[reference["cameras"][0]]}, state, tasks, None, "image2' is missing"),
        (images, state[:, :5], tasks, None, "observation.state"),
        (images, state, tasks, reference["noise"][:, :, :7], "noise"),
    ]
    for frames, st, tk, noise, needle in cases:
        with pytest.raises(LeRobotCheckpointError, match=needle) as info:
            pipeline.predict_action_chunk(frames, st, tk, noise)
        assert "\n" not in str(info.value)
