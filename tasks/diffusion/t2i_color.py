"""`task=t2i_color`: text-to-image RL on "a red circle on a blue background" with a colour-rule reward.

Prompts are colours x shapes x background colours. The tiny offline pipeline (random weights) is first
**pre-trained on the fly** on synthetic renderings of those prompts — the VAE as an autoencoder, then
the denoiser by flow matching (SD3 / Flux) or epsilon-prediction (SD-UNet) — for a few hundred steps,
cached on disk under a hash of everything that defines it (``MMRL_CACHE``). That gives a model with
partial prompt adherence; RL with :func:`mmrl.adapters.diffusion.image_rewards.color_rule_reward` then raises it.
Pre-training takes about 1-2 minutes on one CPU thread (tiny_sd3, defaults) and is done once.

``save_sample_grid(policy, prompts, path)`` writes a PNG grid of deterministic samples (before /
after training, from a notebook or script).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from mmrl.policies.base import PolicySpec
from mmrl.rewards.manager import RewardSpec
from mmrl.tasks.base import Task, TaskConfigBase

log = logging.getLogger(__name__)

PRETRAIN_VERSION = 1


@dataclass
class T2IColorConfig(TaskConfigBase):
    """Coloured-shape prompts, the synthetic pre-training of the tiny model, and the reward."""

    name: str = "t2i_color"
    """Task selector."""
    colors: list[str] = field(default_factory=lambda: ["red", "green", "blue", "yellow"])
    """Object colours (names of mmrl.adapters.grounding.synthetic_scenes.PALETTE)."""
    shapes: list[str] = field(default_factory=lambda: ["circle", "square", "triangle"])
    """Shapes drawn in the centre."""
    backgrounds: list[str] = field(default_factory=lambda: ["red", "green", "blue", "yellow"])
    """Background colours (a prompt never uses the same colour for object and background)."""
    eval_size: int = 12
    """Prompts in the evaluation set (a fixed, evenly spread subset of all prompts)."""
    pretrain_steps: int = 300
    """Denoiser pre-training steps on synthetic images (0 keeps the model as it is, e.g. a real one)."""
    pretrain_vae_steps: int = 300
    """VAE autoencoder pre-training steps before the denoiser's (tiny models have a random VAE)."""
    pretrain_batch: int = 32
    """Images per pre-training step."""
    pretrain_lr: float = 2e-3
    """Adam learning rate of both pre-training phases."""
    pretrain_seed: int = 0
    """Seed of the synthetic images and the pre-training noise."""
    color_tolerance: float = 60.0
    """RGB distance under which a pixel counts as the named colour."""

    def validate(self) -> None:
        from mmrl.adapters.grounding.synthetic_scenes import PALETTE
        from mmrl.errors import ConfigError

        bad = [c for c in [*self.colors, *self.backgrounds] if c not in PALETTE]
        if bad:
            raise ConfigError(f"task.colors/backgrounds: unknown colours {bad}; known: {', '.join(PALETTE)}")
        bad_shapes = [s for s in self.shapes if s not in ("circle", "square", "triangle")]
        if bad_shapes or not self.shapes:
            raise ConfigError(f"task.shapes: unsupported {bad_shapes}; use circle, square, triangle")
        if not any(c != b for c in self.colors for b in self.backgrounds):
            raise ConfigError("task.colors x task.backgrounds gives no prompt (object and background must differ)")
        if min(self.pretrain_steps, self.pretrain_vae_steps, self.pretrain_batch - 1) < 0:
            raise ConfigError("task.pretrain_steps / pretrain_vae_steps must be >= 0 and pretrain_batch >= 1")


# ---------------------------------------------------------------- synthetic images


def prompt_items(colors: Sequence[str], shapes: Sequence[str], backgrounds: Sequence[str]) -> list[dict]:
    """Every (colour, shape, background) with colour != background, as task records."""
    from mmrl.adapters.grounding.synthetic_scenes import PALETTE

    out = []
    for c in colors:
        for s in shapes:
            for b in backgrounds:
                if c == b:
                    continue
                out.append(
                    {
                        "prompt": f"a {c} {s} on a {b} background",
                        "color": c,
                        "shape": s,
                        "background": b,
                        "object_color": PALETTE[c],
                        "background_color": PALETTE[b],
                    }
                )
    return out


def render_item(item: dict, size: int, rng=None):
    """A PIL image of ``item``: its shape in its colour, centred (jittered by ``rng``), on its background."""
    from PIL import Image, ImageDraw

    from mmrl.adapters.grounding.synthetic_scenes import PALETTE

    img = Image.new("RGB", (size, size), PALETTE[item["background"]])
    draw = ImageDraw.Draw(img)
    if rng is None:
        frac, cx, cy = 0.55, size / 2, size / 2
    else:
        frac = float(rng.uniform(0.45, 0.65))
        cx, cy = size / 2 + rng.uniform(-0.06, 0.06, size=2) * size
    half = frac * size / 2
    box = (cx - half, cy - half, cx + half, cy + half)
    col = PALETTE[item["color"]]
    if item["shape"] == "circle":
        draw.ellipse(box, fill=col)
    elif item["shape"] == "square":
        draw.rectangle(box, fill=col)
    else:
        draw.polygon([(cx, cy - half), (cx - half, cy + half), (cx + half, cy + half)], fill=col)
    return img


def _image_batch(items: list[dict], size: int, rng):
    import numpy as np
    import torch

    arr = np.stack([np.asarray(render_item(it, size, rng), dtype=np.float32) / 255.0 for it in items])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()


# ---------------------------------------------------------------- pre-training


def pretrain_pipeline(
    base_path: str, model_cfg: Any, task_cfg: T2IColorConfig, *, cache_root: Path | None = None
) -> Path:
    """Pre-train (VAE, then denoiser) the pipeline at ``base_path`` on the task's synthetic images; cached."""
    from mmrl.models.cache import cached_build

    spec = {
        "base": str(base_path),
        "version": PRETRAIN_VERSION,
        "pipeline": model_cfg.pipeline,
        "resolution": model_cfg.resolution,
        "max_sequence_length": model_cfg.max_sequence_length,
        "task": {
            k: v
            for k, v in asdict(task_cfg).items()
            if k.startswith("pretrain") or k in ("colors", "shapes", "backgrounds")
        },
    }
    base_spec = Path(base_path) / "mmrl_spec.json"
    if base_spec.exists():  # a tiny build: its own spec identifies it even if the cache moves
        spec["base_spec"] = base_spec.read_text()

    def build(tmp: Path) -> None:
        t0 = time.perf_counter()
        pipe = _train(base_path, model_cfg, task_cfg)
        pipe.save_pretrained(str(tmp), safe_serialization=True)
        log.info("t2i_color: pre-trained the pipeline in %.0f s", time.perf_counter() - t0)

    return cached_build("t2i_color_pretrained", spec, build, root=cache_root)


def _train(base_path: str, model_cfg: Any, cfg: T2IColorConfig):
    import numpy as np
    import torch

    from mmrl.adapters.diffusion import pipeline_backend
    from mmrl.adapters.diffusion.tiny_model import load_diffusion_pipeline

    torch.manual_seed(cfg.pretrain_seed)
    rng = np.random.default_rng(cfg.pretrain_seed)
    pipe = load_diffusion_pipeline(base_path, "float32", expected_kind=model_cfg.pipeline)
    be = pipeline_backend(pipe, model_cfg)
    items = prompt_items(cfg.colors, cfg.shapes, cfg.backgrounds)
    size = be.height
    vae = pipe.vae

    # 1. VAE as an autoencoder (the tiny VAE is random)
    if cfg.pretrain_vae_steps:
        vae.train().requires_grad_(True)
        opt = torch.optim.Adam(vae.parameters(), lr=cfg.pretrain_lr)
        for _ in range(cfg.pretrain_vae_steps):
            batch = [items[i] for i in rng.integers(0, len(items), cfg.pretrain_batch)]
            x = _image_batch(batch, size, rng) * 2 - 1
            post = vae.encode(x).latent_dist
            rec = vae.decode(post.sample()).sample
            loss = torch.nn.functional.mse_loss(rec, x) + 1e-6 * post.kl().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        vae.eval().requires_grad_(False)
        with torch.no_grad():  # normalise the latents to zero mean, unit variance
            x = _image_batch(items, size, None) * 2 - 1
            z = vae.encode(x).latent_dist.mode()
        std = float(z.std())
        kw = {"scaling_factor": 1.0 / max(std, 1e-3)}
        if getattr(vae.config, "shift_factor", None) is not None:
            kw["shift_factor"] = float(z.mean())
        vae.register_to_config(**kw)

    # 2. the denoiser
    den = getattr(pipe, be.denoiser_name)
    if cfg.pretrain_steps:
        with torch.no_grad():
            cond_all = be.encode([it["prompt"] for it in items], "cpu")
        den.train().requires_grad_(True)
        opt = torch.optim.Adam(den.parameters(), lr=cfg.pretrain_lr)
        sched = pipe.scheduler
        for _ in range(cfg.pretrain_steps):
            idx = rng.integers(0, len(items), cfg.pretrain_batch)
            with torch.no_grad():
                z = be.encode_images(_image_batch([items[i] for i in idx], size, rng))
            cond = {k: v[torch.from_numpy(idx)] for k, v in cond_all.items()}
            noise = torch.randn_like(z)
            if be.flow:  # rectified flow: x_s = (1 - s) z + s e, target v = e - z
                s = torch.sigmoid(torch.randn(len(idx)))  # logit-normal sigmas (SD3)
                sv = s.view(-1, *([1] * (z.dim() - 1)))
                xt = (1 - sv) * z + sv * noise
                pred = be.forward(den, xt, s * 1000, cond)
                target = noise - z
            else:  # DDPM epsilon-prediction
                t = torch.randint(0, sched.config.num_train_timesteps, (len(idx),))
                xt = sched.add_noise(z, noise, t)
                pred = be.forward(den, xt, t, cond)
                target = noise
            loss = torch.nn.functional.mse_loss(pred.float(), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        den.eval().requires_grad_(False)
    return pipe


# ---------------------------------------------------------------- sample grid


def save_sample_grid(
    policy: Any,
    prompts: Sequence[str],
    path: str | Path,
    *,
    seed: int = 0,
    cols: int | None = None,
    greedy: bool = True,
) -> Path:
    """Sample one image per prompt (deterministic ODE when ``greedy``) and save them as a PNG grid."""
    import torch
    from PIL import Image

    from mmrl.policies.base import PromptBatch
    from mmrl.rollout.noise import mix_seed

    items = [{"prompt": p} for p in prompts]
    batch = PromptBatch(
        items=items, indices=list(range(len(items))), seeds=[mix_seed(seed, i) for i in range(len(items))]
    )
    with torch.no_grad():
        ro = policy.rollout(batch, 1, greedy=greedy)
    images = [s["image"] for s in ro.samples]
    cols = cols or int(math.ceil(math.sqrt(len(images))))
    rows = int(math.ceil(len(images) / cols))
    w, h = images[0].size
    grid = Image.new("RGB", (cols * w, rows * h), (255, 255, 255))
    for k, im in enumerate(images):
        grid.paste(im, ((k % cols) * w, (k // cols) * h))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
    return path


# ---------------------------------------------------------------- the task


def _color_reward_fn(tol: float):
    from mmrl.adapters.diffusion.image_rewards import color_rule_score

    def color(prompts, completions, object_color, background_color, **_):
        """Colour-rule reward (centre object colour + border background colour)."""
        return [color_rule_score(c, o, b, tol=tol) for c, o, b in zip(completions, object_color, background_color)]

    return color


class T2IColorTask(Task):
    model_types = ("diffusion",)
    name = "t2i_color"
    description = "Text-to-image RL: a tiny SD3 learns 'a red circle on a blue background' from a colour-rule reward (CPU, minutes)."
    config_cls = T2IColorConfig

    def _all(self) -> list[dict]:
        return prompt_items(self.cfg.colors, self.cfg.shapes, self.cfg.backgrounds)

    def train_items(self):
        return self._all()

    def eval_items(self):
        items = self._all()
        k = min(self.cfg.eval_size, len(items))
        step = len(items) / k
        return [items[int(i * step)] for i in range(k)]

    def reward_specs(self):
        return [RewardSpec("color", _color_reward_fn(self.cfg.color_tolerance), 1.0)]

    def reward_columns(self, items):
        return {k: [it[k] for it in items] for k in ("object_color", "background_color")}

    def policy_spec(self) -> PolicySpec:
        return PolicySpec(task_name=self.name, prepare_model=self.prepare_diffusion_model)

    def prepare_diffusion_model(self, path: str, model_cfg: Any) -> str:
        """The pre-trained pipeline (built once and cached) when task.pretrain_steps > 0, else ``path``."""
        if self.cfg.pretrain_steps <= 0 and self.cfg.pretrain_vae_steps <= 0:
            return path
        return str(pretrain_pipeline(path, model_cfg, self.cfg))

    def rollout_metrics(self, items, samples):
        from mmrl.adapters.diffusion.image_rewards import group_diversity

        groups = [id(it) for it in items]
        d = group_diversity([s["image"] for s in samples], groups)
        return {"monitor/group_diversity": d} if math.isfinite(d) else {}

    def eval_metrics(self, items, samples, per_fn):
        v = per_fn.get("color")
        if v is None or not len(v):
            return {}
        import torch

        ok = torch.isfinite(v)
        return {"eval/score": float(v[ok].mean()) if ok.any() else math.nan}
