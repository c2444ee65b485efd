"""MJCF for the tabletop scene, built as a string from parameters.

The scene: a square table whose top is the plane z = 0; a gripper point-arm made of three
world-aligned slide joints (x, y, z) carrying a palm and two parallel fingers (each a slide
joint along y); four coloured cubes (red, green, blue, yellow); a flat green pad (visual
only, no collision); two distractors (a grey sphere and a purple cylinder).  All movable
objects have free joints.  Render-heavy features are off: no shadow map, no multisampling,
no skybox or reflective materials, and the offscreen buffer is the image size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BLOCK_COLOURS: dict[str, tuple[float, float, float, float]] = {
    "red": (0.85, 0.12, 0.12, 1.0),
    "green": (0.15, 0.70, 0.20, 1.0),
    "blue": (0.15, 0.30, 0.90, 1.0),
    "yellow": (0.95, 0.85, 0.10, 1.0),
}
PAD_RGBA = (0.45, 0.95, 0.55, 1.0)
DISTRACTORS: dict[str, tuple[str, tuple[float, ...], tuple[float, float, float, float]]] = {
    # name: (geom type, size, rgba)
    "grey_sphere": ("sphere", (0.02,), (0.55, 0.55, 0.55, 1.0)),
    "purple_cylinder": ("cylinder", (0.018, 0.025), (0.55, 0.20, 0.70, 1.0)),
}


@dataclass(frozen=True)
class SceneConfig:
    """Geometry and physics parameters of the tabletop scene (lengths in metres)."""

    image_size: int = 64
    table_half: float = 0.3
    block_half: float = 0.02
    pad_half: float = 0.05
    workspace_half: float = 0.25
    ee_z_max: float = 0.25
    finger_offset: float = 0.04  # finger centre distance from the palm axis when open
    finger_half_width: float = 0.006
    finger_travel: float = 0.03  # how far each finger slides inwards when fully closed
    finger_length: float = 0.06
    timestep: float = 0.004
    arm_kp: float = 1000.0
    finger_kp: float = 100.0
    block_mass: float = 0.05
    colours: tuple[str, ...] = field(default_factory=lambda: tuple(BLOCK_COLOURS))
    distractors: tuple[str, ...] = field(default_factory=lambda: tuple(DISTRACTORS))

    def __post_init__(self) -> None:
        if not 8 <= self.image_size <= 1024:
            raise ValueError(f"SceneConfig.image_size must be in [8, 1024], got {self.image_size}")
        unknown = [c for c in self.colours if c not in BLOCK_COLOURS]
        if unknown:
            raise ValueError(f"SceneConfig.colours: unknown {unknown}; valid: {sorted(BLOCK_COLOURS)}")
        unknown = [d for d in self.distractors if d not in DISTRACTORS]
        if unknown:
            raise ValueError(f"SceneConfig.distractors: unknown {unknown}; valid: {sorted(DISTRACTORS)}")


def _fmt(values: tuple[float, ...] | list[float]) -> str:
    return " ".join(f"{v:g}" for v in values)


def block_body_name(colour: str) -> str:
    """Body name of the cube with the given colour."""
    return f"{colour}_block"


def _block_xml(colour: str, cfg: SceneConfig) -> str:
    h = cfg.block_half
    return (
        f'<body name="{block_body_name(colour)}" pos="0 0 {h:g}">'
        f'<freejoint name="{colour}_block_joint"/>'
        f'<geom type="box" size="{h:g} {h:g} {h:g}" rgba="{_fmt(BLOCK_COLOURS[colour])}" '
        f'mass="{cfg.block_mass:g}" friction="1 0.005 0.0001"/>'
        "</body>"
    )


def _distractor_xml(name: str) -> str:
    gtype, size, rgba = DISTRACTORS[name]
    z = size[0] if gtype == "sphere" else size[1]
    return (
        f'<body name="{name}" pos="0 0 {z:g}"><freejoint name="{name}_joint"/>'
        f'<geom type="{gtype}" size="{_fmt(size)}" rgba="{_fmt(rgba)}" mass="0.05"/></body>'
    )


def _gripper_xml(cfg: SceneConfig) -> str:
    w, ws, fl = cfg.finger_half_width, cfg.workspace_half, cfg.finger_length / 2
    fingers = []
    for side, sign in (("left", 1.0), ("right", -1.0)):
        lo, hi = (-cfg.finger_travel, 0.0) if sign > 0 else (0.0, cfg.finger_travel)
        fingers.append(
            f'<body name="{side}_finger" pos="0 {sign * cfg.finger_offset:g} {fl:g}">'
            f'<joint name="{side}_finger_joint" type="slide" axis="0 1 0" range="{lo:g} {hi:g}" damping="2"/>'
            f'<geom type="box" size="0.012 {w:g} {fl:g}" rgba="0.25 0.25 0.28 1" mass="0.02" friction="1.5 0.005 0.0001"/>'
            "</body>"
        )
    palm_z = cfg.finger_length + 0.01
    return (
        '<body name="ee" pos="0 0 0" gravcomp="1">'
        f'<joint name="ee_x" type="slide" axis="1 0 0" range="{-ws:g} {ws:g}" damping="5"/>'
        f'<joint name="ee_y" type="slide" axis="0 1 0" range="{-ws:g} {ws:g}" damping="5"/>'
        f'<joint name="ee_z" type="slide" axis="0 0 1" range="0 {cfg.ee_z_max:g}" damping="5"/>'
        f'<geom name="palm" type="box" pos="0 0 {palm_z:g}" size="0.015 {cfg.finger_offset + w:g} 0.01" '
        'rgba="0.3 0.3 0.35 1" mass="0.5"/>'
        '<site name="ee_tip" pos="0 0 0" size="0.005" rgba="1 1 1 0"/>' + "".join(fingers) + "</body>"
    )


def build_scene_xml(cfg: SceneConfig | None = None) -> str:
    """Return the MJCF string of the tabletop scene described by ``cfg``."""
    cfg = cfg or SceneConfig()
    ws = cfg.workspace_half
    size = cfg.image_size
    blocks = "".join(_block_xml(c, cfg) for c in cfg.colours)
    distractors = "".join(_distractor_xml(d) for d in cfg.distractors)
    actuators = (
        f'<position name="act_x" joint="ee_x" kp="{cfg.arm_kp:g}" dampratio="1" ctrlrange="{-ws:g} {ws:g}"/>'
        f'<position name="act_y" joint="ee_y" kp="{cfg.arm_kp:g}" dampratio="1" ctrlrange="{-ws:g} {ws:g}"/>'
        f'<position name="act_z" joint="ee_z" kp="{cfg.arm_kp:g}" dampratio="1" ctrlrange="0 {cfg.ee_z_max:g}"/>'
        f'<position name="act_left" joint="left_finger_joint" kp="{cfg.finger_kp:g}" '
        f'ctrlrange="{-cfg.finger_travel:g} 0" forcerange="-10 10"/>'
        f'<position name="act_right" joint="right_finger_joint" kp="{cfg.finger_kp:g}" '
        f'ctrlrange="0 {cfg.finger_travel:g}" forcerange="-10 10"/>'
    )
    return f"""<mujoco model="mmrl_tabletop">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{cfg.timestep:g}" integrator="implicitfast"/>
  <visual>
    <global offwidth="{size}" offheight="{size}"/>
    <quality shadowsize="0" offsamples="0"/>
    <headlight ambient="0.45 0.45 0.45" diffuse="0.5 0.5 0.5" specular="0 0 0"/>
  </visual>
  <worldbody>
    <light name="top" pos="0 0 1.5" dir="0 0 -1" directional="true" castshadow="false" diffuse="0.4 0.4 0.4"/>
    <camera name="front" pos="0 -0.6 0.45" xyaxes="1 0 0 0 0.6 0.8" fovy="45"/>
    <camera name="top" pos="0 0 0.8" xyaxes="1 0 0 0 1 0" fovy="45"/>
    <geom name="table" type="box" pos="0 0 -0.02" size="{cfg.table_half:g} {cfg.table_half:g} 0.02" rgba="0.62 0.52 0.40 1"/>
    <body name="pad" pos="0 0 0.0005">
      <geom name="pad" type="box" size="{cfg.pad_half:g} {cfg.pad_half:g} 0.0005" rgba="{_fmt(PAD_RGBA)}" contype="0" conaffinity="0"/>
    </body>
    {_gripper_xml(cfg)}
    {blocks}
    {distractors}
  </worldbody>
  <actuator>{actuators}</actuator>
</mujoco>
"""
