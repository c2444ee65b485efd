"""Scripted experts for the tabletop tasks.

Each expert is stateless: the action is a function of the current simulator state only
(``TabletopEnv.expert_state()``), so it can take over from any state, e.g. to label
demonstrations or to check that every initial state is solvable.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

HOVER_Z = 0.08  # travel height of the fingertips (m), above every object
PUSH_Z = 0.008  # fingertip height while pushing


def _move_towards(ee: np.ndarray, target: np.ndarray, scale: float, gain: float = 1.0) -> np.ndarray:
    """dx, dy, dz in [-1, 1] that move the set-point towards ``target`` (saturating)."""
    return np.clip(gain * (target - ee) / scale, -1.0, 1.0)


def _action(delta: np.ndarray, gripper: float) -> np.ndarray:
    return np.concatenate([delta, [gripper]]).astype(np.float32)


def reach_expert(state: Mapping[str, Any]) -> np.ndarray:
    """Hover over the target block, then drop to 2 cm above its top face."""
    ee, block, scale = state["ee"], state["target"], state["action_scale"]
    goal = block + np.array([0.0, 0.0, state["block_half"] + 0.015])
    if np.linalg.norm(ee[:2] - block[:2]) > 0.03:
        goal[2] = max(goal[2], HOVER_Z)
    return _action(_move_towards(ee, goal, scale), -1.0)


def push_expert(state: Mapping[str, Any]) -> np.ndarray:
    """Get behind the cube (opposite the pad) at hover height, descend, push along the line."""
    ee, cube, pad, scale = state["ee"], state["target"], state["pad"], state["action_scale"]
    half = state["block_half"]
    to_goal = pad - cube[:2]
    dist = float(np.linalg.norm(to_goal))
    u = to_goal / max(dist, 1e-9)
    rel = ee[:2] - cube[:2]
    along = float(rel @ u)
    lateral = rel - along * u
    lateral_err = float(np.linalg.norm(lateral))
    standoff = half + 0.025  # cube half width + finger half depth + margin
    behind = cube[:2] - u * standoff
    in_push_pose = along < -(half + 0.005) and lateral_err < 0.012 and ee[2] < 0.03
    if in_push_pose:
        speed = float(np.clip(dist / 0.08, 0.3, 0.7))
        xy = u * speed - np.clip(lateral / scale * 1.5, -0.5, 0.5)
        # also pull onto the line behind the cube: keep the fingers centred on the cube face
        dz = np.clip((PUSH_Z - ee[2]) / scale, -1.0, 1.0)
        return _action(np.array([xy[0], xy[1], dz]), 1.0)
    near_behind = float(np.linalg.norm(ee[:2] - behind)) < 0.012
    if near_behind:  # aligned: descend to pushing height
        return _action(_move_towards(ee, np.array([behind[0], behind[1], PUSH_Z]), scale), 1.0)
    if ee[2] < HOVER_Z - 0.02:  # somewhere low but not behind the cube: go up first
        up = _move_towards(ee, np.array([ee[0], ee[1], HOVER_Z]), scale)
        if float(np.linalg.norm(rel)) > standoff + 0.03:  # far from the cube: may move sideways too
            up[:2] = _move_towards(ee[:2], behind, scale)
        return _action(up, 1.0)
    return _action(_move_towards(ee, np.array([behind[0], behind[1], HOVER_Z]), scale), 1.0)


def lift_expert(state: Mapping[str, Any]) -> np.ndarray:
    """Align open fingers over the block, descend, close, then lift."""
    ee, block, scale = state["ee"], state["target"], state["action_scale"]
    half = state["block_half"]
    if block[2] > half + 0.01:  # block is off the table: it is in the hand
        return _action(_move_towards(ee, np.array([ee[0], ee[1], 0.2]), scale), 1.0)
    xy_err = float(np.linalg.norm(ee[:2] - block[:2]))
    grasp_z = 0.004
    if xy_err > 0.008:
        z = HOVER_Z if xy_err > 0.02 else ee[2]
        return _action(_move_towards(ee, np.array([block[0], block[1], z]), scale), -1.0)
    if ee[2] > grasp_z + 0.006:
        return _action(_move_towards(ee, np.array([block[0], block[1], grasp_z]), scale), -1.0)
    grasped = state["gripper"] > 0.35  # fingers stopped on the block faces
    dz = 1.0 if grasped else 0.0
    return _action(np.array([0.0, 0.0, dz]), 1.0)


EXPERTS = {"reach": reach_expert, "push": push_expert, "lift": lift_expert}


def expert_action(env_or_state: Any) -> np.ndarray:
    """Scripted action for the env's task, from a ``TabletopEnv`` or its ``expert_state()`` dict."""
    state = env_or_state.expert_state() if hasattr(env_or_state, "expert_state") else env_or_state
    try:
        expert = EXPERTS[state["kind"]]
    except KeyError as exc:
        raise ValueError(f"no tabletop expert for task kind {state.get('kind')!r}; valid: {sorted(EXPERTS)}") from exc
    return expert(state)
