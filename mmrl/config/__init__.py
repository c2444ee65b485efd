"""The run configuration (interim: the whole former ``mmrl/config.py`` lives in :mod:`mmrl.config.schema` until the
next commit splits it)."""

from mmrl.config.schema import *  # noqa: F403
from mmrl.config.schema import _coerce  # noqa: F401
