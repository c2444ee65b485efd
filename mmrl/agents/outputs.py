"""Evaluation outputs of multi-turn agents: every trajectory's turns, tool calls and observation images on disk.

Inside :meth:`mmrl.agents.policy.AgentVLMPolicy.evaluation_outputs` each sample keeps its observations' images
(``observation_images``: per turn, the images its tool results added, e.g. zoom crops). :func:`write_trajectories`
writes ``trajectories.jsonl`` (one row per trajectory: id, prompt, turns with text, tool calls, errors, observation
text and the file names of the turn's images) and the images as PNG under ``trajectories/``, next to
``predictions.jsonl`` when ``mmrl eval`` gives the task its folder (``Task.output_dir``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _plain(value):
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return str(value)


def write_trajectories(folder: str | Path, items: Sequence[dict], samples: Sequence[dict]) -> Path:
    """Write ``folder/trajectories.jsonl`` and ``folder/trajectories/<id>_s<k>_t<turn>_<n>.png``; ``items[i]`` is the
    item of ``samples[i]``. Returns the JSONL path."""
    folder = Path(folder)
    images_dir = folder / "trajectories"
    images_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    seen: dict[str, int] = {}
    for item, sample in zip(items, samples):
        key = _UNSAFE.sub("_", str(item.get("id", len(rows))))
        k = seen[key] = seen.get(key, -1) + 1
        per_turn = sample.get("observation_images") or []
        turns = []
        for t, turn in enumerate(sample.get("turns", [])):
            files = []
            for n, image in enumerate(per_turn[t] if t < len(per_turn) else []):
                name = f"{key}_s{k}_t{t}_{n}.png"
                image.save(images_dir / name)
                files.append(f"trajectories/{name}")
            turns.append({**{kk: _plain(v) for kk, v in turn.items()}, "images": files})
        rows.append(
            {
                "id": _plain(item.get("id")),
                "sample": k,
                "prompt": item.get("prompt"),
                "turns": turns,
                "finished": bool(sample.get("finished")),
                "over_turn": bool(sample.get("over_turn")),
                "over_budget": bool(sample.get("over_budget")),
            }
        )
    path = folder / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
