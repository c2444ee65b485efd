"""Typed run configuration, composed with Hydra from the packaged ``configs/`` folder.

The YAML groups (``task/``, ``model/``, ``algo/``, ``trainer/``) are composed by Hydra, then validated
into the dataclasses of :mod:`~mmrl.config.schema`; every field carries a docstring (shown by ``mmrl train --help``).
An unknown key or group option raises :class:`ConfigError` naming the bad key and the valid choices; so does a value
of the wrong type for its field (every value is checked against its annotation before anything reads it), and an
override whose value the override grammar cannot read, with the quoted form to type instead
(``'trainer.run_name="café"'``).

The modules, each importing only those above it:

- :mod:`~mmrl.config.schema`: the dataclasses (``RunConfig``, ``AlgoConfig``, ``TrainerConfig``, ...);
- :mod:`~mmrl.config.docstrings`: the fields' docstrings and the ``--help`` lines;
- :mod:`~mmrl.config.overrides`: the ``key=value`` override grammar and the rules over the override list;
- :mod:`~mmrl.config.deprecated`: the flat trainer keys of earlier releases, mapped to their nested keys;
- :mod:`~mmrl.config.coercion`: values checked against the annotations (``from_dict`` / ``to_dict``);
- :mod:`~mmrl.config.validate`: checks against the registries and across fields;
- :mod:`~mmrl.config.compose`: Hydra composition and ``load_config``;
- :mod:`~mmrl.config.io`: a run folder's ``config.yaml``, written and read back.

Everything public is re-exported here: ``from mmrl.config import load_config``.
"""

from mmrl.config.coercion import from_dict, to_dict
from mmrl.config.compose import build_run_config, compose_dict, configs_dir, group_options, load_config
from mmrl.config.deprecated import DEPRECATED_KEYS
from mmrl.config.docstrings import describe_fields, field_docs
from mmrl.config.io import config_yaml, field_defaults, load_run_config, load_saved_config, save_config, trained_with
from mmrl.config.overrides import CONFIG_GROUPS, parse_override, quoted_override
from mmrl.config.schema import (
    OVER_TURN_MODES,
    AgentConfig,
    AlgoConfig,
    CheckpointingConfig,
    EvalConfig,
    FSDPConfig,
    LimitsConfig,
    LoggingConfig,
    OptimConfig,
    RewardConfig,
    RunConfig,
    TGRPOConfig,
    TrainerConfig,
    WarmStartConfig,
)
from mmrl.config.validate import validate_algo, validate_sampling, validate_trainer
from mmrl.errors import ConfigError, check_choice

__all__ = [
    "CONFIG_GROUPS",
    "DEPRECATED_KEYS",
    "OVER_TURN_MODES",
    "AgentConfig",
    "AlgoConfig",
    "CheckpointingConfig",
    "ConfigError",
    "EvalConfig",
    "FSDPConfig",
    "LimitsConfig",
    "LoggingConfig",
    "OptimConfig",
    "RewardConfig",
    "RunConfig",
    "TGRPOConfig",
    "TrainerConfig",
    "WarmStartConfig",
    "build_run_config",
    "check_choice",
    "compose_dict",
    "config_yaml",
    "configs_dir",
    "describe_fields",
    "field_defaults",
    "field_docs",
    "from_dict",
    "group_options",
    "load_config",
    "load_run_config",
    "load_saved_config",
    "parse_override",
    "quoted_override",
    "save_config",
    "to_dict",
    "trained_with",
    "validate_algo",
    "validate_sampling",
    "validate_trainer",
]
