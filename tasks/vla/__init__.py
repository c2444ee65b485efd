"""VLA tasks (tabletop, robosuite, Meta-World, LIBERO) and their shared base (``tasks/vla/base.py``)."""
