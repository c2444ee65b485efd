"""Shared-prefix forward (mmrl.policies.shared_prefix): each prompt encoded once per group.

The reference everywhere is the plain forward (one row of left-padded prompt + right-padded completion per
sample), which the other test files check against generation and against independent HF forwards. The shared
forward must give the same log-probs (within 1e-5, fp32), entropies, values and gradients (within 1e-4 relative)
for the tiny Qwen2-VL / Qwen2.5-VL / Qwen3-VL (images of different sizes, a text-only prompt, left padding), video
prompts, the text LM and the VLA policy; with LoRA on and off, gradient checkpointing, groups of uneven size whose
rows are interleaved (what micro-batching and DAPO filtering leave); and training with it on and off must end at
the same parameters.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from PIL import Image  # noqa: E402

from mmrl.adapters.vla.config import VLAConfig  # noqa: E402
from mmrl.models.configs import CausalLMConfig, LoraConfig, VLMConfig  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import load_vlm  # noqa: E402
from mmrl.policies import shared_prefix as sp  # noqa: E402
from mmrl.policies.base import Rollout  # noqa: E402
from mmrl.policies.vlm import VLMPolicy, encode_images  # noqa: E402

FAMILIES = ["tiny_qwen2_vl", "tiny_qwen2_5_vl", "tiny_qwen3_vl"]
LOGP_TOL = 1e-5
GRAD_RTOL = 1e-4


# ============================================================================ pure index maths


def test_group_rows_and_right_padded_lengths():
    assert sp.group_rows(["a", "b", "a", "c", "b", "a"]) == [[0, 2, 5], [1, 4], [3]]
    assert sp.group_rows([]) == []
    m = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    assert sp.right_padded_lengths(m) == [2, 4, 0]
    assert sp.right_padded_lengths(torch.tensor([[1.0, 0.0, 1.0]])) is None  # a hole: not droppable padding
    assert sp.right_padded_lengths(torch.tensor([[0.5, 0.0]])) is None  # a weight, not a 0/1 mask
    assert sp.check_rows([[3], [0, 1, 4, 5], [2]]) == [0, 1, 3, 4]
    with pytest.raises(ValueError, match="no group has two rows"):
        sp.check_rows([[0], [1]])


def _hand_layout():
    # samples 0, 2, 3 share prompt A (3 tokens); samples 1, 4 share prompt B (5 tokens); lengths 3, 1, 4, 2, 2
    return sp.plan_layout([[0, 2, 3], [1, 4]], [3, 5], [3, 1, 4, 2, 2])


def test_layout_rows_segments_and_positions_by_hand():
    lay = _hand_layout()
    assert (lay.prefix_end, lay.width, lay.num_rows) == (5, 5 + 2 + 3 + 1, 2)
    assert lay.row == (0, 1, 0, 0, 1) and lay.start == (5, 5, 7, 10, 5)
    assert lay.tokens == 3 + 5 + (2 + 0 + 3 + 1 + 1)
    A, B = torch.tensor([11, 12, 13]), torch.tensor([21, 22, 23, 24, 25])
    comp = torch.tensor([[31, 32, 33, 0], [41, 0, 0, 0], [51, 52, 53, 54], [61, 62, 0, 0], [71, 72, 0, 0]])
    ids = sp.pack_rows(lay, [A, B], comp, pad_value=-9)
    assert ids.tolist() == [
        [-9, -9, 11, 12, 13, 31, 32, 51, 52, 53, 61],  # the last trained token of each completion is not an input
        [21, 22, 23, 24, 25, 71, -9, -9, -9, -9, -9],  # sample 1 (one token) feeds nothing
    ]
    assert sp.segment_ids(lay).tolist() == [
        [-1, -1, 0, 0, 0, 1, 1, 2, 2, 2, 3],
        [0, 0, 0, 0, 0, 2, -1, -1, -1, -1, -1],
    ]
    assert sp.pack_rows(lay, [A, B], None, pad_value=0).tolist()[0] == [0, 0, 11, 12, 13, 0, 0, 0, 0, 0, 0]
    pre, nxt = sp.text_prefix_positions(lay)
    assert pre.tolist() == [[[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]] and nxt.tolist() == [[3, 5]]
    pos = sp.pack_positions(lay, pre, nxt)
    assert pos[0].tolist() == [[0, 0, 0, 1, 2, 3, 4, 3, 4, 5, 3], [0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0]]
    # 3-D (multimodal rotary) prompt positions: every component of a completion continues from its own next value
    pre3 = torch.stack([pre[0], pre[0] * 10, pre[0] * 100])
    pos3 = sp.pack_positions(lay, pre3, torch.tensor([[3, 5], [30, 50], [300, 500]]))
    assert pos3[:, 0, 7:10].tolist() == [[3, 4, 5], [30, 31, 32], [300, 301, 302]]
    with pytest.raises(ValueError, match="do not hold each"):
        sp.plan_layout([[0, 1], [1]], [2, 2], [1, 1])
    with pytest.raises(ValueError, match="has 4 entries"):
        sp.pack_rows(lay, [torch.arange(4), B], comp, 0)


def test_mask_matches_its_definition_entry_by_entry():
    lay = _hand_layout()
    seg = sp.segment_ids(lay)
    dense = sp.shared_prefix_mask(seg)
    assert dense.shape == (2, 1, lay.width, lay.width) and dense.dtype == torch.bool
    owner = {}  # (row, column) -> sample whose completion token sits there
    for i in range(lay.num_samples):
        for c in range(lay.start[i], lay.start[i] + lay.fed(i)):
            owner[(lay.row[i], c)] = i
    for r in range(lay.num_rows):
        prompt = set(range(lay.prefix_end - lay.prefix_lens[r], lay.prefix_end))
        for q in range(lay.width):
            for k in range(lay.width):
                if q == k:
                    want = True  # every token sees itself: no fully masked softmax row
                elif k > q:
                    want = False
                elif k in prompt:
                    want = True  # everything after the prompt sees it (padding too: its outputs are never read)
                else:
                    want = (r, k) in owner and owner.get((r, q)) == owner[(r, k)]  # only its own completion
                assert bool(dense[r, 0, q, k]) == want, (r, q, k)


def test_model_attention_mask_in_each_implementations_format():
    from transformers import Qwen2Config

    seg = sp.segment_ids(_hand_layout())
    dense = sp.shared_prefix_mask(seg)
    cfg = Qwen2Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1)
    cfg._attn_implementation = "sdpa"
    assert torch.equal(sp.model_attention_mask(cfg, seg, torch.float32), dense)
    cfg._attn_implementation = "eager"
    additive = sp.model_attention_mask(cfg, seg, torch.float32)
    assert additive.dtype == torch.float32 and torch.equal(additive == 0, dense)
    assert float(additive.min()) == torch.finfo(torch.float32).min
    cfg._attn_implementation = "flash_attention_2"
    assert "takes no custom mask" in sp.unsupported_reason(cfg)
    with pytest.raises(ValueError, match="takes no custom mask"):
        sp.model_attention_mask(cfg, seg, torch.float32)
    cfg._attn_implementation = "sdpa"
    cfg.layer_types = ["sliding_attention"]
    assert "sliding-window" in sp.unsupported_reason(cfg)


def test_prediction_index_and_unpack():
    lay = _hand_layout()
    rows, cols, valid = sp.prediction_index(lay, 4)
    assert valid.tolist() == [
        [True] * 3 + [False],
        [True] + [False] * 3,
        [True] * 4,
        [True] * 2 + [False] * 2,
        [True] * 2 + [False] * 2,
    ]
    # token 0 is predicted at the prompt's last column (4), token j at the column of token j - 1; untrained positions
    # point at the prompt's last column as well
    assert cols.tolist() == [[4, 5, 6, 4], [4, 4, 4, 4], [4, 7, 8, 9], [4, 10, 4, 4], [4, 5, 4, 4]]
    assert rows[:, 0].tolist() == [0, 1, 0, 0, 1]
    x = torch.arange(2 * 11, dtype=torch.float32).reshape(2, 11, 1) + 1
    out = sp.unpack(x[:, 4:], (rows, cols, valid), first_col=4)
    assert out[..., 0].tolist() == [[5, 6, 7, 5], [16, 16, 16, 16], [5, 8, 9, 10], [5, 11, 5, 5], [16, 17, 16, 16]]
    with pytest.raises(ValueError, match="outside"):
        sp.unpack(x[:, 5:], (rows, cols, valid), first_col=5)


def test_guard_records_a_failed_check(caplog):
    g = sp.SharedPrefixGuard(True)
    assert g.needs_check and g.metrics() == {"shared_prefix/enabled": 1.0, "shared_prefix/fallbacks": 0.0}
    assert g.record_check(1e-7, 1e-4) and g.enabled and not g.needs_check
    g = sp.SharedPrefixGuard(True)
    with caplog.at_level(logging.WARNING, logger="mmrl.policies.shared_prefix"):
        assert not g.record_check(float("nan"), 1e-4, what="X")
    assert "falling back" in caplog.text and not g.enabled and g.metrics()["shared_prefix/fallbacks"] == 1.0
    assert not sp.SharedPrefixGuard(False).needs_check


# ============================================================================ policies: shared == plain


def completion_vocab(tokenizer, exclude=()) -> torch.Tensor:
    """Ordinary token ids (no special, added or excluded ids): what a completion may hold."""
    banned = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values()) | set(exclude)
    return torch.tensor([i for i in range(tokenizer.vocab_size) if i not in banned])


# rows of 4 prompts: groups of uneven size (3, 1, 2, 2), rows interleaved as micro-batching leaves them
ROW_PROMPTS = [0, 1, 0, 2, 3, 0, 2, 3]
LENGTHS = [5, 1, 7, 3, 7, 2, 6, 4]
T = 7


def synthetic_rollout(prompts: list, vocab: torch.Tensor, *, key: str, seed: int = 0) -> Rollout:
    """A rollout of ``prompts[ROW_PROMPTS[k]]`` + a random completion of ``LENGTHS[k]`` tokens per row (no generation
    needed: every forward treats the completion as given)."""
    g = torch.Generator().manual_seed(seed)
    comps = [vocab[torch.randint(len(vocab), (n,), generator=g)] for n in LENGTHS]
    mask = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).float()
    n = len(ROW_PROMPTS)
    return Rollout(
        rollout_logp=torch.zeros(n, T),
        mask=mask,
        group_id=torch.tensor(ROW_PROMPTS),
        prompt_index=torch.tensor(ROW_PROMPTS),
        samples=[{}] * n,
        payload={key: [prompts[i] for i in ROW_PROMPTS], "completion_ids": comps},
    )


def perturb_zero_inits(policy) -> None:
    """LoRA B and the value head start at 0 (their partners then get no gradient): give them random values."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in policy.module.named_parameters():
            if "lora_B" in name or name.startswith("value_head"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def shared_vs_plain(policy, ro: Rollout, *, values: bool = False) -> dict:
    """Log-probs, entropies, values and gradients of a weighted loss, shared-prefix and plain; asserts they agree and
    that the shared forward really ran (after a passed self-check)."""
    mask = ro.mask
    w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(3)) + 0.5
    guard = policy.shared_prefix
    res = {}
    for shared in (True, False):
        guard.enabled = shared
        calls = guard.shared_calls
        policy.module.zero_grad(set_to_none=True)
        out = policy.log_probs(ro, entropy=True, values=values)
        loss = (out.logp * w * mask).sum() + 0.1 * (out.entropy * w * mask).sum()
        if values:
            loss = loss + (out.values * w * mask).sum()
        loss.backward()
        assert guard.shared_calls == calls + int(shared)
        grads = {n: p.grad.detach().clone() for n, p in policy.module.named_parameters() if p.grad is not None}
        res[shared] = (out, grads)
    guard.enabled = True
    assert guard.checked and guard.fallbacks == 0 and guard.check_gap < 1e-5
    (a, ga), (b, gb) = res[True], res[False]
    m = mask.bool()
    assert float((a.logp - b.logp).detach()[m].abs().max()) < LOGP_TOL
    assert float((a.entropy - b.entropy).detach()[m].abs().max()) < 1e-4 * float(b.entropy[m].abs().max())
    if values:
        assert float((a.values - b.values).detach()[m].abs().max()) < LOGP_TOL
    assert ga.keys() == gb.keys() and ga
    for name, g in gb.items():
        scale = float(g.norm())
        assert float((ga[name] - g).norm()) <= GRAD_RTOL * scale + 1e-12, name
    return res


def image(w: int, h: int, color=(200, 30, 30)) -> Image.Image:
    img = Image.new("RGB", (w, h), (240, 240, 240))
    img.paste(Image.new("RGB", (max(1, w // 3), max(1, h // 3)), color), (w // 4, h // 5))
    return img


IMAGE_ITEMS = [
    {"image": image(120, 64), "prompt": "Find the red box."},
    {"image": image(50, 170, (20, 180, 40)), "prompt": "Where is the green object? Answer with one box please."},
    {"prompt": "Say something short."},  # text only, in a batch with images
    {"images": [image(230, 150, (20, 40, 200)), image(60, 60)], "prompt": "Which one?", "system": "Be precise."},
]


def vlm_policy(family: str, **cfg_kw) -> VLMPolicy:
    value_head = cfg_kw.pop("value_head", False)
    lm, proc = load_vlm(resolve_vlm(family))
    policy = VLMPolicy(lm, proc, VLMConfig(**cfg_kw), value_head=value_head)
    perturb_zero_inits(policy)
    return policy


def vlm_rollout(policy: VLMPolicy, items: list[dict]) -> Rollout:
    prompts = policy.preprocess(items)
    vocab = completion_vocab(policy.tokenizer, policy.suppress_ids)
    return synthetic_rollout(prompts, vocab, key="prompts")


def assert_positions_are_the_models_own(policy: VLMPolicy, ro: Rollout) -> None:
    """The rotary positions the shared forward gives each sample's prompt and completion tokens equal those the
    model's own ``get_rope_index`` gives that sample alone, unpadded (1-D positions for a text-only prompt)."""
    from mmrl.policies.token_policy import is_peft

    lm = policy.module.lm
    base = lm.get_base_model() if is_peft(lm) else lm
    seen = []
    hook = base.model.language_model.register_forward_pre_hook(
        lambda mod, args, kw: seen.append(kw["position_ids"]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            policy.log_probs(ro)
    finally:
        hook.remove()
    assert policy.shared_prefix.enabled and len(seen) == 1
    pos = seen[0] if seen[0].dim() == 3 else seen[0][None].expand(3, -1, -1)
    prompts, comps = ro.payload["prompts"], ro.payload["completion_ids"]
    groups = sp.group_rows([id(p) for p in prompts])
    lay = sp.plan_layout(groups, [prompts[g[0]].input_ids.numel() for g in groups], sp.right_padded_lengths(ro.mask))
    assert pos.shape[1:] == (lay.num_rows, lay.width)
    for i, (p, c) in enumerate(zip(prompts, comps)):
        ids = torch.cat([p.input_ids, c])[None]
        if p.num_images or p.num_videos:
            kw = {
                k: getattr(p, k)
                for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
                if getattr(p, k) is not None
            }
            ref, _ = base.model.get_rope_index(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                mm_token_type_ids=torch.cat([p.mm_token_type_ids, 0 * c])[None],
                **kw,
            )
            ref = ref[:, 0]
        else:
            ref = torch.arange(ids.shape[1])[None].expand(3, -1)
        P, n, r = p.input_ids.numel(), lay.fed(i), lay.row[i]
        got = torch.cat([pos[:, r, lay.prefix_end - P : lay.prefix_end], pos[:, r, lay.start[i] : lay.start[i] + n]], 1)
        assert torch.equal(got.cpu(), ref[:, : P + n]), f"sample {i}"


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("family", FAMILIES)
def test_vlm_shared_equals_plain(family, lora):
    policy = vlm_policy(family, lora=LoraConfig(enabled=lora, r=4, alpha=8))
    ro = vlm_rollout(policy, IMAGE_ITEMS)
    prompts = ro.payload["prompts"]
    assert (
        len({p.input_ids.numel() for p in prompts}) == 4
        and len({int(p.image_grid_thw.prod()) for p in prompts if p.num_images}) == 3
    )
    shared_vs_plain(policy, ro)
    assert_positions_are_the_models_own(policy, ro)


def test_vlm_value_head_gradient_checkpointing_and_micro_batches():
    policy = vlm_policy(
        "tiny_qwen2_5_vl", gradient_checkpointing=True, value_head=True, lora=LoraConfig(enabled=True, r=4, alpha=8)
    )
    assert policy.module.lm.get_base_model().model.language_model.gradient_checkpointing
    ro = vlm_rollout(policy, IMAGE_ITEMS)
    res = shared_vs_plain(policy, ro, values=True)
    # micro-batches holding parts of groups give the values of the whole batch
    plain = res[False][0].logp.detach()
    with torch.no_grad():
        for idx in ([0, 1, 2], [3, 4, 5, 6, 7], [7, 5]):
            sub = policy.log_probs(ro.index(torch.tensor(idx)))
            assert float((sub.logp - plain[idx]).abs()[ro.mask[idx].bool()].max()) < LOGP_TOL


def test_vlm_trainable_vision_tower_gets_the_same_gradients():
    policy = vlm_policy("tiny_qwen2_vl", freeze_vision_tower=False)
    ro = vlm_rollout(policy, IMAGE_ITEMS)
    res = shared_vs_plain(policy, ro)
    assert any(n.startswith("lm.model.visual") for n in res[True][1])


@pytest.mark.parametrize("family", ["tiny_qwen2_5_vl", "tiny_qwen3_vl"])
def test_video_prompts_shared_equals_plain(family, tmp_path):
    pytest.importorskip("decord")
    pytest.importorskip("cv2")
    from mmrl.adapters.video.synthetic import make_video_dataset

    land = make_video_dataset(tmp_path / "land", 1, 3, "temporal", duration_s=4.0, fps=4)
    port = make_video_dataset(tmp_path / "port", 1, 4, "temporal", duration_s=4.0, fps=4, size=(128, 128))
    sampling = {"fps": 2.0, "max_frames": 8, "max_pixels_per_frame": 6272, "decode_timeout_s": None, "cache_dir": ""}
    items = [
        {"video": land[0]["video"], "prompt": "When does the circle appear?", "video_sampling": sampling},
        {
            "video": port[0]["video"],
            "prompt": "When does the shape appear? Answer in seconds.",
            "video_sampling": sampling,
        },
        {"image": image(90, 40), "prompt": "Describe the box"},
        {
            "video": land[0]["video"],
            "prompt": "When?",
            "system": "Be brief.",
            "video_sampling": {**sampling, "max_pixels_per_frame": 12544},
        },
    ]
    policy = vlm_policy(family)
    ro = vlm_rollout(policy, items)
    assert sum(p.num_videos for p in policy.preprocess(items)) == 3
    if family == "tiny_qwen2_5_vl":  # the time scale of the rotary index reaches the shared forward too
        assert all(p.second_per_grid_ts is not None for p in ro.payload["prompts"] if p.num_videos)
    shared_vs_plain(policy, ro)
    assert_positions_are_the_models_own(policy, ro)


# ----------------------------------------------------------------------------- text LM


@pytest.fixture(scope="module")
def tiny_lm_folder() -> str:
    from mmrl.models.tiny_lm import build_tiny_causal_lm

    return str(build_tiny_causal_lm("0123456789+-=? abcdefghij", hidden=32, layers=2, heads=4, seed=0))


def lm_policy(folder: str, **cfg_kw):
    from mmrl.policies.causal_lm import CausalLMPolicy, load_causal_lm

    value_head = cfg_kw.pop("value_head", False)
    lm, tok = load_causal_lm(folder)
    policy = CausalLMPolicy(lm, tok, CausalLMConfig(**cfg_kw), value_head=value_head)
    perturb_zero_inits(policy)
    return policy


def lm_rollout(policy) -> Rollout:
    prompts = policy.encode_prompts(["12+7=?", "3-1=", "abc def ghij 1234=", "9?"])
    return synthetic_rollout(prompts, completion_vocab(policy.tokenizer), key="prompt_ids")


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_text_lm_shared_equals_plain(tiny_lm_folder, lora):
    policy = lm_policy(tiny_lm_folder, value_head=True, lora=LoraConfig(enabled=lora, r=4, alpha=8))
    ro = lm_rollout(policy)
    # prompts are keyed by their token ids: a prompt tokenised again still shares
    ro.payload["prompt_ids"][2] = ro.payload["prompt_ids"][2].clone()
    shared_vs_plain(policy, ro, values=True)


def test_text_lm_gradient_checkpointing(tiny_lm_folder):
    policy = lm_policy(tiny_lm_folder, gradient_checkpointing=True)
    policy.module.train()
    assert policy.module.lm.model.gradient_checkpointing
    shared_vs_plain(policy, lm_rollout(policy))


def test_failed_self_check_falls_back_with_a_warning_and_a_counter(tiny_lm_folder, monkeypatch, caplog):
    policy = lm_policy(tiny_lm_folder)
    ro = lm_rollout(policy)
    with torch.no_grad():
        policy.shared_prefix.enabled = False
        plain = policy.log_probs(ro).logp
        policy.shared_prefix.enabled = True
    real = sp.pack_positions
    monkeypatch.setattr(sp, "pack_positions", lambda lay, pre, nxt: real(lay, pre, nxt + 3))  # a positions bug
    with caplog.at_level(logging.WARNING, logger="mmrl.policies.shared_prefix"), torch.no_grad():
        out = policy.log_probs(ro).logp
    assert "falling back to the plain forward" in caplog.text
    assert torch.equal(out, plain)  # this call already returns the plain forward's values
    m = policy.shared_prefix.metrics()
    assert m["shared_prefix/fallbacks"] == 1.0 and m["shared_prefix/enabled"] == 0.0
    assert m["shared_prefix/check_gap"] > 10 * sp.check_tolerance(torch.float32)
    with torch.no_grad():
        policy.log_probs(ro)
    assert policy.shared_prefix.shared_calls == 0 and policy.shared_prefix.fallbacks == 1  # checked once only


def test_first_rollout_runs_the_check_on_every_process(tiny_lm_folder, monkeypatch):
    from mmrl.policies.base import PromptBatch

    batch = PromptBatch(items=[{"prompt": "12+7="}, {"prompt": "3-1="}], indices=[0, 1], seeds=[5, 6])
    policy = lm_policy(tiny_lm_folder, max_new_tokens=5)
    ro = policy.rollout(batch, 3)
    g = policy.shared_prefix
    assert g.checked and g.enabled and g.fallbacks == 0 and g.check_gap < sp.check_tolerance(torch.float32)
    assert ro.metrics["shared_prefix/enabled"] == 1.0 and ro.metrics["shared_prefix/fallbacks"] == 0.0
    # several processes: a log-prob pass alone never checks (one process running extra forwards of a DDP / FSDP model
    # would wait forever for the others); every process checks at its first rollout and they agree on the result
    reduced = []
    monkeypatch.setattr(sp, "is_distributed", lambda: True)
    monkeypatch.setattr(sp, "global_max", lambda x, device: reduced.append(x) or x)
    policy = lm_policy(tiny_lm_folder, max_new_tokens=5)
    with torch.no_grad():
        policy.log_probs(ro)
    assert not policy.shared_prefix.checked and reduced == []
    policy.rollout(batch, 3)
    assert policy.shared_prefix.checked and len(reduced) == 1 and reduced[0] < sp.check_tolerance(torch.float32)


def test_config_flag_off_never_shares(tiny_lm_folder):
    policy = lm_policy(tiny_lm_folder, shared_prefix=False)
    ro = lm_rollout(policy)
    with torch.no_grad():
        policy.log_probs(ro)
    g = policy.shared_prefix
    assert not g.enabled and not g.checked and g.shared_calls == 0
    assert CausalLMConfig().shared_prefix and VLMConfig().shared_prefix and VLAConfig().shared_prefix


# ----------------------------------------------------------------------------- VLA


@pytest.mark.parametrize("frozen", [True, False], ids=["features", "pixels"])
def test_vla_shared_equals_plain(frozen):
    from mmrl.adapters.vla.policy import VLAEnvSpec, VLAPolicy, first_identical_rows

    lm, proc = load_vlm(resolve_vlm("tiny_qwen2_5_vl"))
    spec = VLAEnvSpec(env_name="testing/counter", env_kwargs={}, max_steps=4, action_dim=2)
    policy = VLAPolicy(
        lm,
        proc,
        VLAConfig(chunk=1, num_workers=1, freeze_vision_tower=frozen),
        {"low": [-1.0, -1.0], "high": [1.0, 1.0]},
        spec,
    )
    perturb_zero_inits(policy)
    rng = np.random.default_rng(0)
    start = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
    steps = [3, 2, 3, 1, 2]  # 5 episodes of 2 groups (3 + 2): each starts from its group's first frame
    group = [0, 0, 0, 1, 1]
    instr = ["push the block", "push the block", "push the block", "lift it", "lift it"]
    frames = [
        torch.from_numpy(
            np.stack([start[g]] + [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(n - 1)])
        )
        for g, n in zip(group, steps)
    ]
    tpc = policy.tokens_per_call
    bins = [torch.from_numpy(rng.integers(0, 256, (n, tpc))) for n in steps]
    feats = [None] * len(steps)
    if frozen:  # as a rollout keeps them: one vision forward over the observed frames, identical frames identical
        flat = torch.cat(frames).numpy()
        same = first_identical_rows(flat, [s for s, n in zip(instr, steps) for _ in range(n)])
        assert len(set(same)) == len(same) - 3
        enc = encode_images(policy.module.lm, policy.observation_prompts(flat, ["x"] * len(flat)), policy.device)
        per_row = [enc[r] for r in same]
        k = 0
        feats = []
        for n in steps:
            feats.append(per_row[k : k + n])
            k += n
    mask = (torch.arange(max(steps) * tpc)[None] < torch.tensor(steps)[:, None] * tpc).float()
    ro = Rollout(
        rollout_logp=torch.zeros_like(mask),
        mask=mask,
        group_id=torch.tensor(group),
        samples=[{}] * 5,
        payload={"frames": frames, "bins": bins, "instruction": instr, "features": feats},
    )
    res = shared_vs_plain(policy, ro)
    if not frozen:
        assert any(".visual." in n for n in res[True][1])


# ============================================================================ training on and off


def _char_reward(prompts, completions, **_):
    return [(sum(map(ord, c["text"])) % 5) / 4 for c in completions]


def test_training_with_and_without_sharing_ends_at_the_same_parameters(tmp_path):
    from mmrl.config import load_config
    from mmrl.rewards.manager import RewardManager, RewardSpec
    from mmrl.trainer import Trainer

    params = {}
    for on in (True, False):
        cfg = load_config(
            [
                "task=vqa_grounding",
                f"trainer.output_dir={tmp_path}",
                f"trainer.run_name=r{int(on)}",
                "task.num_train=16",
                "task.num_eval=2",
                "trainer.warm_start.steps=0",
                "trainer.batch_size=2",
                "algo.group_size=4",
                "model.max_new_tokens=6",
                "trainer.max_steps=5",
                "trainer.grad_accum=3",
                "trainer.optim.lr=0.001",
                "algo.kl_coef=0.05",
                "algo.entropy_coef=0.01",
                "algo.ppo_epochs=2",
                "trainer.eval.every=0",
                "trainer.eval.at_end=false",
                "trainer.logging.progress=false",
                "trainer.logging.tensorboard=false",
                "trainer.logging.plot=false",
                f"model.shared_prefix={str(on).lower()}",
            ]
        )
        tr = Trainer(cfg)
        # the random-init model never earns the IoU / format rewards: a reward that varies within every group gives
        # the policy loss non-zero advantages
        tr.rewards = RewardManager(
            tr.task.reward_specs() + [RewardSpec("chars", _char_reward, 1.0)],
            error_threshold=1.0,
            window=tr.cfg.trainer.limits.reward_error_window,
        )
        before = [p.detach().clone() for p in tr.policy.trainable_parameters()]
        final = tr.fit()
        g = tr.policy.shared_prefix
        assert g.enabled == on and g.fallbacks == 0 and (g.shared_calls > 0) == on
        after = [p.detach().clone() for p in tr.policy.trainable_parameters()]
        moved = max(float((a - b).abs().max()) for a, b in zip(after, before))
        assert moved > 1e-3  # the 5 steps did train
        assert final["shared_prefix/enabled"] == float(on) and final["policy/adv_abs_mean"] > 0.1
        params[on] = after
    gap = max(float((a - b).abs().max()) for a, b in zip(params[True], params[False]))
    assert gap < 1e-4


# ============================================================================ sampling: prefill once per group


def test_text_lm_prefills_each_prompt_once_with_the_same_samples(tiny_lm_folder):
    """generate with the prompt's KV cache computed once per group and repeated to its G rows samples the same tokens
    with the same behaviour log-probs as prefilling every copy, and the prefill runs on one row per prompt."""
    from mmrl.policies.token_policy import left_pad
    from mmrl.rollout import token_sampler as ts

    pol = lm_policy(tiny_lm_folder)
    lm = pol.module.lm.eval()
    G = 4
    prompts = pol.encode_prompts(["12+7=?", "3-1=", "abc def ghij 1234="])
    ids, att = left_pad([p for p in prompts for _ in range(G)], pol.pad_id)
    kw = dict(
        seeds=list(range(len(prompts) * G)), max_new_tokens=6, eos_ids=pol.eos_ids, pad_id=pol.pad_id, temperature=1.0
    )
    plain = ts.generate_completions(lm, {"input_ids": ids, "attention_mask": att}, **kw)
    rows = []
    hook = lm.register_forward_pre_hook(lambda m, a, k: rows.append(k["input_ids"].shape), with_kwargs=True)
    try:
        shared = ts.generate_completions(lm, {"input_ids": ids, "attention_mask": att}, prefill_group=G, **kw)
    finally:
        hook.remove()
    assert torch.equal(plain.ids, shared.ids) and torch.equal(plain.mask, shared.mask)
    torch.testing.assert_close(shared.logp, plain.logp, atol=1e-6, rtol=0)
    assert rows[0] == (3, ids.shape[1] - 1)  # the prefill: one row per prompt, all but its last token
    assert rows[1] == (3 * G, 1)  # then generate starts at the last prompt token of every sample
    # rows of a group that differ: no shared cache
    assert ts.shared_prefill_cache(lm, ids.flip(0), att.flip(0), G + 1) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_vlm_rollout_prefills_each_prompt_once_with_the_same_samples(family):
    """VLMPolicy.rollout with sharing on prefills each distinct prompt (its images) once and repeats its KV cache and
    rotary offsets to its G samples: the same tokens and behaviour log-probs as the plain path (images of different
    sizes, a text-only prompt, left padding), with the vision tower run once per distinct prompt either way."""
    from mmrl.policies.base import PromptBatch

    items = [
        {"image": image(120, 64), "prompt": "Find the red box."},
        {"image": image(50, 170, (20, 180, 40)), "prompt": "Where is the green object? Answer with one box."},
        {"prompt": "Say something short."},
    ]
    out = {}
    for on in (False, True):
        policy = vlm_policy(family, max_new_tokens=6, temperature=1.0, shared_prefix=on)
        lm = policy.module.lm
        rows = []
        hook = lm.register_forward_pre_hook(lambda m, a, k: rows.append(tuple(k["input_ids"].shape)), with_kwargs=True)
        try:
            ro = policy.rollout(PromptBatch(items=items, indices=[0, 1, 2], seeds=[5, 6, 7]), 4)
        finally:
            hook.remove()
        out[on] = (ro, rows)
    (plain, plain_rows), (shared, shared_rows) = out[False], out[True]
    assert [c.tolist() for c in plain.payload["completion_ids"]] == [
        c.tolist() for c in shared.payload["completion_ids"]
    ]
    torch.testing.assert_close(shared.rollout_logp, plain.rollout_logp, atol=1e-5, rtol=0)
    width = plain_rows[0][1]
    assert plain_rows[0] == (12, width)  # the plain prefill: every copy
    assert shared_rows[0] == (3, width - 1) and shared_rows[1] == (12, 1)  # once per prompt, then the last token
