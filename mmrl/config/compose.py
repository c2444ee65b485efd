"""Composition: the packaged ``configs/`` folder (and the plugins' presets) composed with Hydra under the command
line's overrides (:func:`compose_dict`), then validated into a :class:`RunConfig` (:func:`build_run_config`);
:func:`load_config` does both."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from mmrl.config.coercion import coerce, from_dict, numbers_as_typed, short_repr
from mmrl.config.deprecated import nest_deprecated_keys, renamed_overrides
from mmrl.config.overrides import (
    CONFIG_GROUPS,
    greedy_override_means_one_sample,
    number_texts,
    parse_override,
    plugins_named,
)
from mmrl.config.schema import AgentConfig, AlgoConfig, RewardConfig, RunConfig, TrainerConfig
from mmrl.config.validate import validate_algo, validate_sampling, validate_trainer
from mmrl.errors import ConfigError, suggest


def configs_dir() -> Path:
    """The packaged configs folder (works from any working directory)."""
    import mmrl.configs

    return Path(mmrl.configs.__file__).parent


def group_options(group: str) -> list[str]:
    """The YAML options available in a config group: the packaged ones and the plugins' (:mod:`mmrl.plugins`)."""
    from mmrl.plugins import config_dirs

    return sorted({p.stem for d in (configs_dir(), *config_dirs()) for p in (d / group).glob("*.yaml")})


def _registered_task_selection(overrides: list[str]) -> list[str]:
    """``task=<name>`` for a task registered in code (a plugin's, :func:`mmrl.tasks.register_task`) with no preset
    file: the root config's task preset (``toy_arithmetic``, which also sets model keys) and, unless ``model=`` is
    given, its model preset (``tiny_lm``) are dropped, ``task.name`` is set, and ``model.type`` is the task's first
    declared ``model_types`` (unless given): the task and model compose from their own dataclass defaults, with no
    fields of another task's or model's preset. Other overrides are returned unchanged."""
    from mmrl.tasks import TASKS, get_task_class

    keys = {ov.split("=", 1)[0] for ov in overrides if "=" in ov}
    picked = [ov.split("=", 1)[1] for ov in overrides if ov.startswith("task=")]
    if len(picked) != 1 or picked[0] in group_options("task") or picked[0] not in TASKS:
        return overrides
    name = picked[0]
    out = [ov for ov in overrides if not ov.startswith("task=")]
    out += ["~task", f"++task.name={name}"] if not any(k.startswith("~task") for k in keys) else [f"++task.name={name}"]
    if "model" not in keys:
        types = get_task_class(name).model_types
        if not any(k.startswith("~model") for k in keys):
            out.append("~model")
        if types and "model.type" not in keys:
            out.append(f"++model.type={types[0]}")
    return out


def _normalise_override(ov: str) -> str:
    """Group selections stay as they are; plain keys become Hydra force-adds (`++key=value`) so that
    unknown keys reach our validator, which names them with the valid choices."""
    if ov.startswith(("+", "~")) or "=" not in ov:
        return ov
    key = ov.split("=", 1)[0]
    if key in CONFIG_GROUPS:
        return ov
    return "++" + ov


def resolved_dict(conf: Any) -> dict:
    """The OmegaConf config as a plain dict with interpolations resolved; a ConfigError naming the key whose
    ``${...}`` cannot be resolved (or any other OmegaConf error) otherwise."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(conf, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = (str(getattr(e, "msg", "") or e).splitlines() or [type(e).__name__])[0]
        hint = " (text that starts with '${' is written '\\${')" if "Interpolation" in type(e).__name__ else ""
        raise ConfigError(f"{key + ': ' if key else ''}{msg}{hint}") from None


def compose_dict(overrides: list[str] | None = None) -> dict:
    """Compose the raw config with Hydra and return it as a plain dict. Every override is checked first on its own
    (:func:`parse_override`, group options), so an error names the override as the user typed it. Deprecated flat
    keys, in the overrides or in a preset, come back under their nested names (:mod:`mmrl.config.deprecated`); an
    override's value wins over a preset's under the old name."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    from mmrl.plugins import config_dirs, load_plugins
    from mmrl.tasks import TASKS

    overrides = renamed_overrides(list(overrides or []))
    load_plugins(plugins_named(overrides))  # before group options and task names are looked up
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override '{ov}' is not of the form key=value")
        key, value = ov.split("=", 1)
        if key in CONFIG_GROUPS:
            options = group_options(key)
            if key == "task" and value not in options and value in TASKS:
                continue  # a task registered in code, without a preset file (_registered_task_selection)
            if value not in options:
                plugin = " (one from outside mmrl: install its plugin package or name it in plugins=[module])"
                raise ConfigError(
                    f"unknown {key} '{value}'{suggest(value, options)}; valid choices: {', '.join(options)}"
                    + (plugin if key in ("task", "model") else "")
                )
        elif not key.startswith("~"):
            parse_override(ov)
    composed = [_normalise_override(o) for o in _registered_task_selection(overrides)]
    if config_dirs():  # the plugins' presets, searched after the packaged configs
        import json

        composed.append("hydra.searchpath=[" + ",".join(json.dumps(f"file://{d}") for d in config_dirs()) + "]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(configs_dir()), version_base=None):
            cfg = compose("config", overrides=composed)
    except HydraException as e:
        raise ConfigError(str(e).split("\n")[0].replace("'++", "'")) from None
    finally:
        GlobalHydra.instance().clear()
    given = {ov.partition("=")[0].lstrip("+") for ov in overrides if "=" in ov and not ov.startswith("~")}
    return nest_deprecated_keys(resolved_dict(cfg), given)


def _section(raw: dict, key: str) -> dict:
    """Top-level section ``key`` of a raw config: a mapping (absent or null: empty); ConfigError otherwise."""
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{key}: expected a mapping of {key} fields (set them as {key}.FIELD=VALUE), got {short_repr(value)}"
        )
    return dict(value)


_TOP_KEYS = ("task", "model", "algo", "trainer", "reward", "agent", "checkpoint", "plugins")
"""The sections and keys of a run config (:class:`RunConfig`), in the order the errors list them."""


def build_run_config(raw: dict, *, texts: dict[str, str] | None = None) -> RunConfig:
    """Validate a composed dict into a :class:`RunConfig` (deprecated flat keys moved to their nested places first,
    :func:`~mmrl.config.deprecated.nest_deprecated_keys`): every value is checked against its field's type before
    any of it is used (the task name and model type are registry keys, so they are checked first). ``texts``: the
    command-line text of overrides that read as numbers (:func:`~mmrl.config.coercion.numbers_as_typed`)."""
    from mmrl.models.registry import model_config_class
    from mmrl.plugins import load_plugins, plugin_path
    from mmrl.tasks import get_task_class

    if not isinstance(raw, dict):
        raise ConfigError(f"a run config is a mapping of {', '.join(_TOP_KEYS)}; got {short_repr(raw)}")
    nest_deprecated_keys(raw)  # a saved config.yaml or a hand-built dict of an earlier release
    for key in raw:
        if key not in _TOP_KEYS:
            raise ConfigError(f"unknown key '{key}'; valid top-level keys: {', '.join(_TOP_KEYS)}")
    plugins = [plugin_path(p) for p in coerce(raw.get("plugins") or [], list[str], "plugins")]
    load_plugins(plugins)  # before the task name and model type are looked up (mmrl eval of a plugin's run)
    with numbers_as_typed(texts):
        task_raw = _section(raw, "task")
        if "name" not in task_raw:
            raise ConfigError("task.name is missing: select a task with task=<name> (see `mmrl tasks`)")
        try:
            task_cls = get_task_class(coerce(task_raw["name"], str, "task.name"))
        except ConfigError as e:
            raise ConfigError(str(e) if str(e).startswith("task.name") else f"task.name: {e}") from None
        model_raw = _section(raw, "model")
        if "type" not in model_raw:
            raise ConfigError("model.type is missing: select a model preset with model=<name>")
        model_cls = model_config_class(coerce(model_raw["type"], str, "model.type"))
        if task_cls.model_types and model_raw["type"] not in task_cls.model_types:
            raise ConfigError(
                f"model.type={model_raw['type']} cannot run task {task_raw['name']}, which takes model.type="
                f"{' or '.join(task_cls.model_types)}; pick a model preset of that type (model=<name>, see configs/model)"
            )
        cfg = RunConfig(
            task=from_dict(task_cls.config_cls, task_raw, "task"),
            model=from_dict(model_cls, model_raw, "model"),
            algo=from_dict(AlgoConfig, raw.get("algo"), "algo"),
            trainer=from_dict(TrainerConfig, raw.get("trainer"), "trainer"),
            checkpoint=coerce(raw.get("checkpoint"), typing.get_type_hints(RunConfig)["checkpoint"], "checkpoint"),
            reward=from_dict(RewardConfig, raw.get("reward"), "reward"),
            agent=from_dict(AgentConfig, raw.get("agent"), "agent"),
            plugins=plugins,
        )
    validate_algo(cfg.algo)
    validate_trainer(cfg.trainer)
    validate_sampling(cfg.model)
    return cfg


def load_config(overrides: list[str] | None = None) -> RunConfig:
    """Compose ``configs/`` with Hydra-style ``key=value`` overrides and validate it."""
    overrides = renamed_overrides(list(overrides or []))
    raw = compose_dict(overrides)
    greedy_override_means_one_sample(raw, overrides)
    return build_run_config(raw, texts=number_texts(overrides))
