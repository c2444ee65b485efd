"""Video input: sampling rules (by hand), decoding, bad inputs, timeout worker, cache,
synthetic videos, and the values the Qwen processors receive."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mmrl.adapters.video.decode import (
    DecodeWorker,
    VideoDecodeTimeout,
    VideoError,
    VideoReaderUnavailable,
    VideoSamplingConfig,
    check_reader_available,
    decode_clip,
    frame_window,
    load_video,
    num_sampled_frames,
    plan_sampling,
    processor_video_inputs,
    resolve_fps,
    sample_frame_indices,
    size_multiple_of,
    target_frame_size,
)
from mmrl.adapters.video.frame_cache import VideoFrameCache, file_identity, frame_cache_key, get_or_decode
from mmrl.adapters.video.synthetic import PALETTE, SyntheticVideoError, make_event_video, make_video_dataset
from mmrl.data.media import MediaError

INPROC = VideoSamplingConfig(decode_timeout_s=None)  # decode in this process (fast path for most tests)


@pytest.fixture(scope="module")
def vids(tmp_path_factory) -> dict:
    """Synthetic videos: 'main' 8 s @ 8 fps 128x96, 'exact' 112x84 (no resize needed)."""
    folder = tmp_path_factory.mktemp("videos")
    main = make_event_video(folder / "main.mp4", seed=3)
    exact = make_event_video(folder / "exact.mp4", seed=11, size=(112, 84))
    return {"folder": folder, "main": main, "exact": exact}


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fps": 0},
        {"fps": float("nan")},
        {"min_frames": 8, "max_frames": 4},
        {"max_frames": 1},  # < frame_factor 2
        {"max_pixels_per_frame": 28 * 28 - 1},
        {"total_pixel_budget": 2 * 28 * 28 - 1},
        {"clip_start": -1.0},
        {"clip_start": 3.0, "clip_end": 3.0},
        {"reader": "opencv"},
        {"fallback_fps": 0},
        {"decode_timeout_s": -1},
        {"min_frames": 2.5},
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match="VideoSamplingConfig"):
        VideoSamplingConfig(**kwargs)


def test_frame_fields_cover_what_changes_frames():
    cfg = VideoSamplingConfig()
    fields = cfg.frame_fields()
    assert "fps" in fields and "reader" in fields and "clip_start" in fields and "size_multiple" in fields
    assert "decode_timeout_s" not in fields and "cache_dir" not in fields
    assert cfg.with_clip(1.0, 2.0).frame_fields()["clip_end"] == 2.0


# --------------------------------------------------------------------------- sampling math by hand


def test_frame_window_by_hand():
    # 64 frames at 8 fps = 8 s. Whole video: frames [0, 64).
    assert frame_window(64, 8.0, None, None) == (0, 64)
    # [2, 6) s -> frames with 2 <= i/8 < 6 -> i in [16, 48)
    assert frame_window(64, 8.0, 2.0, 6.0) == (16, 48)
    # [1.3, 5.01) -> ceil(10.4) = 11, ceil(40.08) = 41
    assert frame_window(64, 8.0, 1.3, 5.01) == (11, 41)
    # 0.3 * 10 = 3.0000000000000004 must still snap to frame 3
    assert frame_window(100, 10.0, 0.3, None) == (3, 100)
    # clip_end past the end is clamped to the duration
    assert frame_window(64, 8.0, 7.0, 100.0) == (56, 64)
    for start, end, msg in [(8.0, None, "outside"), (9.5, 12.0, "outside"), (7.95, None, "holds no frame")]:
        with pytest.raises(VideoError, match=msg) as err:
            frame_window(64, 8.0, start, end, path="/x/v.mp4")
        assert "/x/v.mp4" in str(err.value)


def test_num_sampled_frames_by_hand():
    cfg = VideoSamplingConfig(fps=2.0, min_frames=4, max_frames=16)
    assert num_sampled_frames(8.0, cfg) == 16  # 8 s * 2 fps
    assert num_sampled_frames(3.75, cfg) == 8  # 7.5 -> round half up 8
    assert num_sampled_frames(3.2, cfg) == 6  # 6.4 -> 6
    assert num_sampled_frames(2.7, cfg) == 6  # 5.4 -> 5 -> 5/2 = 2.5 rounds up -> 6
    assert num_sampled_frames(0.5, cfg) == 4  # 1 -> min_frames 4
    assert num_sampled_frames(100.0, cfg) == 16  # 200 -> max_frames 16
    odd_max = VideoSamplingConfig(fps=2.0, min_frames=4, max_frames=15)
    assert num_sampled_frames(100.0, odd_max) == 14  # largest multiple of 2 <= 15
    assert num_sampled_frames(100.0, dataclasses.replace(odd_max, frame_factor=1)) == 15


def test_sample_frame_indices_by_hand():
    # 64 source frames, 16 samples: first + floor((2k+1) * 64 / 32) = 2 + 4k
    assert sample_frame_indices(0, 64, 16) == [2 + 4 * k for k in range(16)]
    # window [11, 41) (30 frames), 8 samples: 11 + floor((2k+1)*30/16)
    assert sample_frame_indices(11, 41, 8) == [12, 16, 20, 24, 27, 31, 35, 39]
    # more samples than frames: indices repeat (3 frames, 4 samples: (2k+1)*3//8 = 0,1,1,2)
    assert sample_frame_indices(5, 8, 4) == [5, 6, 6, 7]
    with pytest.raises(ValueError):
        sample_frame_indices(4, 4, 2)


def test_target_frame_size_by_hand():
    # 96x128, multiple 28: round(96/28)=3 -> 84, round(128/28)=5 -> 140; 84*140 = 11760 fits
    assert target_frame_size(96, 128, 128 * 28 * 28, 28) == (84, 140)
    # cap 5880: beta = sqrt(12288/5880) = 1.4456; 96/1.4456/28 = 2.37 -> 56, 128/1.4456/28 = 3.16 -> 84
    assert target_frame_size(96, 128, 5880, 28) == (56, 84)
    # a tiny cap never goes below one multiple per side
    assert target_frame_size(96, 128, 100, 28) == (28, 28)
    # 1080p with Qwen3's 32: shrinks under 128*32*32 = 131072 and keeps multiples of 32
    h, w = target_frame_size(1080, 1920, 128 * 32 * 32, 32)
    assert h % 32 == 0 and w % 32 == 0 and h * w <= 131072 and (h, w) == (256, 480)


def test_plan_sampling_budgets():
    base = VideoSamplingConfig()
    plan = plan_sampling(64, 8.0, 96, 128, base)
    assert plan.indices == tuple(range(2, 64, 4)) and (plan.height, plan.width) == (84, 140)
    # budget 94080 = half of 16 * 84 * 140: per frame 94080 // 16 = 5880 -> 56x84; 16*4704 fits
    plan = plan_sampling(64, 8.0, 96, 128, dataclasses.replace(base, total_pixel_budget=94080))
    assert (len(plan.indices), plan.height, plan.width) == (16, 56, 84)
    # budget 10000: per frame 625 -> 28x28 (784 px); 16*784 > 10000 -> T = 10000//784 = 12 (even)
    plan = plan_sampling(64, 8.0, 96, 128, dataclasses.replace(base, total_pixel_budget=10000, min_frames=14))
    assert (len(plan.indices), plan.height, plan.width) == (12, 28, 28)  # the budget wins over min_frames
    assert len(plan.indices) * plan.height * plan.width <= 10000
    with pytest.raises(VideoError, match="aspect ratio"):
        plan_sampling(64, 8.0, 2, 1000, base, path="thin.mp4")
    # an extreme aspect ratio whose smallest frame (28 x 28*190) cannot fit 2 frames in the budget
    with pytest.raises(VideoError, match="total_pixel_budget"):
        plan_sampling(
            64, 8.0, 28, 28 * 190, dataclasses.replace(base, total_pixel_budget=2 * 28 * 28 * 10), path="w.mp4"
        )


def test_resolve_fps():
    assert resolve_fps(29.97, None, "a.mp4") == 29.97
    assert resolve_fps(0.0, 25.0, "a.mp4") == 25.0
    for bad in (None, 0, 0.0, float("nan"), float("inf"), -5, "x"):
        with pytest.raises(VideoError, match="no frame rate") as err:
            resolve_fps(bad, None, "/data/nofps.mp4")
        assert "/data/nofps.mp4" in str(err.value) and "fallback_fps" in str(err.value)


# --------------------------------------------------------------------------- decoding


def test_decode_whole_video_values(vids):
    clip = load_video(vids["main"]["video"], INPROC)
    # 8 s at 8 fps, 2 fps -> 16 frames at t = 0.25 + 0.5k (indices 2 + 4k)
    assert clip.frames.shape == (16, 84, 140, 3) and clip.frames.dtype == np.uint8
    assert clip.frame_indices == [2 + 4 * k for k in range(16)]
    assert clip.timestamps == pytest.approx([0.25 + 0.5 * k for k in range(16)])
    assert clip.sample_fps == pytest.approx(2.0) and clip.source_fps == pytest.approx(8.0)
    assert clip.second_per_grid_t() == pytest.approx(1.0)  # 2 / 2 fps
    assert clip.second_per_grid_t(temporal_patch_size=4) == pytest.approx(2.0)
    assert (clip.clip_start, clip.clip_end, clip.duration) == (0.0, 8.0, 8.0)
    assert (clip.source_width, clip.source_height, clip.source_num_frames) == (128, 96, 64)
    assert clip.grid_timestamps() == pytest.approx([0.5 + 1.0 * j for j in range(8)])  # mean of pairs
    assert clip.metadata() == {
        "total_num_frames": 64,
        "fps": 8.0,
        "width": 140,
        "height": 84,
        "duration": 8.0,
        "video_backend": "decord",
        "frames_indices": [2 + 4 * k for k in range(16)],
    }
    assert not clip.frames.flags.writeable


def test_decode_clip_window_values(vids):
    clip = load_video(vids["main"]["video"], INPROC.with_clip(2.0, 6.0))
    # frames [16, 48), 4 s * 2 fps = 8 samples: 16 + floor((2k+1)*32/16) = 18 + 4k
    assert clip.frame_indices == [18 + 4 * k for k in range(8)]
    assert clip.timestamps == pytest.approx([2.25 + 0.5 * k for k in range(8)])
    assert clip.relative_timestamps == pytest.approx([0.25 + 0.5 * k for k in range(8)])
    meta = clip.metadata()
    assert meta["total_num_frames"] == 32 and meta["frames_indices"] == [2 + 4 * k for k in range(8)]
    assert meta["duration"] == 4.0 and clip.sample_fps == pytest.approx(2.0)
    # off-grid window: snapped to [11/8, 41/8) = [1.375, 5.125); 8 frames over 3.75 s
    clip = load_video(vids["main"]["video"], INPROC.with_clip(1.3, 5.01))
    assert clip.frame_indices == [12, 16, 20, 24, 27, 31, 35, 39]
    assert (clip.clip_start, clip.clip_end) == (1.375, 5.125)
    assert clip.sample_fps == pytest.approx(8 / 3.75)
    assert clip.second_per_grid_t() == pytest.approx(2 / (8 / 3.75))
    # clip_end past the end: clamped to the duration
    clip = load_video(vids["main"]["video"], INPROC.with_clip(6.0, 100.0))
    assert clip.clip_end == 8.0 and clip.frame_indices == [48 + (2 * k + 1) * 16 // 8 for k in range(4)]


def test_min_max_frames_and_effective_fps(vids):
    path = vids["main"]["video"]
    few = load_video(path, dataclasses.replace(INPROC, fps=0.25))  # 8 s * 0.25 = 2 -> min 4
    assert few.frame_indices == [8, 24, 40, 56] and few.sample_fps == pytest.approx(0.5)
    many = load_video(path, dataclasses.replace(INPROC, fps=8.0))  # 64 -> max 16: effective 2 fps
    assert many.num_frames == 16 and many.sample_fps == pytest.approx(2.0)
    budget = load_video(path, dataclasses.replace(INPROC, total_pixel_budget=94080))
    assert budget.frames.shape == (16, 56, 84, 3)


def test_worker_and_in_process_give_identical_frames(vids):
    path = vids["main"]["video"]
    worker = DecodeWorker()
    try:
        a = load_video(path, VideoSamplingConfig(), worker=worker)
    finally:
        worker.close()
    b = decode_clip(path, VideoSamplingConfig())
    assert np.array_equal(a.frames, b.frames) and a.info() == b.info()


def test_event_visible_exactly_inside_segment(vids):
    truth = vids["exact"]
    all_frames = VideoSamplingConfig(fps=8.0, max_frames=64, decode_timeout_s=None)
    clip = load_video(truth["video"], all_frames)
    assert clip.frame_indices == list(range(64)) and clip.frames.shape == (64, 84, 112, 3)  # no resize
    ((s, e),) = truth["segments"]
    cx, cy = truth["event_center"]
    event_rgb = np.array(PALETTE[truth["event_color"]])
    centre = clip.frames[:, cy, cx].astype(int)
    near_event = np.abs(centre - event_rgb).max(axis=1) < 50
    inside = np.array([s <= t < e for t in clip.timestamps])
    assert inside.sum() == truth["event_frames"][1] - truth["event_frames"][0] > 0
    assert np.array_equal(near_event, inside)
    # the square's flashes, counted from pixels, give the numeric answer
    x0, y0, x1, y1 = truth["square_box"]
    lit = clip.frames[:, (y0 + y1) // 2, (x0 + x1) // 2].mean(axis=1) > 180
    rises = int(lit[0]) + int(np.sum(lit[1:] & ~lit[:-1]))
    assert rises == truth["flash_count"] == truth["questions"]["count"]["answer"]
    # the moving triangle has the moving colour at its start and end positions
    q = truth["questions"]["color"]
    assert q["options"][ord(q["answer"]) - ord("A")] == truth["moving_color"] != truth["event_color"]
    h, w = 84, 112
    tri = round(0.12 * h)
    for i in (0, 63):
        x = round(3 + (w - tri - 6) * i / 63) + tri // 2
        y = h - 3 - tri // 3
        assert np.abs(clip.frames[i, y, x].astype(int) - np.array(PALETTE[truth["moving_color"]])).max() < 60


# --------------------------------------------------------------------------- bad inputs


def _faststart_half(path: Path) -> Path:
    """An mp4 with its index first (faststart) cut in half: opens, then fails while decoding."""
    av = pytest.importorskip("av")
    full = path.with_name("faststart_full.mp4")
    with av.open(str(full), "w", options={"movflags": "faststart"}) as out:
        stream = out.add_stream("mpeg4", rate=8)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        rng = np.random.default_rng(0)
        for _ in range(48):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    data = full.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_bad_inputs_raise_video_error_with_path(vids, tmp_path):
    import cv2

    good = Path(vids["main"]["video"])
    cut = tmp_path / "cut_half.mp4"
    data = good.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    zero = tmp_path / "zero.mp4"
    zero.write_bytes(b"")
    rand = tmp_path / "random.mp4"
    rand.write_bytes(np.random.default_rng(1).bytes(30000))
    nostream = tmp_path / "no_stream.mp4"
    cv2.VideoWriter(str(nostream), cv2.VideoWriter_fourcc(*"mp4v"), 8, (64, 48)).release()  # no frames written
    cases = [
        (tmp_path / "missing.mp4", "file not found"),
        (tmp_path, "directory"),
        (zero, "empty file"),
        (cut, "not a readable video"),
        (rand, "not a readable video"),
        (_faststart_half(tmp_path / "faststart_half.mp4"), "corrupt"),
    ]
    if nostream.exists() and nostream.stat().st_size > 0:
        cases.append((nostream, "not a readable video"))
    cfg = VideoSamplingConfig(fps=8.0, max_frames=48)  # through the worker process
    for path, reason in cases:
        with pytest.raises(VideoError, match=reason) as err:
            load_video(path, cfg)
        assert str(path) in str(err.value) and isinstance(err.value, MediaError)
    for start, end in [(8.0, None), (20.0, 30.0)]:  # times outside the 8 s video
        with pytest.raises(VideoError, match="outside the video") as err:
            load_video(good, cfg.with_clip(start, end))
        assert str(good) in str(err.value)
    # and the worker still decodes a good file afterwards
    assert load_video(good, VideoSamplingConfig()).num_frames == 16


def test_missing_torchcodec_is_a_clear_setup_error(vids, monkeypatch):
    import mmrl.adapters.video.decode as video_module

    for name in ("torchcodec", "torchcodec.decoders"):  # as if not installed (import -> ImportError)
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(video_module, "_READER_CHECKED", {})  # forget earlier successful checks (restored after)
    with pytest.raises(VideoReaderUnavailable) as err:
        check_reader_available("torchcodec")
    msg = str(err.value)
    assert "pip install torchcodec" in msg and "ffmpeg" in msg.lower() and "No other reader" in msg
    cfg = VideoSamplingConfig(reader="torchcodec")
    with pytest.raises(VideoReaderUnavailable, match="pip install torchcodec"):
        load_video(vids["main"]["video"], cfg)  # never silently decoded with decord
    assert not issubclass(VideoReaderUnavailable, MediaError)  # a setup error is not skipped as bad data


def test_hanging_decode_times_out_and_worker_recovers(vids):
    path = vids["main"]["video"]
    cfg = VideoSamplingConfig(decode_timeout_s=1.0)
    worker = DecodeWorker()
    try:
        assert load_video(path, cfg, worker=worker).num_frames == 16
        first_pid = worker.pid
        worker.test_hang_s = 60.0  # the worker sleeps before decoding: a hung decoder
        t0 = time.monotonic()
        with pytest.raises(VideoDecodeTimeout, match="decode_timeout_s=1") as err:
            load_video(path, cfg, worker=worker)
        elapsed = time.monotonic() - t0
        # the timeout fired (not the 60 s hang): measured ~1.1 s, bound ~25x that and half the hang
        assert 0.9 <= elapsed < 30.0 and path in str(err.value)
        assert worker.pid is None  # killed
        worker.test_hang_s = 0.0
        clip = load_video(path, cfg, worker=worker)
        assert clip.num_frames == 16 and worker.starts == 2 and worker.pid not in (None, first_pid)
    finally:
        worker.close()


def test_worker_death_mid_decode_is_a_video_error(vids):
    path = vids["main"]["video"]
    worker = DecodeWorker()
    try:
        assert load_video(path, VideoSamplingConfig(), worker=worker).num_frames == 16
        worker.test_hang_s = 30.0
        pid = worker.pid
        threading.Timer(0.3, lambda: os.kill(pid, 9)).start()  # a decoder crash (e.g. segfault)
        with pytest.raises(VideoError, match="decoder process died"):
            load_video(path, VideoSamplingConfig(), worker=worker)
        worker.test_hang_s = 0.0
        assert load_video(path, VideoSamplingConfig(), worker=worker).num_frames == 16
    finally:
        worker.close()


# --------------------------------------------------------------------------- cache


class CountingDecoder:
    def __init__(self):
        self.calls = 0

    def __call__(self, path, cfg):
        self.calls += 1
        return decode_clip(path, cfg)


def test_cache_hits_keys_and_corruption(vids, tmp_path):
    path = vids["main"]["video"]
    dec = CountingDecoder()
    cache = VideoFrameCache(tmp_path / "c", decoder=dec)
    a = cache.get_or_decode(path, INPROC)
    b = cache.get_or_decode(path, INPROC)
    assert b is a and dec.calls == 1 and cache.stats.memory_hits == 1
    # a new process (new cache object, same folder): disk hit, no decode, identical clip
    dec2 = CountingDecoder()
    cache2 = VideoFrameCache(tmp_path / "c", decoder=dec2)
    c = cache2.get_or_decode(path, INPROC)
    assert dec2.calls == 0 and cache2.stats.disk_hits == 1
    assert np.array_equal(c.frames, a.frames) and c.info() == a.info() and not c.frames.flags.writeable
    # fps changes the key and the frames; the decode timeout does not change the key
    key = cache.key(path, INPROC)
    assert cache.key(path, dataclasses.replace(INPROC, fps=1.0)) != key
    assert cache.key(path, dataclasses.replace(INPROC, decode_timeout_s=3.0)) == key
    assert cache.key(path, dataclasses.replace(INPROC, reader="torchcodec")) != key
    d = cache.get_or_decode(path, dataclasses.replace(INPROC, fps=1.0))
    assert dec.calls == 2 and d.num_frames == 8
    # corrupt the stored frames (same size, flipped bytes): ignored, deleted, rebuilt
    npy, meta = cache.entry_paths(key)
    raw = bytearray(npy.read_bytes())
    raw[-100:] = bytes(100)
    npy.write_bytes(bytes(raw))
    dec3 = CountingDecoder()
    cache3 = VideoFrameCache(tmp_path / "c", decoder=dec3)
    e = cache3.get_or_decode(path, INPROC)
    assert cache3.stats.corrupt == 1 and dec3.calls == 1 and np.array_equal(e.frames, a.frames)
    assert npy.exists() and meta.exists()  # rebuilt
    # a truncated JSON sidecar is also rebuilt
    meta.write_text(meta.read_text()[:20])
    cache4 = VideoFrameCache(tmp_path / "c", decoder=CountingDecoder())
    cache4.get_or_decode(path, INPROC)
    assert cache4.stats.corrupt == 1 and cache4.stats.decodes == 1
    assert not list((tmp_path / "c").rglob("*.tmp"))  # no temp files left behind


def test_cache_identity_lru_and_remembered_errors(vids, tmp_path):
    src = Path(vids["main"]["video"])
    copy = tmp_path / "copy.mp4"
    shutil.copy(src, copy)
    assert file_identity(src, "content") == file_identity(copy, "content")
    assert file_identity(src) != file_identity(copy)  # stat identity includes the path
    assert frame_cache_key(file_identity(src), INPROC) != frame_cache_key(file_identity(copy), INPROC)
    before = frame_cache_key(file_identity(copy), INPROC)
    os.utime(copy, ns=(1, 1))  # touched file: new stat identity, new key
    assert frame_cache_key(file_identity(copy), INPROC) != before

    dec = CountingDecoder()
    cache = VideoFrameCache(None, memory_items=1, decoder=dec)  # memory only, one clip
    other = vids["exact"]["video"]
    cache.get_or_decode(src, INPROC)
    cache.get_or_decode(other, INPROC)  # evicts src
    cache.get_or_decode(src, INPROC)
    assert dec.calls == 3 and cache.stats.memory_hits == 0

    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all" * 100)
    for _ in range(3):
        with pytest.raises(VideoError, match="not a readable video"):
            cache.get_or_decode(bad, INPROC)
    assert cache.stats.failures == 1 and cache.stats.error_hits == 2 and dec.calls == 4
    with pytest.raises(VideoError, match="file not found"):
        cache.get_or_decode(tmp_path / "nope.mp4", INPROC)


def test_module_get_or_decode_uses_cfg_cache_dir(vids, tmp_path):
    cfg = VideoSamplingConfig(cache_dir=str(tmp_path / "fc"), decode_timeout_s=None)
    clip = get_or_decode(vids["main"]["video"], cfg)
    assert clip.num_frames == 16 and len(list((tmp_path / "fc").rglob("*.npy"))) == 1
    assert get_or_decode(vids["main"]["video"], cfg) is clip
    mem_only = dataclasses.replace(cfg, cache_dir="")
    assert get_or_decode(vids["main"]["video"], mem_only).num_frames == 16


# --------------------------------------------------------------------------- synthetic videos


def test_synthetic_deterministic_and_fast(tmp_path):
    a = make_event_video(tmp_path / "a.mp4", seed=5)
    b = make_event_video(tmp_path / "b.mp4", seed=5)
    c = make_event_video(tmp_path / "c.mp4", seed=6)
    strip = lambda t: {k: v for k, v in t.items() if k not in ("video", "questions")}  # noqa: E731
    assert strip(a) == strip(b) and strip(a) != strip(c)
    fa, fb = (decode_clip(p, INPROC).frames for p in (a["video"], b["video"]))
    assert np.array_equal(fa, fb)
    s, e = a["segments"][0]
    assert 0 < s < e < a["duration"] == 8.0 and (s * 8).is_integer() and (e * 8).is_integer()
    assert a["event"] == f"the {a['event_color']} circle appears"
    t0 = time.perf_counter()
    recs = make_video_dataset(tmp_path / "ds", 20, seed=1)
    # 20 videos of 8 s at 8 fps, 128x96: measured median 0.31 s on 2 shared cores, the bound ~20x that
    assert time.perf_counter() - t0 < 6.0
    assert len(recs) == 20 and len({r["video"] for r in recs}) == 20
    with pytest.raises(SyntheticVideoError):
        make_event_video(tmp_path / "x.mp4", seed=0, duration_s=1.0)


def test_synthetic_event_grid_and_scale(tmp_path):
    # 8 s at 2 fps = 16 frames; grid 2 -> 8 cells: the event starts and lasts whole cells (whole seconds)
    for seed in range(6):
        t = make_event_video(
            tmp_path / f"g{seed}.mp4", seed=seed, duration_s=8.0, fps=2, event_grid=2, event_scale=0.22
        )
        a, b = t["event_frames"]
        assert a % 2 == 0 and b % 2 == 0 and 0 < a < b < 16
        s, e = t["segments"][0]
        assert s.is_integer() and e.is_integer() and (s, e) == (a / 2, b / 2)
        assert t["event_radius"] == round(0.22 * 96) == 21
        cx, cy = t["event_center"]
        assert cx - 21 >= 0 and cx + 21 < 128 and cy - 21 >= 0 and cy + 21 < 96
        frames = decode_clip(t["video"], INPROC).frames  # [16, H, W, 3]
        on = frames[a, cy, cx].astype(int)
        off = frames[a - 1, cy, cx].astype(int)
        assert np.abs(on - np.array(PALETTE[t["event_color"]])).max() < 40 and off.max() < 80
    with pytest.raises(SyntheticVideoError, match="event_grid"):
        make_event_video(tmp_path / "x.mp4", seed=0, duration_s=8.0, fps=2, event_grid=5)  # > 16 // 4
    with pytest.raises(SyntheticVideoError, match="event_scale"):
        make_event_video(tmp_path / "x.mp4", seed=0, event_scale=0.5)
    # the original defaults keep their file names; other settings get their own files
    plain = make_video_dataset(tmp_path / "ds", 1, seed=3)
    gridded = make_video_dataset(tmp_path / "ds", 1, seed=3, event_grid=2)
    assert plain[0]["video"] != gridded[0]["video"]


def test_video_dataset_records_and_reuse(tmp_path):
    temporal = make_video_dataset(tmp_path, 4, seed=2, kind="temporal")
    mtimes = [os.stat(r["video"]).st_mtime_ns for r in temporal]
    again = make_video_dataset(tmp_path, 4, seed=2, kind="temporal")
    assert again == temporal and [os.stat(r["video"]).st_mtime_ns for r in again] == mtimes  # reused
    r = temporal[0]
    assert r["task"] == "temporal_grounding" and r["segments"] == r["truth"]["segments"]
    assert r["question"].startswith(f"When does the {r['truth']['event_color']} circle appear")
    qa = make_video_dataset(tmp_path, 4, seed=2, kind="qa")
    assert [q["video"] for q in qa] == [t["video"] for t in temporal]  # same videos, other questions
    assert [q["question_type"] for q in qa] == ["multiple_choice", "numeric"] * 2
    assert qa[0]["options"][ord(qa[0]["answer"]) - 65] == qa[0]["truth"]["moving_color"]
    assert qa[1]["answer"] == qa[1]["truth"]["flash_count"] in (1, 2, 3, 4)
    clip = decode_clip(qa[1]["video"], INPROC)  # decord reads the files
    assert clip.num_frames == 16
    with pytest.raises(SyntheticVideoError):
        make_video_dataset(tmp_path, 1, seed=0, kind="captions")


# --------------------------------------------------------------------------- processors see the same time


def test_qwen_processors_receive_the_clip_times(vids):
    transformers = pytest.importorskip("transformers")
    from transformers.video_utils import VideoMetadata

    from mmrl.models.tokenizer_builder import build_bpe_tokenizer

    tok = build_bpe_tokenizer(["a video of a circle", "when does it appear"], vocab_size=260)
    text = ["Q <|vision_start|><|video_pad|><|vision_end|>"]
    for proc_cls, patch in (("Qwen2_5_VLProcessor", 14), ("Qwen3VLProcessor", 16)):
        vp_cls = "Qwen3VLVideoProcessor" if patch == 16 else "Qwen2VLVideoProcessor"
        common = dict(patch_size=patch, temporal_patch_size=2, merge_size=2)
        proc = getattr(transformers, proc_cls)(
            image_processor=transformers.Qwen2VLImageProcessor(**common),
            tokenizer=tok,
            video_processor=getattr(transformers, vp_cls)(cap_pixels_per_frame=True, **common),
        )
        mult = size_multiple_of(proc)
        assert mult == 2 * patch
        clip = load_video(vids["main"]["video"], dataclasses.replace(INPROC, size_multiple=mult).with_clip(1.3, 5.01))
        meta = VideoMetadata(**clip.metadata())
        assert meta.sampled_fps == pytest.approx(clip.sample_fps)
        assert meta.timestamps == pytest.approx(clip.relative_timestamps)
        out = proc(text=text, **processor_video_inputs([clip]), return_tensors="pt")
        t, h, w = clip.frames.shape[:3]
        assert out["video_grid_thw"].tolist() == [[t // 2, h // patch, w // patch]]  # frames used as given
        if proc_cls == "Qwen2_5_VLProcessor":
            assert out["second_per_grid_ts"].tolist() == pytest.approx([clip.second_per_grid_t()])
        else:
            decoded = tok.decode(out["input_ids"][0])
            stamps = [f"<{x:.1f} seconds>" for x in clip.grid_timestamps()]
            assert stamps == ["<0.4 seconds>", "<1.4 seconds>", "<2.2 seconds>", "<3.2 seconds>"]
            positions = [decoded.index(s) for s in stamps]
            assert positions == sorted(positions)
    with pytest.raises(ValueError):
        processor_video_inputs([])


def _torchcodec_or_skip():
    try:  # torchcodec raises RuntimeError (not ImportError) when FFmpeg's shared libraries are missing
        import torchcodec.decoders  # noqa: F401
    except Exception as e:
        pytest.skip(f"torchcodec cannot be loaded here: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def test_torchcodec_decodes_the_same_clip_as_decord(vids):
    _torchcodec_or_skip()
    for fps, max_frames, clip in [(2.0, 8, (None, None)), (8.0, 48, (1.0, 3.5))]:
        cfg = VideoSamplingConfig(fps=fps, max_frames=max_frames, decode_timeout_s=None).with_clip(*clip)
        a = load_video(vids["main"]["video"], cfg)
        b = load_video(vids["main"]["video"], dataclasses.replace(cfg, reader="torchcodec"))
        assert a.frame_indices == b.frame_indices and a.frames.shape == b.frames.shape
        np.testing.assert_array_equal(a.frames, b.frames)  # both seek exactly; same FFmpeg decode, same resize
        assert {k: v for k, v in a.info().items() if k != "reader"} == {
            k: v for k, v in b.info().items() if k != "reader"
        }
        assert b.info()["reader"] == "torchcodec"
