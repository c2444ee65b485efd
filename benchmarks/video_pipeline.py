"""Video input throughput: decode + resize with and without the frame cache, 1 thread.

    python benchmarks/video_pipeline.py [--quick] [--videos 20] [--frames 16] [--size 128x96]

Writes ``--videos`` synthetic videos (8 s at 8 fps, :mod:`mmrl.data.synthetic_video`) and
samples ``--frames`` frames of each (``VideoSamplingConfig(fps=frames/8, max_frames=frames)``,
resized to multiples of 28 under ``128*28*28`` pixels). Modes, each over all videos, repeated
``--repeats`` times (median):

* ``uncached, in-process``: :func:`decode_clip` (seek + decode + cv2 resize, no worker);
* ``uncached, worker``: :func:`load_video` through the timeout-guarded decode process
  (the default path: adds pickling over a pipe);
* ``cache, disk hit``: a fresh :class:`VideoFrameCache` on a filled folder (a new process);
* ``cache, memory hit``: the same cache object again (every rollout after the first).

Prints frames/s per mode and the ratio to ``uncached, worker``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmrl.data.synthetic_video import make_video_dataset  # noqa: E402
from mmrl.data.video import DecodeWorker, VideoSamplingConfig, decode_clip, load_video  # noqa: E402
from mmrl.data.video_cache import VideoFrameCache  # noqa: E402


def timed(fn, paths: list[str], repeats: int) -> float:
    """Median seconds of one pass of ``fn`` over ``paths``."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p in paths:
            fn(p)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 videos, 2 repeats")
    ap.add_argument("--videos", type=int, default=20)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", default="128x96", help="WxH of the synthetic videos")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--folder", default=None, help="where to write the videos (default: a temp dir)")
    args = ap.parse_args()
    if args.quick:
        args.videos, args.repeats = min(args.videos, 5), 2
    import cv2

    cv2.setNumThreads(1)
    width, height = (int(v) for v in args.size.lower().split("x"))
    tmp = tempfile.TemporaryDirectory(prefix="mmrl_video_bench_")
    folder = Path(args.folder) if args.folder else Path(tmp.name) / "videos"
    t0 = time.perf_counter()
    records = make_video_dataset(folder, args.videos, seed=0, size=(width, height))
    print(f"wrote/reused {len(records)} synthetic videos ({width}x{height}, 8 s @ 8 fps) in {time.perf_counter() - t0:.2f} s")
    paths = [r["video"] for r in records]
    cfg = VideoSamplingConfig(fps=args.frames / 8.0, max_frames=args.frames, min_frames=min(4, args.frames),
                              decoder_threads=1)
    in_process = VideoSamplingConfig(**{**cfg.__dict__, "decode_timeout_s": None})
    clip = decode_clip(paths[0], in_process)
    total_frames = clip.num_frames * len(paths)
    print(f"{clip.num_frames} frames/video of {clip.frames.shape[2]}x{clip.frames.shape[1]}, "
          f"{len(paths)} videos, {args.repeats} repeats, 1 thread\n")

    worker = DecodeWorker()
    load_video(paths[0], cfg, worker=worker)  # start the worker outside the timing
    cache_dir = Path(tmp.name) / "frame_cache"
    warm = VideoFrameCache(cache_dir, decoder=lambda p, c: decode_clip(p, in_process))
    for p in paths:
        warm.get_or_decode(p, cfg)
    memory = VideoFrameCache(cache_dir)
    for p in paths:
        memory.get_or_decode(p, cfg)

    def disk_pass(p: str) -> None:
        disk_pass.cache.get_or_decode(p, cfg)

    rows = [("uncached, in-process", timed(lambda p: decode_clip(p, in_process), paths, args.repeats))]
    rows.append(("uncached, worker", timed(lambda p: load_video(p, cfg, worker=worker), paths, args.repeats)))
    disk_times = []
    for _ in range(args.repeats):
        disk_pass.cache = VideoFrameCache(cache_dir)
        disk_times.append(timed(disk_pass, paths, 1))
    rows.append(("cache, disk hit", statistics.median(disk_times)))
    rows.append(("cache, memory hit", timed(lambda p: memory.get_or_decode(p, cfg), paths, args.repeats)))
    worker.close()

    base = dict(rows)["uncached, worker"]
    print(f"{'mode':<24}{'s/pass':>10}{'frames/s':>14}{'vs uncached worker':>22}")
    for name, seconds in rows:
        print(f"{name:<24}{seconds:>10.4f}{total_frames / seconds:>14.0f}{base / seconds:>21.1f}x")
    tmp.cleanup()


if __name__ == "__main__":
    main()
