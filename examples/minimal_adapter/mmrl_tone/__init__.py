"""mmrl plugin: the minimal custom adapter (a tone-classification task and a tiny MLP token policy).

Importing this package registers, in mmrl's registries:

* ``task=tone_class``: :class:`mmrl_tone.tone_task.ToneTask`;
* ``model.type=tone_mlp``: :class:`mmrl_tone.tone_policy.ToneModelConfig` built by
  :func:`mmrl_tone.tone_policy.build_tone_policy` (no memory model: ``mmrl plan`` says in one line that it cannot
  size it);
* the presets in ``configs/`` (``task/tone_class.yaml``: the training settings that make it learn in ~100 steps,
  ``model/tone_mlp.yaml``).

mmrl imports it through the ``mmrl.plugins`` entry point of this package's pyproject.toml once it is installed, or
when a run names it (``plugins=[mmrl_tone]``). Registration stores ``module:attribute`` strings: the task and policy
modules (and torch) are imported only when a run builds them.
"""

from pathlib import Path

from mmrl.models.registry import register_model_type
from mmrl.plugins import register_config_dir
from mmrl.tasks import register_task

register_task("tone_class", "mmrl_tone.tone_task:ToneTask")
register_model_type("tone_mlp", "mmrl_tone.tone_policy:ToneModelConfig", "mmrl_tone.tone_policy:build_tone_policy")
register_config_dir(Path(__file__).parent / "configs")
