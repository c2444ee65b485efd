"""Video items through VLMPolicy (tiny offline Qwen2-VL / Qwen2.5-VL / Qwen3-VL).

The key property is time consistency: the rotary positions the model uses while sampling (KV-cached
``generate`` on a left-padded batch) are the positions it uses when the trainer recomputes
log-probs, including Qwen2.5-VL's ``second_per_grid_ts`` time scale and Qwen3-VL's timestamps in the
text; and the behaviour log-probs equal the recomputed ones. Also: T-GRPO's shuffled copies keep
whole temporal patches, are batched into the same generate call and are masked out of training;
each video is decoded once per prompt.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("decord")
pytest.importorskip("cv2")

from mmrl.adapters.video.decode import VideoSamplingConfig, load_video  # noqa: E402
from mmrl.adapters.video.frame_cache import frame_cache_for  # noqa: E402
from mmrl.adapters.video.policy_inputs import (  # noqa: E402
    VideoInputError,
    item_clips,
    permute_temporal_patches,
    temporal_patch_permutation,
    video_rollout_metrics,
)
from mmrl.adapters.video.synthetic import make_video_dataset  # noqa: E402
from mmrl.config import TGRPOConfig  # noqa: E402
from mmrl.models.configs import VLMConfig  # noqa: E402
from mmrl.models.presets import resolve_vlm  # noqa: E402
from mmrl.models.tiny_vlm import load_vlm  # noqa: E402
from mmrl.policies.base import PromptBatch  # noqa: E402
from mmrl.policies.vlm import VLMInputError, VLMPolicy  # noqa: E402
from mmrl.rollout.noise import mix_seed  # noqa: E402

FAMILIES = ["tiny_qwen2_vl", "tiny_qwen2_5_vl", "tiny_qwen3_vl"]
TOL = 1e-4
SAMPLING = {"fps": 2.0, "max_frames": 8, "max_pixels_per_frame": 6272, "decode_timeout_s": None, "cache_dir": ""}


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> list[str]:
    """Three 4 s videos at 4 fps: two 128x96 and one 128x128 (another vision-token count)."""
    root = tmp_path_factory.mktemp("videos")
    land = make_video_dataset(root / "land", 2, 3, "temporal", duration_s=4.0, fps=4)
    port = make_video_dataset(root / "port", 1, 4, "temporal", duration_s=4.0, fps=4, size=(128, 128))
    return [r["video"] for r in land + port]


def make_policy(family: str, *, shuffled: int = 0, **kw) -> VLMPolicy:
    lm, proc = load_vlm(resolve_vlm(family))
    cfg = VLMConfig(**{"max_new_tokens": 8, "temperature": 0.8, **kw})
    return VLMPolicy(lm, proc, cfg, tgrpo=TGRPOConfig(shuffled_group=shuffled) if shuffled else None)


def video_batch(videos, sampling=SAMPLING) -> PromptBatch:
    items = [
        {"video": videos[0], "prompt": "When does the circle appear?", "video_sampling": sampling},
        {
            "video": videos[2],
            "prompt": "When does the shape appear in this video? Answer in seconds.",
            "video_sampling": sampling,
        },
        {
            "video": videos[1],
            "prompt": "When?",
            "video_sampling": {**sampling, "max_pixels_per_frame": 12544},
            "system": "Be brief.",
        },
    ]
    return PromptBatch(items=items, indices=[0, 1, 2], seeds=[101, 202, 303])


class PositionRecorder:
    """Records the position ids every language-model forward receives (mrope rows only)."""

    def __init__(self, policy: VLMPolicy) -> None:
        self.calls: list[dict] = []
        lm = policy.module.lm
        self._handle = lm.model.language_model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        pos = kwargs["position_ids"]
        self.calls.append({"pos": pos[-3:].detach().clone(), "mask": kwargs.get("attention_mask")})

    def close(self) -> None:
        self._handle.remove()


def generation_positions(calls: list[dict], prompt_mask: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Per sample [3, n_prompt + n_fed] positions from a generate: prefill positions of the real prompt
    tokens, then one position per completion token fed back (all but the last generated one)."""
    prefill, steps = calls[0]["pos"], [c["pos"][:, :, -1] for c in calls[1:]]
    out = []
    for b, n in enumerate(lengths):
        keep = prompt_mask[b].bool()
        fed = [steps[j][:, b] for j in range(n - 1)]
        out.append(torch.cat([prefill[:, b, keep]] + ([torch.stack(fed, 1)] if fed else []), dim=1))
    return out


def training_positions(
    call: dict, n_prompt_cols: int, prompt_mask: torch.Tensor, lengths: list[int]
) -> list[torch.Tensor]:
    """Per sample positions of the real prompt tokens + the first n-1 completion tokens of a training forward."""
    pos = call["pos"]
    out = []
    for b, n in enumerate(lengths):
        keep = prompt_mask[b].bool()
        prompt_part = pos[:, b, :n_prompt_cols][:, keep]
        out.append(torch.cat([prompt_part, pos[:, b, n_prompt_cols : n_prompt_cols + n - 1]], dim=1))
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def sampled(request, videos):
    """(policy, batch, rollout, generate positions) with G=2 plus one shuffled sample per prompt. The training forward
    is the plain one (a row per sample, whose positions these tests read); tests/policies/test_shared_prefix.py checks the
    shared-prefix forward against it on video prompts."""
    policy = make_policy(request.param, shuffled=1, shared_prefix=False)
    batch = video_batch(videos)
    rec = PositionRecorder(policy)
    ro = policy.rollout(batch, 2)
    rec.close()
    return policy, batch, ro, rec.calls


def test_positions_and_logp_agree_between_sampling_and_training(sampled):
    policy, batch, ro, gen_calls = sampled
    prompts = ro.payload["prompts"]
    assert len({p.input_ids.numel() for p in prompts}) == 3  # left padding is exercised
    assert len({p.visual_tokens for p in prompts}) >= 2  # other frame sizes: other vision-token counts
    lengths = [int(n) for n in ro.mask.sum(1).tolist()]
    from mmrl.policies.token_policy import left_pad

    _, prompt_mask = left_pad([p.input_ids for p in prompts], policy.pad_id)
    gen = generation_positions(gen_calls, prompt_mask, lengths)
    rec = PositionRecorder(policy)
    with torch.no_grad():
        out = policy.log_probs(ro)
    rec.close()
    assert len(rec.calls) == 1
    train = training_positions(rec.calls[0], prompt_mask.shape[1], prompt_mask, lengths)
    for b in range(ro.batch_size):
        assert torch.equal(gen[b], train[b]), f"sample {b}: rotary positions differ between sampling and training"
    # video tokens really carry a temporal index that grows over the video (not all-equal positions)
    p0 = prompts[0]
    vid = (p0.mm_token_type_ids == 2).nonzero().flatten()
    t_rows = gen[0][0, vid]
    assert t_rows.unique().numel() == int(p0.video_grid_thw[0, 0]) or policy.family == "qwen3_vl"
    assert float(((out.logp - ro.rollout_logp).abs() * ro.mask).max()) < TOL
    # another micro-batch layout gives the same log-probs
    idx = torch.tensor([8, 3, 0])
    with torch.no_grad():
        sub = policy.log_probs(ro.index(idx))
    assert float(((sub.logp - ro.rollout_logp[idx]).abs() * ro.mask[idx]).max()) < TOL


def test_recomputed_logp_equals_plain_forward_from_processor_outputs(sampled):
    """An unpadded HF forward from the processor's own pixel values and time inputs agrees."""
    policy, _, ro, _ = sampled
    with torch.no_grad():
        out = policy.log_probs(ro)
    for i in (0, 5, ro.batch_size - 1):
        p, c = ro.payload["prompts"][i], ro.payload["completion_ids"][i]
        ids = torch.cat([p.input_ids, c])[None]
        kw = dict(
            pixel_values_videos=p.pixel_values_videos,
            video_grid_thw=p.video_grid_thw,
            mm_token_type_ids=torch.cat([p.mm_token_type_ids, torch.zeros_like(c)])[None],
        )
        if p.second_per_grid_ts is not None:
            kw["second_per_grid_ts"] = p.second_per_grid_ts
        with torch.no_grad():
            logits = policy.module.lm(input_ids=ids, attention_mask=torch.ones_like(ids), **kw).logits
        L = p.input_ids.numel()
        z = logits[0, L - 1 : L - 1 + c.numel()] / policy.cfg.temperature
        z[:, policy.suppress_ids] = float("-inf")  # the sampled distribution: vision special tokens removed
        ref = z.log_softmax(-1).gather(-1, c[:, None])[:, 0]
        assert float((out.logp[i, : c.numel()] - ref).abs().max()) < TOL


def test_time_inputs_per_family(sampled):
    policy, _, ro, _ = sampled
    p = ro.payload["prompts"][0]
    clip = p.videos[0]
    # 4 s at 4 fps, 2 fps sampling: 8 frames, 0.5 s apart -> 4 temporal patches of 1 s
    assert clip.num_frames == 8 and clip.sample_fps == pytest.approx(2.0)
    assert int(p.video_grid_thw[0, 0]) == 4
    if policy.family == "qwen2_5_vl":
        assert p.second_per_grid_ts.tolist() == pytest.approx([clip.second_per_grid_t()]) == [1.0]
    else:
        assert p.second_per_grid_ts is None
    if policy.family == "qwen3_vl":  # times are text: <t seconds> before each temporal patch
        text = policy.tokenizer.decode(p.input_ids)
        for t in clip.grid_timestamps():  # 0.375, 1.375, 2.375, 3.375 -> printed with one decimal
            assert f"<{t:.1f} seconds>" in text


def test_second_per_grid_ts_reaches_every_qwen25_forward(videos):
    policy = make_policy("tiny_qwen2_5_vl")
    # 1 fps sampling: 4 frames, 2 s per temporal patch (at 2 fps it would be 1.0, the value a forward
    # silently assumes without second_per_grid_ts, and the check below could not tell)
    batch = video_batch(videos, {**SAMPLING, "fps": 1.0})
    rec = PositionRecorder(policy)
    ro = policy.rollout(batch, 1)
    assert ro.payload["prompts"][0].second_per_grid_ts.tolist() == [2.0]
    rec.close()
    prompts = ro.payload["prompts"]
    lm = policy.module.lm
    inputs = policy._prompt_inputs(prompts, None)
    # the prefill of generate used the processor's second_per_grid_ts ...
    with_spg, _ = lm.model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"],
        attention_mask=inputs["attention_mask"],
    )
    without, _ = lm.model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        video_grid_thw=inputs["video_grid_thw"],
        attention_mask=inputs["attention_mask"],
    )
    real = inputs["attention_mask"].bool()
    assert torch.equal(rec.calls[0]["pos"][:, real], with_spg[:, real])
    assert not torch.equal(with_spg[:, real], without[:, real])  # 2 s per patch vs the default 1: differs
    # ... and the training forward uses it: doubling it changes the positions and the log-probs
    with torch.no_grad():
        rec = PositionRecorder(policy)
        base = policy.log_probs(ro)
        for p in prompts:
            p.second_per_grid_ts = p.second_per_grid_ts * 2
        changed = policy.log_probs(ro)
        rec.close()
    assert not torch.equal(rec.calls[0]["pos"], rec.calls[1]["pos"])
    assert float(((base.logp - changed.logp).abs() * ro.mask).max()) > 1e-3


def test_sample_fields_and_video_metrics(sampled):
    policy, batch, ro, _ = sampled
    s = ro.samples[0]
    # 128x96 source, 6272 px cap -> 84x56 frames; Qwen2/2.5: (84/28)*(56/28) = 6 tokens per patch x 4 patches
    # Qwen3-VL (32 px multiple): 64x64 frames -> (64/32)*(64/32) = 4 tokens per patch x 4 patches
    per_patch = {"qwen2_vl": 6, "qwen2_5_vl": 6, "qwen3_vl": 4}[policy.family]
    assert s["visual_tokens"] == 4 * per_patch
    assert s["duration"] == pytest.approx(4.0) and s["clip_start"] == 0.0 and s["num_frames"] == 8
    assert s["shuffled"] is False and ro.samples[2]["shuffled"] is True
    ordered = [x for x in ro.samples if not x["shuffled"]]
    assert ro.metrics["video/frames"] == 8.0
    assert ro.metrics["video/visual_tokens"] == pytest.approx(sum(x["visual_tokens"] for x in ordered) / len(ordered))
    assert video_rollout_metrics([{"text": ""}]) == {}


def test_shuffled_samples_layout_masking_and_patch_pairs(sampled):
    policy, batch, ro, _ = sampled
    # per prompt: 2 ordered then 1 shuffled, all in one generate call (rollout_logp rows for all 9)
    assert ro.batch_size == 9
    assert [s["shuffled"] for s in ro.samples] == [False, False, True] * 3
    assert ro.valid.tolist() == [True, True, False] * 3  # no gradient, outside the group statistics
    assert ro.probe.tolist() == [False, False, True] * 3  # marked as probes: dropped from scoring by without_probes()
    assert ro.without_probes().batch_size == 6
    assert ro.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert ro.group_id.tolist() == [101] * 3 + [202] * 3 + [303] * 3
    for k in range(3):
        ordered, shuffled = ro.payload["prompts"][3 * k], ro.payload["prompts"][3 * k + 2]
        assert shuffled is not ordered
        assert torch.equal(shuffled.input_ids, ordered.input_ids)
        assert torch.equal(shuffled.video_grid_thw, ordered.video_grid_thw)
        assert shuffled.videos[0].metadata() == ordered.videos[0].metadata()  # same times, other order
        perm = temporal_patch_permutation(4, mix_seed(batch.seeds[k], 0))  # the policy's seed for video 0
        assert perm != [0, 1, 2, 3]
        # frames: whole pairs moved
        f0, f1 = ordered.videos[0].frames, shuffled.videos[0].frames
        for j, src in enumerate(perm):
            assert np.array_equal(f1[2 * j : 2 * j + 2], f0[2 * src : 2 * src + 2])
        # processor pixels: t-major blocks of h*w patches moved the same way
        t, h, w = ordered.video_grid_thw[0].tolist()
        blocks0 = ordered.pixel_values_videos.reshape(t, h * w, -1)
        blocks1 = shuffled.pixel_values_videos.reshape(t, h * w, -1)
        assert torch.equal(blocks1, blocks0[perm])
    # the shuffled samples still have behaviour log-probs that recompute exactly (their own pixels)
    with torch.no_grad():
        out = policy.log_probs(ro)
    sh = torch.tensor([2, 5, 8])
    assert float(((out.logp[sh] - ro.rollout_logp[sh]).abs() * ro.mask[sh]).max()) < TOL


def test_permute_temporal_patches_keeps_pairs():
    frames = np.arange(8)[:, None, None, None] * np.ones((8, 2, 3, 3), dtype=np.int64)  # frame k is all k
    out = permute_temporal_patches(frames, [2, 0, 3, 1], 2)
    assert out[:, 0, 0, 0].tolist() == [4, 5, 0, 1, 6, 7, 2, 3]
    out3 = permute_temporal_patches(frames[:6], [1, 0], 3)
    assert out3[:, 0, 0, 0].tolist() == [3, 4, 5, 0, 1, 2]
    with pytest.raises(ValueError, match="not a multiple"):
        permute_temporal_patches(frames[:7], [0, 1, 2], 2)
    with pytest.raises(ValueError, match="not a permutation"):
        permute_temporal_patches(frames, [0, 0, 1, 2], 2)
    # never the identity for >= 2 patches; deterministic per seed; identity for a single patch
    for n in (2, 3, 4):
        for seed in range(40):
            perm = temporal_patch_permutation(n, seed)
            assert sorted(perm) == list(range(n)) and perm != list(range(n))
            assert perm == temporal_patch_permutation(n, seed)
    assert temporal_patch_permutation(1, 5) == [0] and temporal_patch_permutation(0, 5) == []


def test_each_video_is_decoded_once_per_prompt(videos, tmp_path):
    sampling = {**SAMPLING, "cache_dir": str(tmp_path / "frames")}
    policy = make_policy("tiny_qwen2_5_vl", shuffled=2)
    batch = video_batch(videos, sampling)
    ro = policy.rollout(batch, 3)
    cache = frame_cache_for(VideoSamplingConfig(**sampling, size_multiple=28))
    assert ro.batch_size == 3 * (3 + 2)
    assert cache.stats.decodes == 3  # 15 samples, 3 videos, 3 decodes
    # samples of a prompt share the same clip object (shuffled copies share its times, not its frames)
    prompts = ro.payload["prompts"]
    assert prompts[0] is prompts[1] is prompts[2] and prompts[0].videos[0] is prompts[1].videos[0]
    # training forwards and a second rollout decode nothing more
    with torch.no_grad():
        policy.log_probs(ro)
    policy.rollout(batch, 2, greedy=True)
    assert cache.stats.decodes == 3
    # greedy (evaluation) rollouts have no shuffled samples
    greedy = policy.rollout(batch, 1, greedy=True)
    assert greedy.batch_size == 3 and greedy.valid.all() and not any(s["shuffled"] for s in greedy.samples)


def test_bad_video_items_raise_named_errors(videos, tmp_path):
    policy = make_policy("tiny_qwen2_5_vl")
    with pytest.raises(VideoInputError, match="must be a path or a VideoClip"):
        policy.preprocess([{"video": 3, "prompt": "x"}])
    odd = load_video(
        videos[0],
        VideoSamplingConfig(fps=2.0, max_frames=8, max_pixels_per_frame=6272, size_multiple=32, decode_timeout_s=None),
    )
    with pytest.raises(VLMInputError, match="not multiples of this processor's patch\\*merge=28"):
        policy.preprocess([{"video": odd, "prompt": "x"}])
    three = dataclasses.replace(
        load_video(
            videos[0], VideoSamplingConfig(fps=2.0, max_frames=8, decode_timeout_s=None, max_pixels_per_frame=6272)
        )
    )
    three.frames = three.frames[:3]
    with pytest.raises(VideoInputError, match="3 frames is not a multiple of the temporal patch size 2"):
        item_clips({"video": three}, policy.processor)
    from mmrl.adapters.video.decode import VideoError

    with pytest.raises(VideoError, match="file not found") as err:
        policy.preprocess([{"video": str(tmp_path / "missing.mp4"), "prompt": "x", "video_sampling": SAMPLING}])
    assert "missing.mp4" in str(err.value)
