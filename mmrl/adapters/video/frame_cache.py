"""Decoded-frame cache: each video is decoded once and reused by every rollout and reward.

Two levels, both keyed by :func:`frame_cache_key` (sha256 of the file identity, the
:meth:`~mmrl.adapters.video.decode.VideoSamplingConfig.frame_fields` and a format version):

* an in-memory LRU of :class:`~mmrl.adapters.video.decode.VideoClip` objects (read-only frames, shared);
* an on-disk, content-addressed store ``<cache_dir>/<key[:2]>/<key>.npy`` (frames) +
  ``<key>.json`` (clip info and a blake2b checksum of the ``.npy`` bytes). Both files are
  written to a temporary name and ``os.replace``-d into place, so a crash never leaves a
  half-written entry that later loads; an entry whose files are unreadable, mismatched or
  fail the checksum is deleted, counted in ``stats.corrupt`` and rebuilt.

Failures (:class:`~mmrl.adapters.video.decode.VideoError`) are remembered in memory only, so a bad or
hanging video costs one attempt per process, not one per rollout. The file identity is
``(absolute path, size, mtime_ns)`` by default (editing the file changes the key); with
``identity="content"`` it is ``(size, sha256 of the first and last MiB)``, so copies of a
dataset in other folders share entries.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import numpy as np

from mmrl.adapters.video.decode import VideoClip, VideoError, VideoSamplingConfig, load_video

__all__ = [
    "CACHE_FORMAT_VERSION",
    "default_frame_cache_dir",
    "file_identity",
    "frame_cache_key",
    "CacheStats",
    "VideoFrameCache",
    "frame_cache_for",
    "get_or_decode",
]

CACHE_FORMAT_VERSION = 1
"""Part of every key: bump it when the decoding or the stored format changes."""

_EDGE_BYTES = 1 << 20  # content identity hashes the first and last MiB


def default_frame_cache_dir() -> Path:
    """``$MMRL_CACHE/video_frames`` if ``MMRL_CACHE`` is set, else ``~/.cache/mmrl/video_frames``."""
    root = os.environ.get("MMRL_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "mmrl") / "video_frames"


def file_identity(path: str | Path, mode: Literal["stat", "content"] = "stat") -> dict:
    """What identifies the file's bytes: ``stat`` = absolute path + size + mtime_ns;
    ``content`` = size + sha256 of its first and last MiB.

    Raises:
        VideoError: the file is missing or not a regular file.
    """
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        raise VideoError(path, "file not found") from None
    if not path.is_file():
        raise VideoError(path, "not a regular file")
    if mode == "stat":
        return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if mode != "content":
        raise ValueError(f"file_identity: mode must be 'stat' or 'content', got {mode!r}")
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        digest.update(fh.read(_EDGE_BYTES))
        if st.st_size > _EDGE_BYTES:
            fh.seek(max(_EDGE_BYTES, st.st_size - _EDGE_BYTES))
            digest.update(fh.read(_EDGE_BYTES))
    return {"size": st.st_size, "edges_sha256": digest.hexdigest()}


def frame_cache_key(identity: dict, cfg: VideoSamplingConfig) -> str:
    """sha256 hex of the file identity, the frame-changing config fields and the format version."""
    payload = {"version": CACHE_FORMAT_VERSION, "file": identity, "sampling": cfg.frame_fields()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class CacheStats:
    """Counters of one :class:`VideoFrameCache`."""

    memory_hits: int = 0
    """Requests answered from the in-memory LRU."""
    disk_hits: int = 0
    """Requests answered from disk."""
    decodes: int = 0
    """Calls to the decoder (misses)."""
    failures: int = 0
    """Decodes that raised VideoError."""
    error_hits: int = 0
    """Requests answered by re-raising a remembered failure."""
    corrupt: int = 0
    """Disk entries found unreadable and deleted."""
    write_errors: int = 0
    """Disk entries that could not be written (the clip is still returned)."""


def _atomic_write(target: Path, write: Callable[[object], None]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class VideoFrameCache:
    """Memory LRU + optional disk store in front of a decoder (default :func:`load_video`).

    Args:
        cache_dir: disk store folder; ``None`` or ``""`` keeps the cache in memory only.
        memory_items / memory_bytes: LRU limits (items and total frame bytes).
        identity: ``"stat"`` or ``"content"`` (see :func:`file_identity`).
        decoder: ``fn(path, cfg) -> VideoClip``; tests pass a counting wrapper.
        remember_errors: re-raise a video's VideoError without decoding it again.
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        *,
        memory_items: int = 64,
        memory_bytes: int = 1 << 30,
        identity: Literal["stat", "content"] = "stat",
        decoder: Callable[[Path, VideoSamplingConfig], VideoClip] | None = None,
        remember_errors: bool = True,
    ) -> None:
        if memory_items < 0 or memory_bytes < 0:
            raise ValueError("VideoFrameCache: memory_items and memory_bytes must be >= 0")
        if identity not in ("stat", "content"):
            raise ValueError(f"VideoFrameCache: identity must be 'stat' or 'content', got {identity!r}")
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.memory_items = memory_items
        self.memory_bytes = memory_bytes
        self.identity = identity
        self.decoder = decoder or load_video
        self.remember_errors = remember_errors
        self.stats = CacheStats()
        self._memory: OrderedDict[str, VideoClip] = OrderedDict()
        self._memory_used = 0
        self._errors: OrderedDict[str, VideoError] = OrderedDict()
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- keys and paths

    def key(self, path: str | Path, cfg: VideoSamplingConfig) -> str:
        """The cache key of ``path`` decoded with ``cfg``."""
        return frame_cache_key(file_identity(path, self.identity), cfg)

    def entry_paths(self, key: str) -> tuple[Path, Path]:
        """``(frames .npy, info .json)`` of ``key`` on disk."""
        if self.cache_dir is None:
            raise ValueError("VideoFrameCache: no cache_dir (memory-only cache)")
        folder = self.cache_dir / key[:2]
        return folder / f"{key}.npy", folder / f"{key}.json"

    # ----------------------------------------------------------------- memory LRU

    def _remember(self, key: str, clip: VideoClip) -> None:
        if self.memory_items == 0:
            return
        size = clip.frames.nbytes
        if size > self.memory_bytes:
            return
        old = self._memory.pop(key, None)
        if old is not None:
            self._memory_used -= old.frames.nbytes
        self._memory[key] = clip
        self._memory_used += size
        while len(self._memory) > self.memory_items or self._memory_used > self.memory_bytes:
            _, evicted = self._memory.popitem(last=False)
            self._memory_used -= evicted.frames.nbytes

    def clear_memory(self) -> None:
        """Forget the in-memory clips and remembered failures (the disk store stays)."""
        with self._lock:
            self._memory.clear()
            self._memory_used = 0
            self._errors.clear()

    # ----------------------------------------------------------------- disk store

    def _load_disk(self, key: str, path: Path) -> VideoClip | None:
        npy, meta = self.entry_paths(key)
        if not (npy.exists() and meta.exists()):
            return None
        try:
            info = json.loads(meta.read_text())
            raw = npy.read_bytes()
            if hashlib.blake2b(raw, digest_size=16).hexdigest() != info["npy_blake2b"]:
                raise ValueError("checksum mismatch")
            frames = np.load(io.BytesIO(raw), allow_pickle=False)
            if list(frames.shape) != info["frame_shape"] or frames.dtype != np.uint8:
                raise ValueError(f"frames {frames.shape}/{frames.dtype} do not match {info['frame_shape']}")
            frames.setflags(write=False)
            clip = VideoClip.from_info(info, frames)
        except Exception:  # any unreadable / mismatched entry is rebuilt
            self.stats.corrupt += 1
            for p in (npy, meta):
                try:
                    p.unlink()
                except OSError:
                    pass
            return None
        clip.path = str(path)  # the same bytes may live under another name (content identity)
        return clip

    def _store_disk(self, key: str, clip: VideoClip) -> None:
        npy, meta = self.entry_paths(key)
        try:
            npy.parent.mkdir(parents=True, exist_ok=True)
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(clip.frames), allow_pickle=False)
            raw = buf.getvalue()
            _atomic_write(npy, lambda fh: fh.write(raw))
            info = clip.info()
            info["npy_blake2b"] = hashlib.blake2b(raw, digest_size=16).hexdigest()
            info["format_version"] = CACHE_FORMAT_VERSION
            _atomic_write(meta, lambda fh: fh.write(json.dumps(info).encode()))
        except OSError:
            self.stats.write_errors += 1

    # ----------------------------------------------------------------- main entry

    def get_or_decode(self, path: str | Path, cfg: VideoSamplingConfig) -> VideoClip:
        """The clip of ``path`` under ``cfg``: from memory, else disk, else decoded (and stored).

        Raises:
            VideoError: as :func:`~mmrl.adapters.video.decode.load_video` (remembered: asking again for
                the same file and config re-raises without decoding).
            VideoReaderUnavailable: the reader library is missing (never remembered).
        """
        path = Path(path)
        key = self.key(path, cfg)
        with self._lock:
            clip = self._memory.get(key)
            if clip is not None:
                self._memory.move_to_end(key)
                self.stats.memory_hits += 1
                return clip
            error = self._errors.get(key)
            if error is not None:
                self.stats.error_hits += 1
                raise error
            if self.cache_dir is not None:
                clip = self._load_disk(key, path)
                if clip is not None:
                    self.stats.disk_hits += 1
                    self._remember(key, clip)
                    return clip
            self.stats.decodes += 1
            try:
                clip = self.decoder(path, cfg)
            except VideoError as exc:
                self.stats.failures += 1
                if self.remember_errors:
                    self._errors[key] = exc
                    while len(self._errors) > 4096:
                        self._errors.popitem(last=False)
                raise
            if self.cache_dir is not None:
                self._store_disk(key, clip)
            self._remember(key, clip)
            return clip


_CACHES: dict[str, VideoFrameCache] = {}
_CACHES_LOCK = threading.Lock()


def frame_cache_for(cfg: VideoSamplingConfig) -> VideoFrameCache:
    """The process-wide cache for ``cfg.cache_dir`` (None: :func:`default_frame_cache_dir`;
    "": memory only). One instance per folder, shared by all callers in this process."""
    folder = (
        ""
        if cfg.cache_dir == ""
        else str(Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_frame_cache_dir())
    )
    with _CACHES_LOCK:
        cache = _CACHES.get(folder)
        if cache is None:
            cache = _CACHES[folder] = VideoFrameCache(folder or None)
        return cache


def get_or_decode(path: str | Path, cfg: VideoSamplingConfig | None = None) -> VideoClip:
    """Cached :func:`~mmrl.adapters.video.decode.load_video`: what tasks, rollouts and rewards call."""
    cfg = cfg if cfg is not None else VideoSamplingConfig()
    return frame_cache_for(cfg).get_or_decode(path, cfg)
