"""The processor-driven VLM policy on a non-Qwen model: a tiny SmolVLM built offline (mmrl/policies/vlm_family.py).

Checks the family layer's choices, that rollout log-probs equal recomputed training log-probs (shared-prefix and
plain forwards, ratio 1) and against an independent unpadded HF forward, that the vision tower is frozen / trained
as configured, and that `task=vqa_grounding model=tiny_smolvlm` trains (GRPO steps change the parameters)."""

import math

import pytest
import torch
from PIL import Image

pytest.importorskip("transformers")
pytest.importorskip("num2words")  # SmolVLMProcessor refuses to build without it

from mmrl.models.configs import LoraConfig, VLMConfig  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import load_vlm  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402
from mmrl.policies.vlm import VLMInputError, VLMPolicy, vision_modules  # noqa: E402
from mmrl.policies.vlm_family import SmolVLMFamily, VLMFamily, family_for  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def folder() -> str:
    return resolve_vlm("tiny_smolvlm")


def make_policy(folder: str, **cfg_kw) -> VLMPolicy:
    lm, proc = load_vlm(folder)
    return VLMPolicy(lm, proc, VLMConfig(path=folder, **{"max_new_tokens": 10, **cfg_kw}))


def picture(w: int, h: int, color=(200, 30, 30)) -> Image.Image:
    img = Image.new("RGB", (w, h), (240, 240, 240))
    img.paste(Image.new("RGB", (max(1, w // 3), max(1, h // 3)), color), (w // 4, h // 5))
    return img


def batch() -> PromptBatch:
    items = [
        {"image": picture(120, 64), "prompt": "Find the red box."},
        {"images": [picture(50, 90, (20, 180, 40)), picture(64, 64)], "prompt": "Where is the green object?"},
        {"image": picture(128, 128, (20, 40, 200)), "prompt": "Locate the blue square", "system": "Be precise."},
    ]
    return PromptBatch(items=items, indices=[0, 1, 2], seeds=[11, 22, 33])


def gap(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max().detach())


def test_family_layer_is_chosen_from_the_model_type(folder):
    policy = make_policy(folder)
    assert isinstance(policy.family_layer, SmolVLMFamily) and policy.family == "smolvlm"
    assert policy.box_frame == "norm1000" and policy.patch_size is None
    vocab = policy.tokenizer.get_vocab()
    assert sorted(policy.suppress_ids) == sorted(
        vocab[t] for t in ("<image>", "<fake_token_around_image>", "<global-img>")
    )
    assert policy.tokenizer.eos_token == "<end_of_utterance>" and policy.tokenizer.eos_token_id in policy.eos_ids
    assert type(family_for({"model_type": "qwen3_vl"})).__name__ == "QwenVLFamily"
    other = family_for({"model_type": "llava"})
    assert type(other) is VLMFamily and other.name == "llava"


def test_rollout_log_probs_equal_training_log_probs(folder):
    policy = make_policy(folder)
    ro = policy.rollout(batch(), 3)
    assert ro.batch_size == 9 and len({s["text"] for s in ro.samples}) > 1
    s = ro.samples[0]
    assert s["family"] == "smolvlm" and s["box_frame"] == "norm1000" and s["orig_size"] == (120, 64)
    assert s["input_size"] == (64, 64) and ro.samples[3]["orig_sizes"] == [(50, 90), (64, 64)]
    prompts = ro.payload["prompts"]
    assert prompts[0].visual_tokens == 16 and prompts[3].visual_tokens == 32 and prompts[3].pixel_values.shape[1] == 2
    assert not any(set(c.tolist()) & set(policy.suppress_ids) for c in ro.payload["completion_ids"])
    shared = policy.log_probs(ro)
    assert policy.shared_prefix.enabled and policy.shared_prefix.shared_calls >= 1
    assert gap(shared.logp, ro.rollout_logp, ro.mask) < TOL
    ratio = ((shared.logp - ro.rollout_logp) * ro.mask).exp()
    assert float((ratio - 1).abs().max()) < TOL
    policy.shared_prefix.enabled = False
    plain = policy.log_probs(ro)
    assert gap(plain.logp, ro.rollout_logp, ro.mask) < TOL


def test_log_probs_match_an_independent_unpadded_forward(folder):
    """Sample by sample, the processor's pixels through the plain HF forward (no padding, no cached features)."""
    policy = make_policy(folder)
    ro = policy.rollout(batch(), 2)
    lm = policy.module.lm
    for i in (0, 2, 4):
        p, c = ro.payload["prompts"][i], ro.payload["completion_ids"][i]
        ids = torch.cat([p.input_ids, c])[None]
        with torch.no_grad():
            logits = lm(input_ids=ids, pixel_values=p.pixel_values, **p.pixel_extras).logits[
                0, p.input_ids.numel() - 1 : -1
            ]
        logits[:, policy.suppress_ids] = float("-inf")
        ref = logits.log_softmax(-1).gather(-1, c[:, None])[:, 0]
        assert float((ref - ro.rollout_logp[i, : c.numel()]).abs().max()) < 1e-4


def test_vision_tower_frozen_or_trained_as_configured(folder):
    policy = make_policy(folder)
    tower = {id(p) for m in vision_modules(policy.module.lm) for p in m.parameters()}
    assert tower and not policy.vision_trainable
    assert tower.isdisjoint(id(p) for p in policy.trainable_parameters())
    trained = make_policy(folder, freeze_vision_tower=False, shared_prefix=False)
    ro = trained.rollout(batch(), 2)
    assert ro.payload["prompts"][0].features is None  # recomputed in training, never cached
    out = trained.log_probs(ro)
    (out.logp * ro.mask).sum().backward()
    connector = trained.module.lm.model.connector
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in connector.parameters())
    lora = make_policy(folder, lora=LoraConfig(enabled=True, r=4))
    names = [n for n, p in lora.module.named_parameters() if p.requires_grad]
    assert names and not any("vision_model" in n or "connector" in n for n in names)


def test_generic_layer_refuses_what_it_does_not_support(folder):
    policy = make_policy(folder)
    with pytest.raises(VLMInputError, match="video items are not supported for model family 'smolvlm'"):
        policy.preprocess([{"video": "clip.mp4", "prompt": "what happens?"}])
    with pytest.raises(ValueError, match="Qwen-VL pixel budgets"):
        make_policy(folder, max_pixels=4096)


def test_vqa_grounding_grpo_steps_change_parameters(tmp_path):
    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    cfg = load_config(
        [
            "task=vqa_grounding",
            "model=tiny_smolvlm",
            f"trainer.output_dir={tmp_path}",
            "trainer.run_name=r",
            "task.num_train=8",
            "task.num_eval=4",
            "trainer.warm_start.steps=2",
            "trainer.warm_start.batch_size=2",
            "trainer.batch_size=2",
            "algo.group_size=4",
            "model.max_new_tokens=12",
            "trainer.max_steps=3",
            "trainer.eval.every=0",
            "trainer.eval.at_end=true",
            "trainer.logging.progress=false",
            "trainer.logging.tensorboard=false",
            "trainer.logging.plot=false",
        ]
    )
    tr = Trainer(cfg)
    assert tr.task.answer_frame == "norm1000" == tr.policy.box_frame and tr.policy.family == "smolvlm"
    before = [p.detach().clone() for p in tr.policy.trainable_parameters()]
    final = tr.fit()
    changed = sum(not torch.equal(b, p) for b, p in zip(before, tr.policy.trainable_parameters()))
    assert changed > len(before) // 2
    assert math.isfinite(final["loss/policy"]) and final["rollout/logp_abs_diff"] < TOL
    assert final["eval/n"] == 4.0 and 0.0 <= final["eval/mean_iou"] <= 1.0
