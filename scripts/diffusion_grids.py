"""Before / after sample grids of a diffusion RL run, labelled with each prompt and its reward.

    python scripts/diffusion_grids.py RUN_DIR [--out docs/images] [--name t2i_color] [--prompts 12]
                                      [--cols 4] [--scale 4] [--checkpoint CKPT_DIR]

RUN_DIR is a run directory written by the trainer (``config.yaml`` + ``checkpoints/``). The script
rebuilds the policy exactly as the trainer did (same config, same seed, so the LoRA starts as the
identity: "before" is the model RL started from), draws one deterministic sample per eval prompt with
:func:`mmrl.tasks.diffusion.t2i_color.save_sample_grid`, then loads the run's last checkpoint (or
``--checkpoint``) and draws the same prompts from the same seeds ("after"). Each tile is enlarged
``--scale`` times and captioned with its prompt and the task's reward for it; the grids are written to
``OUT/NAME_before.png`` and ``OUT/NAME_after.png`` and the per-tile rewards printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

CAPTION_LINE_PX = 11  # height of one caption line (PIL's default bitmap font is 11 px tall)


def short_caption(prompt: str) -> list[str]:
    """Caption lines for a tile: ``"a red circle on a blue background"`` -> ``["red circle", "on blue"]``.

    Prompts of another form are split at the middle word boundary into two lines.
    """
    m = re.fullmatch(r"an? (.+?) on an? (\w+) background", prompt.strip())
    if m:
        return [m.group(1), f"on {m.group(2)}"]
    words = prompt.split()
    if len(words) < 2:
        return [prompt]
    half = math.ceil(len(words) / 2)
    return [" ".join(words[:half]), " ".join(words[half:])]


def split_grid(grid: Any, tile: int, count: int, cols: int) -> list[Any]:
    """The first ``count`` ``tile`` x ``tile`` tiles of a grid image, row by row, ``cols`` per row."""
    if grid.width < cols * tile or grid.height < math.ceil(count / cols) * tile:
        raise ValueError(f"a {grid.width}x{grid.height} grid cannot hold {count} tiles of {tile} px in {cols} columns")
    return [
        grid.crop(((k % cols) * tile, (k // cols) * tile, (k % cols + 1) * tile, (k // cols + 1) * tile))
        for k in range(count)
    ]


def labelled_grid(tiles: Sequence[Any], captions: Sequence[Sequence[str]], cols: int, scale: int) -> Any:
    """Tiles enlarged ``scale`` times (nearest neighbour) with their caption lines below each, as one image."""
    from PIL import Image, ImageDraw

    if len(tiles) != len(captions) or not tiles:
        raise ValueError(f"need one caption per tile, got {len(tiles)} tiles and {len(captions)} captions")
    if cols < 1 or scale < 1:
        raise ValueError(f"cols and scale must be >= 1, got cols={cols} scale={scale}")
    w, h = tiles[0].size[0] * scale, tiles[0].size[1] * scale
    lines = max(len(c) for c in captions)
    cell_h = h + lines * CAPTION_LINE_PX + 4
    rows = math.ceil(len(tiles) / cols)
    out = Image.new("RGB", (cols * w, rows * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(out)
    for k, (tile, cap) in enumerate(zip(tiles, captions)):
        x, y = (k % cols) * w, (k // cols) * cell_h
        out.paste(tile.convert("RGB").resize((w, h), Image.NEAREST), (x, y))
        for j, text in enumerate(cap):
            draw.text((x + 2, y + h + 2 + j * CAPTION_LINE_PX), text, fill=(0, 0, 0))
    return out


def tile_rewards(task: Any, items: list[dict], tiles: list[Any]) -> list[float]:
    """The task's total reward of each tile (as the trainer scores a sample)."""
    from mmrl.rewards.manager import RewardManager

    samples = [{"image": t, "prompt": it["prompt"], "valid": True} for t, it in zip(tiles, items)]
    res = RewardManager(task.reward_specs())([it["prompt"] for it in items], samples, task.reward_columns(items))
    return [float(v) for v in res.total]


def render(policy: Any, task: Any, items: list[dict], path: Path, *, cols: int, scale: int) -> list[float]:
    """Sample the items' prompts, write the labelled grid to ``path`` and return the per-tile rewards."""
    from PIL import Image

    from mmrl.tasks.diffusion.t2i_color import save_sample_grid

    prompts = [it["prompt"] for it in items]
    with tempfile.TemporaryDirectory() as tmp:
        raw = save_sample_grid(policy, prompts, Path(tmp) / "grid.png", cols=cols)
        grid = Image.open(raw).convert("RGB")
    tiles = split_grid(grid, policy.backend.height, len(prompts), cols)
    rewards = tile_rewards(task, items, tiles)
    captions = [[*short_caption(p), f"reward {r:.2f}"] for p, r in zip(prompts, rewards)]
    path.parent.mkdir(parents=True, exist_ok=True)
    labelled_grid(tiles, captions, cols, scale).save(path)
    return rewards


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "images")
    ap.add_argument("--name", default=None, help="file prefix (default: the run's task name)")
    ap.add_argument("--prompts", type=int, default=12, help="eval prompts to draw")
    ap.add_argument("--cols", type=int, default=4)
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint dir (default: the run's last)")
    args = ap.parse_args(argv)

    import torch

    from mmrl.checkpoint_files import latest_checkpoint
    from mmrl.config import load_saved_config
    from mmrl.models.registry import policy_builder
    from mmrl.tasks import get_task_class

    torch.set_num_threads(1)
    cfg = load_saved_config(args.run_dir / "config.yaml")
    if cfg.model.type != "diffusion":
        raise SystemExit(f"{args.run_dir}: model.type is {cfg.model.type!r}, not a diffusion run")
    ckpt = args.checkpoint or latest_checkpoint(args.run_dir)
    if ckpt is None:
        raise SystemExit(f"{args.run_dir}: no checkpoint found (train first, or pass --checkpoint)")
    task = get_task_class(cfg.task.name)(cfg.task, cfg)
    policy = policy_builder(cfg.model.type)(cfg, task)  # as the trainer builds it: LoRA B = 0, the start model
    items = list(task.eval_items())[: args.prompts]
    name = args.name or cfg.task.name
    before = render(policy, task, items, args.out / f"{name}_before.png", cols=args.cols, scale=args.scale)
    policy.load_pretrained(Path(ckpt) / "pretrained_model")
    after = render(policy, task, items, args.out / f"{name}_after.png", cols=args.cols, scale=args.scale)
    summary = {
        "run_dir": str(args.run_dir),
        "checkpoint": str(ckpt),
        "prompts": [it["prompt"] for it in items],
        "reward_before": before,
        "reward_after": after,
        "mean_before": sum(before) / len(before),
        "mean_after": sum(after) / len(after),
        "images": [str(args.out / f"{name}_before.png"), str(args.out / f"{name}_after.png")],
    }
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
