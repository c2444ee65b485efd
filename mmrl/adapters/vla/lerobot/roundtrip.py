"""Round trip mmrl -> LeRobot: load a LeRobot fixture (SmolVLA, π0 or π0.5), take one training step, save it in
LeRobot's layout.

    python -m mmrl.adapters.vla.lerobot.roundtrip OUT [--variant smolvla_tiny|smolvla_tiny_skip|pi0_tiny|pi05_tiny]
    python -m mmrl.adapters.vla.lerobot.roundtrip OUT --fixture path/to/fixture
    python -m mmrl.adapters.vla.lerobot.roundtrip OUT --variant pi0_tiny --lora 4

writes OUT (a LeRobot policy folder, ``load_policy`` / ``save_policy`` by config.json's type) and
``OUT/mmrl_outputs.safetensors``: mmrl's action chunk of the saved policy on the fixture's fixed inputs and noise.
Then, in the LeRobot reference environment,

    /work/lerobot-venv/bin/python scripts/lerobot_fixtures.py --roundtrip OUT [--variant <the same variant>]

loads OUT with LeRobot's ``from_pretrained`` and compares its actions with mmrl's. The step is one Adam step on
the flow-matching loss of the fixture's fixed (actions, noise, time) over all weights (the RL objective's
gradient flows through the same modules; this checks that every trained weight is saved where LeRobot reads it).
With ``--lora R`` the step trains LoRA adapters of rank R (alpha 2R) and the projections instead
(:mod:`~mmrl.adapters.vla.lerobot.lora`); the folder holds the merged weights, mmrl's outputs are those of the folder
as mmrl reloads it, and the script prints how far the merge moved the actions from the LoRA model's (float rounding
of ``W x + s B A x`` against ``(W + s B A) x``, through K Euler steps).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

__all__ = ["main", "train_step_and_save"]

FIXTURES = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "lerobot"
VARIANTS = ("smolvla_tiny", "smolvla_tiny_skip", "pi0_tiny", "pi05_tiny")
"""The committed fixtures (``scripts/lerobot_fixtures.py``'s variants)."""
DEFAULT_FIXTURE = FIXTURES / VARIANTS[0]


def _fixture_inputs(fixture: Path) -> dict:
    from safetensors.torch import load_file

    ref = load_file(str(fixture / "reference.safetensors"))
    meta = json.loads((fixture / "reference.json").read_text())
    ref["tasks"], ref["cameras"] = meta["tasks"], meta["cameras"]
    return ref


def train_step_and_save(fixture: Path, out: Path, lr: float = 1e-3, lora_r: int = 0) -> dict[str, float]:
    """Load ``fixture``, take one Adam step on its fixed flow loss (``lora_r`` > 0: on LoRA adapters of that rank and
    the projections), save to ``out``; return summary numbers."""
    from safetensors.torch import save_file

    from mmrl.adapters.vla.lerobot.checkpoint import load_policy, save_policy

    ref = _fixture_inputs(fixture)
    images = {key: ref[key] for key in ref["cameras"]}
    state, tasks = ref["observation.state"], ref["tasks"]
    pipe = load_policy(fixture)
    before = pipe.predict_action_chunk(images, state, tasks, ref["noise"])
    if lora_r:
        from mmrl.adapters.vla.lerobot.lora import add_lora
        from mmrl.models.configs import LoraConfig

        add_lora(pipe.model, LoraConfig(r=lora_r, alpha=2 * lora_r))
    pipe.train()
    optim = torch.optim.Adam([w for w in pipe.model.parameters() if w.requires_grad], lr=lr)
    loss = pipe.flow_loss(images, state, tasks, ref["train_actions"], ref["train_noise"], ref["train_time"])
    loss.backward()
    optim.step()
    pipe.eval()
    save_policy(pipe, out)
    trained = pipe.predict_action_chunk(images, state, tasks, ref["noise"])
    summary = {"loss_before_step": loss.item(), "action_change": (trained - before).abs().max().item()}
    if lora_r:  # mmrl's outputs of the saved (merged) folder, and how far the merge moved them
        pipe = load_policy(out)
        merged = pipe.predict_action_chunk(images, state, tasks, ref["noise"])
        summary["merge_gap"] = (merged - trained).abs().max().item()
    after = pipe.predict_action_chunk(images, state, tasks, ref["noise"])
    after_model = pipe.predict_action_chunk(images, state, tasks, ref["noise"], unnormalize=False)
    save_file(
        {"action_chunk": after.contiguous(), "action_chunk_normalized": after_model.contiguous()},
        str(out / "mmrl_outputs.safetensors"),
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="mmrl -> LeRobot round trip of a LeRobot fixture")
    parser.add_argument("out", type=Path, help="folder to write the trained policy to (LeRobot layout)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--variant", choices=VARIANTS, help=f"a committed fixture under {FIXTURES} (default smolvla_tiny)"
    )
    source.add_argument("--fixture", type=Path, help="a fixture folder (config.json, ..., reference.safetensors)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--lora", type=int, default=0, metavar="R", help="train LoRA adapters of rank R (0: every weight)"
    )
    args = parser.parse_args(argv)
    fixture = args.fixture or (FIXTURES / args.variant if args.variant else DEFAULT_FIXTURE)
    torch.manual_seed(0)
    summary = train_step_and_save(fixture, args.out, args.lr, args.lora)
    loss, moved = summary["loss_before_step"], summary["action_change"]
    print(f"saved {args.out}: loss before the step {loss:.6f}, actions moved by up to {moved:.4f}")
    if "merge_gap" in summary:
        print(f"the merged weights' actions differ from the LoRA model's by up to {summary['merge_gap']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
