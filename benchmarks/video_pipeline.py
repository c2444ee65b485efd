"""Video input throughput: decode + resize with and without the frame cache, 1 thread.

    python benchmarks/video_pipeline.py [--quick] [--videos 20] [--frames 16] [--size 128x96] [--repeats 5]

Writes ``--videos`` synthetic videos (8 s at 8 fps, :mod:`mmrl.adapters.video.synthetic`) and
samples ``--frames`` frames of each (``VideoSamplingConfig(fps=frames/8, max_frames=frames)``,
resized to multiples of 28 under ``128*28*28`` pixels). The disk cache is filled once before
the timing. Sides, each timed as one pass over all videos:

* ``uncached, in-process``: :func:`decode_clip` (seek + decode + cv2 resize, no worker) in
  this process. The mp4 files were just written and read, so they come from a warm page cache.
* ``uncached, worker``: :func:`load_video` through the timeout-guarded decode process
  (the default path: adds pickling over a pipe); the worker is started before the timing.
  Same warm mp4 files.
* ``cache, disk hit, cold``: a fresh :class:`VideoFrameCache` on the filled folder in a **new
  Python process** (``sys.executable`` running this script with ``--_disk_child``), so no
  in-memory clip of this process is reused. Before each start the cache's ``.npy``/``.json``
  files are fsynced and their pages dropped from the OS page cache with
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` (only those files); if pages are still resident
  afterwards and ``/proc/sys/vm/drop_caches`` is writable, ``echo 1`` there (all clean page
  cache of the machine) is the fallback. The child counts the resident bytes of those files
  with ``mincore(2)`` just before its timed pass; the row is labelled ``cold page cache
  (<method>)`` when none were resident and ``warm page cache (could not drop)`` otherwise.
  "Cold" is this kernel's page cache only: the storage below it (a VM host, a disk's own cache)
  may still hold the blocks, so this is not a guaranteed read from the physical medium.
  The timed pass covers key computation (a ``stat`` of each mp4), reading ``.npy`` + ``.json``,
  the blake2b check and ``np.load``; interpreter start-up and imports are not timed. The child's
  decoder raises, and the child checks that every video was a disk hit.
* ``cache, disk hit, warm``: the same in a new process, without dropping pages (the files are
  in the page cache from the previous reads: the usual case right after a cache was written
  or read); the child's resident-byte count is printed too.
* ``cache, memory hit``: one cache object of this process that already holds every clip
  (every rollout after the first).

The sides are interleaved: each of ``--repeats`` (>= 3) rounds runs every side once, in an
order rotated by one per round. Prints per side the median seconds per pass with the spread
(min-max) over rounds, frames/s at the median, and the median (min-max) of the per-round
ratios ``uncached worker seconds / side seconds``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _stats import spread  # noqa: E402

from mmrl.adapters.video.decode import VideoSamplingConfig  # noqa: E402
from mmrl.adapters.video.frame_cache import VideoFrameCache  # noqa: E402

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


# --------------------------------------------------------------------------- page cache


def resident_bytes(files: list[Path]) -> tuple[int, int] | None:
    """(bytes of ``files`` resident in the page cache, total bytes) via ``mincore(2)``;
    None where it cannot be asked (no libc mmap/mincore). Maps without touching any page."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        c_mmap, c_munmap, c_mincore = libc.mmap, libc.munmap, libc.mincore
    except (OSError, AttributeError):
        return None
    c_mmap.restype = ctypes.c_void_p
    c_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    c_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    c_mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    resident = total = 0
    for f in files:
        size = f.stat().st_size
        total += size
        if size == 0:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            addr = c_mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                pages = (size + page - 1) // page
                vec = (ctypes.c_ubyte * pages)()
                if c_mincore(addr, size, vec) != 0:
                    return None
                resident += sum(min(page, size - i * page) for i, v in enumerate(vec) if v & 1)
            finally:
                c_munmap(addr, size)
        finally:
            os.close(fd)
    return resident, total


def drop_page_cache(files: list[Path]) -> str:
    """Drop the pages of ``files`` from the OS page cache; returns the method(s) applied.

    ``posix_fadvise(DONTNEED)`` on each file after an ``fsync`` (dirty pages are not dropped);
    only if :func:`resident_bytes` still counts resident bytes afterwards, and
    ``/proc/sys/vm/drop_caches`` is writable, ``echo 1`` there (all clean page cache)."""
    methods = []
    if hasattr(os, "posix_fadvise"):
        failed = 0
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                failed += 1
            finally:
                os.close(fd)
        methods.append("posix_fadvise DONTNEED" + (f" (failed on {failed} files)" if failed else ""))
        res = resident_bytes(files)
        if res is None or res[0] == 0:
            return methods[0]
    if os.access(DROP_CACHES, os.W_OK):
        try:
            os.sync()
            DROP_CACHES.write_text("1\n")
            methods.append("echo 1 > /proc/sys/vm/drop_caches")
        except OSError as exc:
            methods.append(f"echo 1 > /proc/sys/vm/drop_caches failed: {exc.strerror}")
    return " + ".join(methods) or "no method available"


# --------------------------------------------------------------------------- disk-hit child


def disk_child(spec_file: str) -> None:
    """Runs in a new process: one timed pass of disk hits over the videos; prints JSON."""
    spec = json.loads(Path(spec_file).read_text())
    cfg = VideoSamplingConfig(**spec["cfg"])
    files = [Path(f) for f in spec["cache_files"]]

    def no_decode(path, c):
        raise RuntimeError(f"disk-hit child would decode {path}: the cache entry is missing")

    cache = VideoFrameCache(spec["cache_dir"], decoder=no_decode)
    res = resident_bytes(files)  # just before the timed pass
    t0 = time.perf_counter()
    for p in spec["paths"]:
        cache.get_or_decode(p, cfg)
    seconds = time.perf_counter() - t0
    s = cache.stats
    if s.disk_hits != len(spec["paths"]) or s.decodes or s.memory_hits or s.corrupt:
        raise SystemExit(f"disk-hit child: expected {len(spec['paths'])} disk hits, got {s}")
    print(json.dumps({"seconds": seconds, "resident": res}))


def run_disk_child(spec_file: Path) -> dict:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--_disk_child", str(spec_file)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- main


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 videos, 3 repeats")
    ap.add_argument("--videos", type=int, default=20)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", default="128x96", help="WxH of the synthetic videos")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds (>= 3)")
    ap.add_argument("--folder", default=None, help="where to write the videos (default: a temp dir)")
    ap.add_argument("--_disk_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._disk_child:
        disk_child(args._disk_child)
        return
    if args.quick:
        args.videos, args.repeats = min(args.videos, 5), 3
    if args.repeats < 3:
        ap.error("--repeats must be >= 3")
    import cv2

    from mmrl.adapters.video.decode import DecodeWorker, decode_clip, load_video
    from mmrl.adapters.video.synthetic import make_video_dataset

    cv2.setNumThreads(1)
    width, height = (int(v) for v in args.size.lower().split("x"))
    tmp = tempfile.TemporaryDirectory(prefix="mmrl_video_bench_")
    folder = Path(args.folder) if args.folder else Path(tmp.name) / "videos"
    t0 = time.perf_counter()
    records = make_video_dataset(folder, args.videos, seed=0, size=(width, height))
    print(
        f"wrote/reused {len(records)} synthetic videos ({width}x{height}, 8 s @ 8 fps) in {time.perf_counter() - t0:.2f} s"
    )
    paths = [r["video"] for r in records]
    cfg = VideoSamplingConfig(
        fps=args.frames / 8.0, max_frames=args.frames, min_frames=min(4, args.frames), decoder_threads=1
    )
    in_process = VideoSamplingConfig(**{**cfg.__dict__, "decode_timeout_s": None})
    clip = decode_clip(paths[0], in_process)
    total_frames = clip.num_frames * len(paths)
    print(
        f"{clip.num_frames} frames/video of {clip.frames.shape[2]}x{clip.frames.shape[1]}, "
        f"{len(paths)} videos, {args.repeats} interleaved rounds, 1 thread"
    )

    worker = DecodeWorker()
    load_video(paths[0], cfg, worker=worker)  # start the worker outside the timing
    cache_dir = Path(tmp.name) / "frame_cache"
    fill = VideoFrameCache(cache_dir, decoder=lambda p, c: decode_clip(p, in_process))
    for p in paths:
        fill.get_or_decode(p, cfg)
    if fill.stats.decodes != len(paths):
        raise SystemExit(f"the cache fill decoded {fill.stats.decodes} of {len(paths)} videos")
    memory = VideoFrameCache(cache_dir)
    for p in paths:
        memory.get_or_decode(p, cfg)
    cache_files = sorted(f for f in cache_dir.rglob("*") if f.is_file())
    spec_file = Path(tmp.name) / "disk_child.json"
    spec_file.write_text(
        json.dumps(
            {
                "cfg": cfg.__dict__,
                "cache_dir": str(cache_dir),
                "paths": paths,
                "cache_files": [str(f) for f in cache_files],
            }
        )
    )
    print(f"disk cache: {len(cache_files)} files, {_mib(sum(f.stat().st_size for f in cache_files))}\n")

    def timed(fn) -> float:
        t = time.perf_counter()
        for p in paths:
            fn(p)
        return time.perf_counter() - t

    drops: list[str] = []
    resident: dict[str, list] = {"cache, disk hit, cold": [], "cache, disk hit, warm": []}

    def disk_cold() -> float:
        drops.append(drop_page_cache(cache_files))
        r = run_disk_child(spec_file)
        resident["cache, disk hit, cold"].append(r["resident"])
        return r["seconds"]

    def disk_warm() -> float:
        r = run_disk_child(spec_file)
        resident["cache, disk hit, warm"].append(r["resident"])
        return r["seconds"]

    sides = [
        ("uncached, in-process", lambda: timed(lambda p: decode_clip(p, in_process))),
        ("uncached, worker", lambda: timed(lambda p: load_video(p, cfg, worker=worker))),
        ("cache, disk hit, cold", disk_cold),
        ("cache, disk hit, warm", disk_warm),
        ("cache, memory hit", lambda: timed(lambda p: memory.get_or_decode(p, cfg))),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    for r in range(args.repeats):
        for name, fn in sides[r % len(sides) :] + sides[: r % len(sides)]:
            times[name].append(fn())
    worker.close()

    def page_note(name: str) -> str:
        res = resident.get(name)
        if not res:
            return ""
        if any(x is None for x in res):
            counted = None
        else:
            counted = "resident at start " + ", ".join(_mib(x[0]) for x in res) + f" of {_mib(res[0][1])}"
        if name.endswith("warm"):
            return f"warm page cache (not dropped; {counted or 'resident bytes not counted: no mincore'})"
        methods = "; ".join(sorted(set(drops)))
        if counted is None:
            return f"page cache dropped with {methods}, not verified (no mincore)"
        if all(x[0] == 0 for x in res):
            return f"cold page cache ({methods}; {counted})"
        return f"warm page cache (could not drop: tried {methods}; {counted})"

    base = times["uncached, worker"]
    print("median [min-max] over rounds")
    print(f"{'side':<24}{'s/pass':>26}{'frames/s':>10}{'vs uncached worker':>26}")
    for name, _ in sides:
        ratios = [b / t for b, t in zip(base, times[name])]
        print(
            f"{name:<24}{spread(times[name], fmt='{:.4f}'):>26}{total_frames / statistics.median(times[name]):>10.0f}"
            f"{spread(ratios, fmt='{:.1f}') + 'x':>26}"
        )
        note = page_note(name)
        if note:
            print(f"{'':<4}{note}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
