"""VLMPolicy over the tiny offline Qwen2-VL / Qwen2.5-VL / Qwen3-VL models.

The key property: the behaviour log-probs recorded while sampling (KV-cached `generate`, batch of
B*G left-padded prompts) equal the log-probs recomputed by `log_probs` (one forward of prompt +
completion, another padding layout) and those of an independent unpadded HF forward from the
processor's pixel values.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from PIL import Image  # noqa: E402

from mmrl.config import AlgoConfig, LoggingConfig, OptimConfig, RunConfig, TrainerConfig, load_config  # noqa: E402
from mmrl.data.media import MediaError, load_image  # noqa: E402
from mmrl.models.configs import LoraConfig, VLMConfig  # noqa: E402
from mmrl.models.families import smart_resize  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import load_vlm, vision_special_token_ids  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402
from mmrl.policies.vlm import (  # noqa: E402
    PromptTooLongError,
    VLMInputError,
    VLMPolicy,
    build_vlm_policy,
    vision_tower,
)
from mmrl.rewards.manager import RewardSpec  # noqa: E402
from mmrl.tasks.base import Task  # noqa: E402

FAMILIES = ["tiny_qwen2_vl", "tiny_qwen2_5_vl", "tiny_qwen3_vl"]
TOL = 1e-4


@pytest.fixture(scope="module")
def folders() -> dict[str, str]:
    """Tiny model folders (built once into the shared mmrl cache)."""
    return {f: resolve_vlm(f) for f in FAMILIES}


def make_policy(folder: str, **cfg_kw) -> VLMPolicy:
    kw = {"max_new_tokens": 8, **cfg_kw}
    value_head = kw.pop("value_head", False)
    reference = kw.pop("reference", False)
    lm, proc = load_vlm(folder)
    return VLMPolicy(lm, proc, VLMConfig(**kw), value_head=value_head, reference=reference)


def image(w: int, h: int, color=(200, 30, 30)) -> Image.Image:
    img = Image.new("RGB", (w, h), (240, 240, 240))
    img.paste(Image.new("RGB", (max(1, w // 3), max(1, h // 3)), color), (w // 4, h // 5))
    return img


def mixed_batch(seeds=(101, 202, 303)) -> PromptBatch:
    """Non-square images of different sizes (different image-token counts) and prompt lengths."""
    items = [
        {"image": image(120, 64), "prompt": "Find the red box."},
        {"image": image(50, 170, (20, 180, 40)), "prompt": "Where is the green object? Answer with one box please."},
        {"image": image(230, 150, (20, 40, 200)), "prompt": "Locate the blue square", "system": "You are precise."},
    ]
    return PromptBatch(items=items[: len(seeds)], indices=list(range(len(seeds))), seeds=list(seeds))


def max_gap(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


def independent_logp(policy: VLMPolicy, rollout, i: int, *, suppress: bool = True) -> torch.Tensor:
    """Log-probs of sample i from a plain unpadded HF forward with the processor's pixel values, under the sampled
    distribution: tempered logits with the policy's suppressed (vision special) token ids removed."""
    p = rollout.payload["prompts"][i]
    c = rollout.payload["completion_ids"][i]
    ids = torch.cat([p.input_ids, c])[None]
    kw = {}
    if p.num_images:
        kw = dict(
            pixel_values=p.pixel_values,
            image_grid_thw=p.image_grid_thw,
            mm_token_type_ids=torch.cat([p.mm_token_type_ids, torch.zeros_like(c)])[None],
        )
    with torch.no_grad():
        logits = policy.module.lm(input_ids=ids, attention_mask=torch.ones_like(ids), **kw).logits
    L = p.input_ids.numel()
    z = logits[0, L - 1 : L - 1 + c.numel()] / policy.cfg.temperature
    if suppress:
        keep = torch.ones(z.shape[-1], dtype=torch.bool)
        keep[policy.suppress_ids] = False
        lp = z - z[:, keep].logsumexp(-1, keepdim=True)  # renormalised over the allowed ids, by hand
    else:
        lp = z.log_softmax(-1)
    return lp.gather(-1, c[:, None])[:, 0]


@pytest.fixture(scope="module", params=FAMILIES)
def sampled(request, folders):
    """(policy, batch, rollout) with G=2 at temperature 0.7 and top_p 0.95."""
    policy = make_policy(folders[request.param], temperature=0.7, top_p=0.95, max_new_tokens=10)
    batch = mixed_batch()
    return policy, batch, policy.rollout(batch, 2)


# ----------------------------------------------------------------------------- log-prob agreement


def test_behaviour_logp_equals_recomputed(sampled):
    policy, batch, ro = sampled
    prompts = ro.payload["prompts"]
    # the batch really exercises left padding and different numbers of image tokens
    assert len({p.input_ids.numel() for p in prompts}) == 3
    assert len({int(p.image_grid_thw.prod()) for p in prompts}) == 3
    assert ro.rollout_logp.shape == ro.mask.shape == (6, ro.mask.shape[1]) and ro.mask.sum() > 6
    with torch.no_grad():
        out = policy.log_probs(ro, entropy=True)
    assert max_gap(out.logp, ro.rollout_logp, ro.mask) < TOL
    # entropy of a V-way distribution lies in [0, log V]
    V = policy.module.lm.config.get_text_config().vocab_size
    assert float(out.entropy.min()) >= -1e-5 and float(out.entropy.max()) <= math.log(V) + 1e-4
    # another micro-batch layout (reordered, other padding) gives the same values
    idx = torch.tensor([5, 2, 0])
    with torch.no_grad():
        sub = policy.log_probs(ro.index(idx))
    assert max_gap(sub.logp, ro.rollout_logp[idx], ro.mask[idx]) < TOL


def test_recomputed_logp_equals_plain_hf_forward(sampled):
    policy, _, ro = sampled
    with torch.no_grad():
        out = policy.log_probs(ro)
    for i in (0, 3, 5):
        n = int(ro.mask[i].sum())
        ref = independent_logp(policy, ro, i)
        assert ref.numel() == n
        assert float((out.logp[i, :n] - ref).abs().max()) < TOL


def test_sample_fields_and_frames(sampled):
    policy, batch, ro = sampled
    ip = policy.processor.image_processor
    factor = ip.patch_size * ip.merge_size
    family = policy.family
    assert family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
    for i, s in enumerate(ro.samples):
        item = batch.items[i // 2]
        W, H = item["image"].size
        assert s["orig_size"] == (W, H)
        h, w = smart_resize(
            H, W, factor=factor, min_pixels=ip.size["shortest_edge"], max_pixels=ip.size["longest_edge"]
        )
        assert s["input_size"] == (w, h)  # grid x patch size == Qwen's resize rule
        assert s["family"] == family
        assert s["box_frame"] == {"qwen2_vl": "norm1000", "qwen2_5_vl": "input_pixels", "qwen3_vl": "norm1000"}[family]
        assert s["length"] == int(ro.mask[i].sum()) and isinstance(s["text"], str)
        assert s["truncated"] == (
            s["length"] == policy.cfg.max_new_tokens and int(ro.payload["completion_ids"][i][-1]) not in policy.eos_ids
        )
    assert ro.group_id.tolist() == [101, 101, 202, 202, 303, 303]
    assert ro.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    # one PromptInputs per prompt, shared by reference by its G samples
    assert ro.payload["prompts"][0] is ro.payload["prompts"][1] is not ro.payload["prompts"][2]


def test_concat_and_index_keep_payload_consistent(sampled):
    policy, batch, ro = sampled
    both = type(ro).concat([ro.index(torch.tensor([0, 1])), ro.index(torch.tensor([4, 5, 2]))])
    with torch.no_grad():
        out = policy.log_probs(both)
    assert max_gap(out.logp, both.rollout_logp, both.mask) < TOL


# ----------------------------------------------------------------------------- sampling behaviour


@pytest.fixture(scope="module")
def q25(folders):
    return make_policy(folders["tiny_qwen2_5_vl"])


def test_vision_special_tokens_are_never_sampled(folders):
    policy = make_policy(folders["tiny_qwen2_vl"], max_new_tokens=6)
    banned = vision_special_token_ids(policy.processor)
    bias = torch.zeros(policy.module.lm.config.get_text_config().vocab_size)
    bias[banned] = 30.0  # without suppression these tokens would win every step
    hook = policy.module.lm.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        ro = policy.rollout(mixed_batch((1, 2)), 2)
        with torch.no_grad():
            out = policy.log_probs(ro)
        full = [independent_logp(policy, ro, i, suppress=False) for i in range(2)]
        renorm = [independent_logp(policy, ro, i) for i in range(2)]
    finally:
        hook.remove()
    ids = torch.cat(ro.payload["completion_ids"])
    assert ids.numel() > 0 and not torch.isin(ids, torch.tensor(banned)).any()
    # the behaviour and the training log-probs are those of the distribution sampled from (suppressed ids removed,
    # renormalised), not of the full softmax, where the boosted vision tokens take almost all the mass
    m = ro.mask.bool()
    assert float(ro.rollout_logp[m].max()) > -20
    assert max_gap(out.logp, ro.rollout_logp, ro.mask) < TOL
    for i in range(2):
        n = int(ro.mask[i].sum())
        assert float((out.logp[i, :n] - renorm[i]).abs().max()) < TOL
        assert float(full[i].max()) < -20  # what the old unmasked formula gave


def test_greedy_is_deterministic_and_seeds_reproduce(q25):
    b = mixed_batch()
    g1, g2 = q25.rollout(b, 2, greedy=True), q25.rollout(b, 2, greedy=True)
    c1, c2 = g1.payload["completion_ids"], g2.payload["completion_ids"]
    assert all(torch.equal(x, y) for x, y in zip(c1, c2))
    assert torch.equal(c1[0], c1[1])  # greedy: the G samples of a prompt coincide
    s1, s2 = q25.rollout(b, 2), q25.rollout(b, 2)
    assert [s["text"] for s in s1.samples] == [s["text"] for s in s2.samples]
    assert torch.equal(s1.rollout_logp, s2.rollout_logp)
    other = q25.rollout(mixed_batch((7, 8, 9)), 2)
    assert [s["text"] for s in other.samples] != [s["text"] for s in s1.samples]
    # a prompt's samples depend on its seed only, not on the other prompts of the batch
    alone = q25.rollout(PromptBatch(items=[b.items[1]], indices=[1], seeds=[202]), 2)
    assert [s["text"] for s in alone.samples] == [s["text"] for s in s1.samples[2:4]]


def test_text_only_and_mixed_prompts(q25):
    items = [{"prompt": "Say something short."}, {"image": image(90, 40), "prompt": "Describe the box"}]
    ro = q25.rollout(PromptBatch(items=items, indices=[0, 1], seeds=[5, 6]), 2)
    assert ro.samples[0]["orig_size"] is None and ro.samples[2]["orig_size"] == (90, 40)
    with torch.no_grad():
        assert max_gap(q25.log_probs(ro).logp, ro.rollout_logp, ro.mask) < TOL
        text_only = ro.index(torch.tensor([0, 1]))
        assert max_gap(q25.log_probs(text_only).logp, text_only.rollout_logp, text_only.mask) < TOL


def test_multiple_images_per_prompt(q25):
    items = [
        {"images": [image(60, 90), image(100, 50)], "prompt": "Which image has the box?"},
        {"image": image(80, 80), "prompt": "Box?"},
    ]
    ro = q25.rollout(PromptBatch(items=items, indices=[0, 1], seeds=[3, 4]), 2)
    assert ro.samples[0]["orig_sizes"] == [(60, 90), (100, 50)] and len(ro.samples[0]["input_sizes"]) == 2
    with torch.no_grad():
        assert max_gap(q25.log_probs(ro).logp, ro.rollout_logp, ro.mask) < TOL


# ----------------------------------------------------------------------------- training set-up


def test_frozen_vision_tower_and_feature_cache(folders):
    policy = make_policy(folders["tiny_qwen3_vl"])
    vis = {id(p) for p in vision_tower(policy.module.lm).parameters()}
    trainable = policy.trainable_parameters()
    assert trainable and not any(id(p) in vis for p in trainable)
    ro = policy.rollout(mixed_batch((1,)), 2)
    assert ro.payload["prompts"][0].features is not None  # cached: training never reruns the vision tower
    calls = []
    h = vision_tower(policy.module.lm).register_forward_hook(lambda *a: calls.append(1))
    try:
        policy.log_probs(ro).logp.sum().backward()
    finally:
        h.remove()
    assert calls == []


def test_trainable_vision_tower_gets_gradients(folders):
    policy = make_policy(folders["tiny_qwen2_5_vl"], freeze_vision_tower=False)
    vis = list(vision_tower(policy.module.lm).parameters())
    assert all(p.requires_grad for p in vis)
    ro = policy.rollout(mixed_batch((1, 2)), 2)
    assert ro.payload["prompts"][0].features is None
    out = policy.log_probs(ro)
    assert max_gap(out.logp.detach(), ro.rollout_logp, ro.mask) < TOL
    (out.logp * ro.mask).sum().backward()
    grads = [p.grad.clone() for p in vis]
    assert sum(float(g.abs().sum()) for g in grads) > 0
    # inside a data-parallel wrapper the pixels go through the wrapper's forward: same values and gradients
    policy.module.zero_grad(set_to_none=True)
    policy.model = _Wrapper(policy.model)
    out = policy.log_probs(ro)
    assert policy.model.calls == 1 and max_gap(out.logp.detach(), ro.rollout_logp, ro.mask) < TOL
    (out.logp * ro.mask).sum().backward()
    assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(vis, grads))


class _Wrapper(torch.nn.Module):
    """Stands in for DistributedDataParallel: holds the policy module as ``.module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, **kw):
        self.calls += 1
        return self.module(**kw)


def test_lora_outside_vision_and_reference_is_base(folders):
    folder = folders["tiny_qwen2_5_vl"]  # its vision MLP uses gate/up/down_proj: LoRA target names
    base = make_policy(folder)
    policy = make_policy(folder, lora=LoraConfig(enabled=True, r=4, alpha=8))
    tower = dict(vision_tower(policy.module.lm).named_modules())
    assert any(n.endswith("up_proj") for n in tower)
    assert not any(hasattr(m, "lora_A") for m in tower.values())
    lora = [n for n, m in policy.module.lm.named_modules() if hasattr(m, "lora_A")]
    assert len(lora) == 2 * 7  # 2 language-model layers x 7 target projections
    trainable = [n for n, p in policy.module.lm.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ro = base.rollout(mixed_batch((1, 2)), 2)
    with torch.no_grad():
        base_lp = base.log_probs(ro).logp
        for n, p in policy.module.lm.named_parameters():
            if "lora_B" in n:
                p.add_(0.5 * torch.randn_like(p))
        live = policy.log_probs(ro).logp
        with policy.reference():
            ref = policy.log_probs(ro).logp
        after = policy.log_probs(ro).logp
    assert max_gap(live, base_lp, ro.mask) > 1e-3  # the adapters changed the policy
    assert max_gap(ref, base_lp, ro.mask) < 1e-5  # reference() is the base model
    assert torch.equal(after, live)  # adapters are back on after the context


def test_gradient_checkpointing_recomputes_in_backward(folders):
    counts = {}
    for ckpt in (False, True):
        policy = make_policy(folders["tiny_qwen2_vl"], gradient_checkpointing=ckpt, lora=LoraConfig(enabled=True, r=4))
        ro = policy.rollout(mixed_batch((1,)), 2)
        mlp = policy.module.lm.get_base_model().model.language_model.layers[0].mlp  # runs inside the checkpoint
        calls = []
        plain = mlp.forward
        mlp.forward = lambda *a, **k: calls.append(1) or plain(*a, **k)  # (module hooks skip the recompute)
        (policy.log_probs(ro).logp * ro.mask).sum().backward()
        counts[ckpt] = len(calls)
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    assert counts == {False: 1, True: 2}  # the checkpointed layer runs again in backward


def test_frozen_copy_reference(folders):
    policy = make_policy(folders["tiny_qwen2_vl"], reference=True)
    ro = policy.rollout(mixed_batch((1,)), 2)
    with torch.no_grad():
        before = policy.log_probs(ro).logp
        for p in policy.trainable_parameters():
            p.add_(0.01 * torch.randn_like(p))
        with policy.reference():
            ref = policy.log_probs(ro).logp
    assert max_gap(ref, before, ro.mask) < 1e-6
    assert policy.module.lm is not policy._frozen_ref._frozen.lm


@pytest.mark.parametrize("lora", [False, True])
def test_save_load_roundtrip(folders, tmp_path, lora):
    folder = folders["tiny_qwen2_vl"]
    kw = {"lora": LoraConfig(enabled=lora, r=4, alpha=8), "value_head": True}
    policy = make_policy(folder, **kw)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.02 * torch.randn_like(p))
    ro = policy.rollout(mixed_batch((1, 2)), 2)
    with torch.no_grad():
        want = policy.log_probs(ro, values=True)
    policy.save_pretrained(tmp_path / "ckpt")
    fresh = make_policy(folder, **kw)
    with torch.no_grad():
        assert max_gap(fresh.log_probs(ro).logp, want.logp, ro.mask) > 1e-4
        fresh.load_pretrained(tmp_path / "ckpt")
        got = fresh.log_probs(ro, values=True)
    assert torch.equal(got.logp, want.logp) and torch.equal(got.values, want.values)
    if not lora:  # the folder is a regular HF model folder
        lm, _ = load_vlm(tmp_path / "ckpt")
        ref = policy.module.lm.state_dict()
        assert all(torch.equal(v, ref[k]) for k, v in lm.state_dict().items())


def test_load_rejects_mismatched_checkpoint(folders, tmp_path):
    a = make_policy(folders["tiny_qwen2_vl"])
    a.save_pretrained(tmp_path / "a")
    b = make_policy(folders["tiny_qwen3_vl"])
    from mmrl.checkpoint_files import CheckpointMismatchError

    with pytest.raises(CheckpointMismatchError, match="different model/task config: weight .* in the checkpoint"):
        b.load_pretrained(tmp_path / "a")
    with pytest.raises(FileNotFoundError):
        b.load_pretrained(tmp_path / "nothing")


def test_sft_loss_matches_cross_entropy(q25):
    batch = mixed_batch((1, 2))
    targets = ['[{"bbox_2d": [1, 2, 3, 4]}]', "left"]
    loss = q25.sft_loss(batch, targets)
    prompts = q25.preprocess(batch.items)
    eos = q25.tokenizer.eos_token_id
    nll, n = 0.0, 0
    with torch.no_grad():
        for p, t in zip(prompts, targets):
            c = torch.tensor(q25.tokenizer(t, add_special_tokens=False)["input_ids"] + [eos])
            ids = torch.cat([p.input_ids, c])[None]
            mm = torch.cat([p.mm_token_type_ids, torch.zeros_like(c)])[None]
            logits = q25.module.lm(
                input_ids=ids, pixel_values=p.pixel_values, image_grid_thw=p.image_grid_thw, mm_token_type_ids=mm
            ).logits[0]
            L = p.input_ids.numel()
            nll -= float(logits[L - 1 : L - 1 + c.numel()].log_softmax(-1).gather(-1, c[:, None]).sum())
            n += c.numel()
    assert abs(float(loss.detach()) - nll / n) < 1e-4
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in q25.trainable_parameters())
    q25.module.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="targets"):
        q25.sft_loss(batch, ["only one"])


# ----------------------------------------------------------------------------- errors and config


def test_bad_inputs_raise_named_errors(q25, tmp_path):
    with pytest.raises(VLMInputError, match="prompt"):
        q25.preprocess([{"image": image(40, 40)}])
    with pytest.raises(VLMInputError, match="list"):
        q25.preprocess([{"images": image(40, 40), "prompt": "x"}])
    with pytest.raises(MediaError, match="file not found"):
        q25.preprocess([{"image": tmp_path / "missing.png", "prompt": "x"}])
    q25.cfg.max_prompt_tokens = 10
    try:
        with pytest.raises(PromptTooLongError, match="max_prompt_tokens=10"):
            q25.preprocess(mixed_batch((1,)).items)
    finally:
        q25.cfg.max_prompt_tokens = None


def test_image_paths_and_shrunk_images_keep_original_size(q25, tmp_path):
    path = tmp_path / "img.png"
    image(150, 60).save(path)
    shrunk = load_image(path, max_side=75)  # 75 x 30, remembers 150 x 60
    p_path, p_shrunk = q25.preprocess([{"image": path, "prompt": "a"}, {"image": shrunk, "prompt": "a"}])
    assert p_path.orig_sizes == [(150, 60)] and p_shrunk.orig_sizes == [(150, 60)]


def test_pixel_limits_are_applied_once_to_the_processor(folders):
    policy = make_policy(folders["tiny_qwen2_5_vl"], min_pixels=8 * 28 * 28, max_pixels=16 * 28 * 28)
    assert dict(policy.processor.image_processor.size) == {"shortest_edge": 8 * 784, "longest_edge": 16 * 784}
    (p,) = policy.preprocess([{"image": image(400, 300), "prompt": "x"}])
    tokens = int(p.image_grid_thw.prod()) // 4  # merge 2 x 2
    # smart_resize(300, 400, 28, 6272, 12544): 280 x 392 = 109760 > max -> beta = sqrt(120000/12544) = 3.093,
    # floor(300/3.093/28)*28 = 84, floor(400/3.093/28)*28 = 112 -> 3 x 4 = 12 tokens
    assert tokens == 12 and p.input_sizes == [(112, 84)]
    with pytest.raises(ValueError, match="min_pixels"):
        make_policy(folders["tiny_qwen2_5_vl"], min_pixels=5000, max_pixels=4000)
    with pytest.raises(ValueError, match="freeze_vision_tower"):
        make_policy(folders["tiny_qwen2_5_vl"], freeze_vision_tower=False, lora=LoraConfig(enabled=True))


def test_presets_compose_and_build(folders):
    for name in ("qwen2_vl_2b", "qwen2_5_vl_3b", "qwen2_5_vl_7b", "qwen3_vl_4b"):
        m = load_config(["task=vqa_grounding", f"model={name}"]).model
        assert isinstance(m, VLMConfig) and m.path.startswith("Qwen/") and m.dtype == "bfloat16"
        assert m.gradient_checkpointing and m.freeze_vision_tower and m.max_pixels > m.min_pixels
    assert load_config(["task=vqa_grounding", "model=qwen2_5_vl_7b"]).model.lora.enabled
    for name in FAMILIES:
        m = load_config(["task=vqa_grounding", f"model={name}"]).model
        assert (m.type, m.name, m.path) == ("vlm", name, name)
    cfg = load_config(
        [
            "task=vqa_grounding",
            "model=tiny_qwen3_vl",
            "algo.advantage=gae",
            "algo.kl_coef=0.01",
            "trainer.device=cpu",
            "model.max_new_tokens=4",
        ]
    )
    policy = build_vlm_policy(cfg)
    assert policy.family == "qwen3_vl" and policy.module.value_head is not None and policy._frozen_ref is not None
    ro = policy.rollout(mixed_batch((1,)), 2)
    with torch.no_grad():
        assert policy.log_probs(ro, values=True).values.shape == ro.mask.shape


# ----------------------------------------------------------------------------- end to end


class _BoxTask(Task):
    """A minimal task: three images, reward = share of distinct characters (varies within groups)."""

    name = "vlm_test"

    def train_items(self):
        return mixed_batch().items

    def eval_items(self):
        return mixed_batch().items[:1]

    def reward_specs(self):
        def distinct(prompts, completions, **_):
            return [len(set(c["text"])) / 10 for c in completions]

        return [RewardSpec("distinct", distinct)]

    def reward_columns(self, items):
        return {}


def test_trainer_step_updates_parameters(folders, tmp_path):
    from mmrl.trainer import Trainer

    model_cfg = VLMConfig(path=folders["tiny_qwen2_5_vl"], max_new_tokens=6, gradient_checkpointing=True)
    cfg = RunConfig(
        task=type("T", (), {"name": "vlm_test"})(),
        model=model_cfg,
        algo=AlgoConfig(group_size=2, kl_coef=0.02),
        trainer=TrainerConfig(
            batch_size=2,
            optim=OptimConfig(lr=1e-2),
            device="cpu",
            logging=LoggingConfig(progress=False, tensorboard=False, plot=False),
            output_dir=str(tmp_path),
            max_steps=1,
        ),
    )
    policy = build_vlm_policy(cfg, None)
    trainer = Trainer(cfg, task=_BoxTask(cfg.task, cfg), policy=policy)
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    metrics = trainer.train_step()
    assert math.isfinite(metrics["loss/policy"]) and metrics["rollout/logp_abs_diff"] < TOL
    assert "policy/kl" in metrics and math.isfinite(metrics["policy/kl"])
    changed = sum(not torch.equal(b, p) for b, p in zip(before, policy.trainable_parameters()))
    assert changed > len(before) // 2
    assert trainer.evaluate()["eval/n"] == 1.0
