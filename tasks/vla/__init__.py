"""VLA tasks (tabletop, robosuite, Meta-World, LIBERO) and their shared base (``tasks/vla/base.py``)."""

TASKS = {
    "vla_reach": "mmrl.tasks.vla.vla_reach:VLAReachTask",
    "vla_lift": "mmrl.tasks.vla.vla_lift:VLALiftTask",
    "metaworld": "mmrl.tasks.vla.metaworld:MetaWorldTask",
    "libero": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_spatial": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_object": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_goal": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_10": "mmrl.tasks.vla.libero:LiberoTask",
    "libero_90": "mmrl.tasks.vla.libero:LiberoTask",
}
