"""LeRobot's flow VLAs as mmrl VLA policies (``model.architecture=smolvla|pi0|pi05``): LeRobot's checkpoint, mmrl's
env pool and RL.

:class:`LeRobotFlowPolicy` is a
:class:`~mmrl.adapters.vla.continuous_policy.ContinuousVLAPolicy` whose backbone and flow expert are a loaded
LeRobot pipeline (:class:`~mmrl.adapters.vla.lerobot.pipeline.SmolVLAPipeline` for SmolVLA,
:class:`~mmrl.adapters.vla.lerobot.pipeline.PI0Pipeline` for π0 / π0.5): everything about episodes (env pool,
task switching, initial states, the Rollout, payload, metrics), the distinct-observation batching, the flow head's
sampling / log-prob / warm-start rules (:class:`~mmrl.adapters.vla.continuous_heads.FlowRule`, Flow-SDE /
Flow-SDE-one / Flow-Noise) and the PPO critic come from there. What differs:

* **Prefix.** One ``pipeline.encode(pipeline.prepare(images, state, tasks))`` per policy call over the distinct
  observations: the per-layer keys/values of the VLM (:class:`~mmrl.adapters.vla.lerobot.smolvla.PrefixCache`; π0's
  :class:`~mmrl.adapters.vla.lerobot.pi0.PI0PrefixCache` also carries the padded state its expert embeds; π0.5 reads
  the state from its prompt), which the rule hands to the checkpoint's own expert through
  :class:`~mmrl.adapters.vla.lerobot.smolvla.FlowExpertView`.
* **Cameras.** The task names the views tiled side by side in its frame (``PolicySpec.action_stats["cameras"]``:
  LIBERO's ``agentview`` | ``wrist``, the tabletop tasks' ``image``); each view is cut out and fed as the
  checkpoint's image feature it maps to (``model.camera_map``, else :data:`DEFAULT_CAMERA_FEATURES`). A checkpoint
  feature no view maps to (beyond its ``empty_cameras``), or a view it does not know, is one line at build time.
* **State and actions.** The raw ``obs["proprio"]`` goes in; the checkpoint normalises and zero-pads it. The expert
  predicts ``max_action_dim`` normalised dims; the first ``action_dim`` (the env's) count in every log-prob and loss
  (``dim_mask``); the env gets them unnormalised with the checkpoint's statistics, then clipped to the task's action
  range and gripper dims binarised (:meth:`ActionTokenizer.to_env`). SFT targets are normalised the same way.
* **Persistence.** :meth:`LeRobotFlowPolicy.save_pretrained` writes LeRobot's layout (``save_policy``: config.json,
  model.safetensors, processor files, a local tokenizer), which LeRobot's ``from_pretrained`` and ``load_policy``
  read, plus mmrl's files (action range, initial-state fingerprints, critic / noise head in
  ``mmrl_heads.safetensors``). With LoRA the weights are merged for LeRobot and the adapters saved beside them.
* **LoRA** (``model.lora.enabled=true``, :mod:`~mmrl.adapters.vla.lerobot.lora`): adapters on the VLM's and the
  expert's blocks, the projections train in full; the KL reference stays a frozen copy (the adapter-off model would
  keep the trained projections).

:func:`lerobot_backbone` loads ``model.path`` (a LeRobot folder, a hub id, or ``tiny_smolvla`` / ``tiny_pi0`` /
``tiny_pi05``: built offline by :mod:`~mmrl.adapters.vla.lerobot.tiny` for the task's cameras, state and action dims,
with the task's demo statistics as its normalisation); config.json's ``type`` must be ``model.architecture``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from mmrl.adapters.vla.continuous_policy import HEAD_META_FILE, STATE_STD_FLOOR, ContinuousVLAPolicy
from mmrl.adapters.vla.errors import VLAInputError, VLASetupError
from mmrl.adapters.vla.flow_chain import FlowNoiseHead
from mmrl.adapters.vla.heads import heads_on
from mmrl.adapters.vla.init_states import INIT_STATES_FILE, InitStateRecord
from mmrl.adapters.vla.lerobot import LeRobotCheckpointError
from mmrl.adapters.vla.lerobot.pipeline import ACTION_KEY
from mmrl.adapters.vla.lerobot.smolvla import FlowExpertView, PrefixCache
from mmrl.adapters.vla.policy import ACTION_STATS_FILE, VLAEnvSpec, split_views
from mmrl.adapters.vla.value_head import ValueHead
from mmrl.policies.base import FrozenCopyReference, PolicySpec

__all__ = [
    "DEFAULT_CAMERA_FEATURES",
    "EXTRA_HEADS_FILE",
    "LEROBOT_ARCHITECTURES",
    "TINY_PRESETS",
    "LeRobotFlowModule",
    "LeRobotFlowPolicy",
    "lerobot_backbone",
    "camera_features",
    "split_views",
]

LEROBOT_ARCHITECTURES = ("smolvla", "pi0", "pi05")
"""``model.architecture`` values served by :class:`LeRobotFlowPolicy` (= config.json's ``type``)."""
TINY_PRESETS = {arch: f"tiny_{arch}" for arch in LEROBOT_ARCHITECTURES}
"""``model.path`` that builds a random tiny model of each architecture for the task, offline."""
VISION_MODULES = {"smolvla": ("vision_model", "connector"), "pi0": ("vision_tower", "multi_modal_projector")}
"""The vision encoder and its projection per model family (frozen by ``model.freeze_vision_tower``)."""
EXTRA_HEADS_FILE = "mmrl_heads.safetensors"
"""mmrl's modules outside LeRobot's layout (the PPO critic, Flow-Noise's noise head), saved next to it."""
DEFAULT_CAMERA_FEATURES = {
    "agentview": "observation.images.image",
    "image": "observation.images.image",
    "wrist": "observation.images.image2",
}
"""Task camera -> checkpoint image feature when ``model.camera_map`` does not say (LeRobot's LIBERO names)."""


def camera_features(cameras: Sequence[str], camera_map: Mapping[str, str]) -> dict[str, str]:
    """Task camera -> checkpoint image feature: ``camera_map``, else :data:`DEFAULT_CAMERA_FEATURES`, else
    ``observation.images.<camera>``."""
    unknown = [k for k in camera_map if k not in cameras]
    if unknown:
        raise VLASetupError(f"model.camera_map names camera '{unknown[0]}'; the task's cameras are {list(cameras)}")
    return {c: camera_map.get(c) or DEFAULT_CAMERA_FEATURES.get(c) or f"observation.images.{c}" for c in cameras}


class _ExpertHead(FlowExpertView):
    """The checkpoint's expert (SmolVLA's, π0's or π0.5's) as the flow rule's ``module.head``: its prefix
    "projection" is the key/value cache itself."""

    @staticmethod
    def prefix_kv(cache: PrefixCache, _mask: Tensor) -> PrefixCache:
        return cache


class LeRobotFlowModule(nn.Module):
    """The trainable module: the pipeline (VLM + expert + preprocessing), Flow-Noise's noise head and the critic.

    ``forward(run=..., images=..., state=..., tasks=...)`` prepares and encodes the observations once and calls
    ``run(self, cache, cache.pad_mask)``, the contract of :class:`~mmrl.adapters.vla.continuous_heads.ContinuousVLAModule`.
    """

    def __init__(
        self, pipeline: nn.Module, *, noise_head: nn.Module | None = None, value_head: ValueHead | None = None
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.noise_head = noise_head
        self.value_head = value_head

    @property
    def head(self) -> _ExpertHead:
        """The expert behind ``flow_chain``'s interface (a view: no weights of its own)."""
        return _ExpertHead(self.pipeline.model)

    def extra_heads(self) -> nn.ModuleDict:
        """The modules outside LeRobot's layout (saved in :data:`EXTRA_HEADS_FILE`)."""
        mods = {"noise_head": self.noise_head, "value_head": self.value_head}
        return nn.ModuleDict({k: m for k, m in mods.items() if m is not None})

    def forward(self, *, run, images: Mapping[str, Tensor], state: Tensor, tasks: Sequence[str]) -> Any:
        cache = self.pipeline.encode(self.pipeline.prepare(images, state, list(tasks)))
        return run(self, cache, cache.pad_mask)

    def value(self, cache: PrefixCache, mask: Tensor) -> Tensor:
        """V(prefix) ``[U]`` from the last VLM layer's values (``[U, P, kv_heads * head_dim]``) over the real tokens
        (π0's cached state is not read: the critic sees the prefix, the same for every architecture)."""
        values = cache.values[-1]
        return self.value_head(values.reshape(*values.shape[:2], -1), mask)


class LeRobotFlowPolicy(ContinuousVLAPolicy):
    """A VLA policy driving mmrl's SmolVLA, π0 or π0.5; see the module docstring.

    Args:
        pipeline: a loaded pipeline (``checkpoint.load_policy`` or a ``tiny`` builder) whose config.json ``type``
            is ``cfg.architecture``.
        cfg: the :class:`~mmrl.adapters.vla.config.VLAConfig` (``architecture=smolvla|pi0|pi05``, ``action_head=flow``).
        action_stats: the task's ``{"low", "high", "gripper_dims"}`` (the env's action range) and ``"cameras"``.
        env_spec, value_head, reference, min_envs, check_init_states: as for
            :class:`~mmrl.adapters.vla.policy.VLAPolicy`.
    """

    def __init__(
        self,
        pipeline,
        cfg,
        action_stats: dict,
        env_spec: VLAEnvSpec,
        *,
        value_head: bool = False,
        reference: bool = False,
        min_envs: int = 1,
        check_init_states: bool = True,
    ) -> None:
        # not VLAPolicy.__init__ (it loads a transformers VLM): the same episode state, set here
        self.cfg = cfg
        self.env_spec = env_spec
        self.init_states = InitStateRecord(strict=check_init_states)
        self.min_envs = int(min_envs)
        self._pool = None
        self.record_frames = False
        self._slot_tasks: list[str | None] = []
        self._assigned_at_restarts = 0
        self.engine = None
        arch = cfg.architecture
        if arch not in LEROBOT_ARCHITECTURES:
            raise VLASetupError(
                f"model.architecture={arch} is not a LeRobot policy ({', '.join(LEROBOT_ARCHITECTURES)})"
            )
        kind = pipeline.lerobot_config.get("type", "smolvla")
        if kind != arch:
            raise VLASetupError(
                f"model.architecture={arch} but the checkpoint is a LeRobot '{kind}': set model.architecture={kind}"
            )
        heads = heads_on(arch)
        if cfg.action_head not in heads:
            raise VLASetupError(
                f"model.architecture={arch} needs model.action_head={'|'.join(heads)}, got {cfg.action_head}"
            )
        spec, model_cfg = pipeline.spec, pipeline.config
        env_dim = int(env_spec.action_dim)
        if spec.action_dim != env_dim:
            raise VLASetupError(
                f"the checkpoint outputs {spec.action_dim} action dims ('{ACTION_KEY}'), env {env_spec.env_name} "
                f"takes {env_dim}"
            )
        if model_cfg.chunk_size != cfg.chunk:
            raise VLASetupError(
                f"model.chunk={cfg.chunk} but the checkpoint's chunk_size is {model_cfg.chunk_size}: set "
                f"model.chunk={model_cfg.chunk_size}"
            )
        state = action_stats.get("state") or {}
        if state.get("mean") and len(state["mean"]) != spec.state_dim:
            raise VLASetupError(
                f"the task's robot state has {len(state['mean'])} dims, the checkpoint's 'observation.state' "
                f"{spec.state_dim}"
            )
        self.cameras = _checked_cameras(list(action_stats.get("cameras") or ["image"]), cfg.camera_map, pipeline)
        """Task camera -> the checkpoint's image feature (the views of a frame, left to right)."""
        self.action_ids = torch.arange(cfg.n_bins)  # the action tokenizer below only clips / binarises for the env
        self.action_tokenizer = self._make_action_tokenizer({k: v for k, v in action_stats.items() if k != "cameras"})
        self._init_head(int(model_cfg.max_action_dim))
        self.state_stats = None
        if cfg.lora.enabled:
            from mmrl.adapters.vla.lerobot.lora import add_lora

            add_lora(pipeline.model, cfg.lora)
        if cfg.freeze_vision_tower:
            for name in VISION_MODULES["smolvla" if arch == "smolvla" else "pi0"]:
                getattr(pipeline.model, name).requires_grad_(False)
        noise_head = None
        if cfg.likelihood == "flow_noise":
            noise_head = FlowNoiseHead(
                model_cfg.expert_width, model_cfg.max_action_dim, min_std=cfg.noise_min_std, max_std=cfg.noise_max_std
            )
        critic = ValueHead(model_cfg.num_kv_heads * model_cfg.head_dim) if value_head else None
        module = LeRobotFlowModule(pipeline, noise_head=noise_head, value_head=critic)
        module.extra_heads().to(pipeline.device)
        module.eval()
        self.model = module
        self._frozen_ref = FrozenCopyReference(self) if reference else None

    # ------------------------------------------------------------------ what differs from the VLM backbone
    @property
    def pipeline(self):
        """The live pipeline (:class:`~mmrl.adapters.vla.lerobot.pipeline.SmolVLAPipeline` / ``PI0Pipeline``)."""
        return self.module.pipeline

    @property
    def vision_trainable(self) -> bool:
        """Features are never cached: the checkpoint encodes its frames inside the prefix forward."""
        return True

    @property
    def _reads_state(self) -> bool:
        return True

    def _set_train_mode(self, train: bool) -> None:
        if self.module.training != train:
            self.module.train(train)

    def _state_input(self, proprio: np.ndarray | None, rows: int) -> Tensor:
        """The raw ``proprio [rows, S]`` as float32 (the checkpoint normalises it in ``prepare``)."""
        if proprio is None:
            raise VLAInputError(
                f"env {self.env_spec.env_name} gives no 'proprio' observation; {self.cfg.architecture} reads the state"
            )
        p = np.asarray(proprio, dtype=np.float32).reshape(rows, -1)
        if p.shape[1] != self.pipeline.spec.state_dim:
            raise VLAInputError(
                f"the env's proprio has {p.shape[1]} dims, the checkpoint's 'observation.state' "
                f"{self.pipeline.spec.state_dim}"
            )
        return torch.from_numpy(p)

    def _rollout_features(self, prompts) -> None:
        return None

    def _to_env(self, chunk: np.ndarray) -> np.ndarray:
        """Unnormalised with the checkpoint's statistics, then clipped to the task's range, grippers binarised."""
        raw = self.pipeline.unnormalizer.unnormalize(ACTION_KEY, torch.as_tensor(chunk, dtype=torch.float32))
        tok = self.action_tokenizer
        return tok.to_env(tok.normalise(raw.numpy().astype(np.float64)))

    def _normalise_actions(self, chunk: np.ndarray) -> Tensor:
        """Env actions ``[H, env_dim]`` normalised with the checkpoint's statistics."""
        return self.pipeline.normalizer.normalize(ACTION_KEY, torch.as_tensor(chunk, dtype=torch.float32))

    def _distinct_observations(
        self, frames: np.ndarray, instructions: Sequence[str], features, states: Tensor | None
    ) -> tuple[dict[str, Any], Tensor, Tensor | None]:
        """The inputs of the distinct observations (``images``: feature -> uint8 ``[U, H, W, 3]``, ``tasks``), the
        observation of each row ``[N]`` and the distinct raw states."""
        frames, reps, index = self._distinct_rows(frames, instructions, None, states)
        views = split_views(frames[reps], len(self.cameras))
        images = {
            feature: torch.from_numpy(np.ascontiguousarray(v)) for feature, v in zip(self.cameras.values(), views)
        }
        return {"images": images, "tasks": [instructions[r] for r in reps]}, index, states[reps]

    def _prefix_forward(self, inputs: dict[str, Any], feats, states: Tensor | None, run) -> Any:
        """One prefix forward over the distinct observations and ``run`` on its cache (with gradients
        through the possibly wrapped model, without through the bare module)."""
        grad = torch.is_grad_enabled()
        self._set_train_mode(grad)
        target = self.model if grad else self.module
        return target(run=run, state=states.to(self.device), **inputs)

    def reference(self):
        """The frozen copy of the initial model (built with ``reference=True``)."""
        if self._frozen_ref is None:
            raise RuntimeError("no reference policy: build the policy with reference=True")
        return self._frozen_ref.swap()

    # ------------------------------------------------------------------ persistence
    def _head_meta(self) -> dict:
        meta = {
            "architecture": self.cfg.architecture,
            "action_head": self.cfg.action_head,
            "chunk": self.cfg.chunk,
            "cameras": self.cameras,
        }
        if self.cfg.lora.enabled:
            lora = self.cfg.lora
            meta["lora"] = {"r": lora.r, "alpha": lora.alpha, "target_modules": list(lora.target_modules)}
        return meta

    def save_pretrained(self, path: str | Path) -> None:
        """LeRobot's layout (:func:`~mmrl.adapters.vla.lerobot.checkpoint.save_policy`) plus mmrl's files: the
        action range, the initial-state fingerprints, the critic / noise head and what the policy mapped."""
        from safetensors.torch import save_file

        from mmrl.adapters.vla.lerobot.checkpoint import save_policy
        from mmrl.adapters.vla.lerobot.lora import LORA_FILE, adapter_state

        path = Path(path)
        save_policy(self.pipeline, path)
        adapters = adapter_state(self.pipeline.model)
        if adapters:
            save_file({k: v.detach().contiguous().cpu() for k, v in adapters.items()}, str(path / LORA_FILE))
        self.action_tokenizer.save(path / ACTION_STATS_FILE)
        self.init_states.save(path / INIT_STATES_FILE)
        extra = self.module.extra_heads()
        if len(extra):
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in extra.state_dict().items()}, str(path / EXTRA_HEADS_FILE)
            )
        (path / HEAD_META_FILE).write_text(json.dumps(self._head_meta(), indent=1))

    def load_pretrained(self, path: str | Path) -> None:
        """Load what :meth:`save_pretrained` wrote (or any LeRobot folder of the same type and shapes) into the live
        model; a folder of other shapes is a :class:`~mmrl.checkpoint_files.CheckpointMismatchError` naming the tensor."""
        from mmrl.adapters.vla.action_tokenizer import ActionTokenizer
        from mmrl.adapters.vla.lerobot.lora import LORA_FILE, load_into_lora_model, lora_layers
        from mmrl.checkpoint_files import load_state_checked, read_safetensors

        path = Path(path)
        weights = path / "model.safetensors"
        mapped = _mmrl_named(read_safetensors(weights), self.pipeline.lerobot_config.get("type", "smolvla"))
        mapped = {k: v.to(torch.float32) for k, v in mapped.items()}
        if lora_layers(self.pipeline.model):
            adapters = path / LORA_FILE
            saved = read_safetensors(adapters) if adapters.exists() else None
            load_into_lora_model(self.pipeline.model, mapped, saved, weights)
        else:
            load_state_checked(self.pipeline.model, mapped, weights)
        extra = path / EXTRA_HEADS_FILE
        if extra.exists():
            load_state_checked(self.module.extra_heads(), read_safetensors(extra), extra)
        if (path / ACTION_STATS_FILE).exists():
            self.action_tokenizer = ActionTokenizer.load(path / ACTION_STATS_FILE, token_ids=self.action_ids.tolist())
        if (path / INIT_STATES_FILE).exists():
            self.init_states.load(path / INIT_STATES_FILE)


def _mmrl_named(tensors: dict[str, Tensor], kind: str) -> dict[str, Tensor]:
    """LeRobot's tensors of a ``kind`` policy under mmrl's parameter names (the unused ones dropped)."""
    from mmrl.adapters.vla.lerobot import checkpoint as ck

    if kind == "smolvla":
        return ck.to_mmrl_names(tensors)[0]
    pi05 = kind == "pi05"
    return ck.to_mmrl_names(
        ck._pi0_tensors(tensors, pi05=pi05),
        prefixes=ck.PI05_PREFIXES if pi05 else ck.PI0_PREFIXES,
        unused_names=ck.PI0_UNUSED_TENSORS,
        policy=kind,
    )[0]


def _checked_cameras(cameras: list[str], camera_map: Mapping[str, str], pipeline) -> dict[str, str]:
    """:func:`camera_features` checked against the checkpoint's image features (after its rename map)."""
    from mmrl.adapters.vla.lerobot.processing import check_image_keys

    mapping = camera_features(cameras, camera_map)
    spec = pipeline.spec
    renamed = {spec.rename_map.get(f, f): c for c, f in mapping.items()}
    try:
        check_image_keys(renamed, spec.image_keys, spec.empty_cameras)
    except LeRobotCheckpointError as e:
        shown = ", ".join(f"{c} -> {f}" for c, f in mapping.items())
        raise LeRobotCheckpointError(f"{e}; the task's cameras map as {shown} (set model.camera_map)") from None
    return mapping


# ---------------------------------------------------------------------------------------------- building


def _floored(values: Sequence[float]) -> list[float]:
    return [max(float(v), STATE_STD_FLOOR) for v in values]


def tiny_for_task(cfg, action_stats: dict, env_spec: VLAEnvSpec):
    """A random tiny model of ``cfg.architecture`` (SmolVLA, π0 or π0.5) whose inputs and outputs are the task's: one
    image feature per camera, the task's state
    and action dims, ``model.chunk`` / ``num_steps``, and normalisation statistics from the task (state: the demos'
    mean / std or ``model.state_mean`` / ``state_std``; actions: the centre and half-width of the task's action range,
    so that -1 / +1 are its ends, as for mmrl's own continuous heads)."""
    from mmrl.adapters.vla.lerobot.tiny import build_tiny_pi0, build_tiny_smolvla

    cameras = list(action_stats.get("cameras") or ["image"])
    features = camera_features(cameras, cfg.camera_map)
    state = {"mean": cfg.state_mean, "std": cfg.state_std} if cfg.state_mean is not None else action_stats.get("state")
    if not state or not state.get("mean"):
        raise VLAInputError(
            f"model.path={TINY_PRESETS[cfg.architecture]} needs the robot state's size and statistics: the task's "
            "demos record no state; "
            "set model.state_mean and model.state_std"
        )
    low, high = np.asarray(action_stats["low"], dtype=np.float64), np.asarray(action_stats["high"], dtype=np.float64)
    side = int(env_spec.env_kwargs.get("image_size", 128))
    stats = {
        "observation.state": {"mean": [float(x) for x in state["mean"]], "std": _floored(state["std"])},
        "action": {"mean": ((low + high) / 2).tolist(), "std": _floored(((high - low) / 2).tolist())},
    }
    sizes = dict(
        cameras=tuple(dict.fromkeys(features.values())),
        image_shape=(3, side, side),
        state_dim=len(stats["observation.state"]["mean"]),
        action_dim=int(env_spec.action_dim),
        chunk_size=int(cfg.chunk),
        num_steps=int(cfg.num_steps),
        stats=stats,
    )
    with torch.random.fork_rng(devices=[]):  # the builder seeds torch: leave the run's generator as it was
        if cfg.architecture == "smolvla":
            return build_tiny_smolvla(**sizes)
        return build_tiny_pi0(pi05=cfg.architecture == "pi05", **sizes)


def load_lerobot_folder(path: str, tokenizer_path: str | None = None):
    """A LeRobot policy (SmolVLA, π0, π0.5: config.json's ``type``) from a folder, or from a hub id (downloaded;
    offline and not cached: one line saying how to fetch it or set model.path).

    ``tokenizer_path`` (π0 / π0.5): the PaliGemma tokenizer's folder; None: the folder's own ``tokenizer/`` when it
    has one, else what its pre-processor names (LeRobot: the gated ``google/paligemma-3b-pt-224``, from the cache).
    """
    from mmrl.adapters.vla.lerobot.checkpoint import _read_json, load_policy

    folder = Path(path).expanduser()
    if not folder.is_dir():
        from mmrl.models.availability import model_load_errors

        with model_load_errors(path, what="LeRobot policy"):
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(path))
    if _read_json(folder / "config.json").get("type") not in ("pi0", "pi05"):
        return load_policy(folder)
    if tokenizer_path is None and (folder / "tokenizer" / "tokenizer_config.json").is_file():
        tokenizer_path = str(folder / "tokenizer")
    return load_policy(folder, tokenizer_path=tokenizer_path)


def _wants_tiny(cfg) -> bool:
    """``model.path=tiny_<architecture>``; or that preset whose path a task file replaced by its default VLM
    backbone (a task's ``model.path`` merges after the model preset; an mmrl VLM preset is never a LeRobot policy)."""
    from mmrl.models.presets import VLM_PRESETS

    tiny = TINY_PRESETS[cfg.architecture]
    if cfg.path == tiny:
        return True
    if cfg.path in TINY_PRESETS.values():
        raise VLAInputError(
            f"model.path={cfg.path} is for another architecture: model.architecture={cfg.architecture} builds {tiny}"
        )
    if cfg.path in VLM_PRESETS:
        if cfg.name == tiny:
            return True
        raise VLAInputError(
            f"model.path={cfg.path} is an mmrl VLM preset (the task's default backbone), not a LeRobot "
            f"{cfg.architecture}: set model.path to a LeRobot policy folder or hub id, or {tiny}"
        )
    return False


def lerobot_backbone(run_cfg, spec: PolicySpec) -> tuple[type, tuple[Any, ...]]:
    """The backbone loader of ``model.architecture=smolvla|pi0|pi05`` (:data:`mmrl.adapters.vla.factory.BACKBONES`):
    the pipeline of ``model.path`` (a LeRobot folder or hub id, or a tiny model built for the task) on the run's
    device, for :class:`LeRobotFlowPolicy`."""
    from mmrl.policies.vlm import _target_device

    cfg = run_cfg.model
    if _wants_tiny(cfg):
        pipeline = tiny_for_task(cfg, dict(spec.action_stats), spec.env_spec)
    else:
        pipeline = load_lerobot_folder(cfg.path, cfg.tokenizer_path)
    pipeline.to(_target_device(run_cfg))
    return LeRobotFlowPolicy, (pipeline,)
