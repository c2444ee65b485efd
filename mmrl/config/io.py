"""A run folder's ``config.yaml``: writing the resolved config, reading it back (with ``mmrl eval``'s overrides on
top), and the section defaults a resume compares it with."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mmrl.config.coercion import to_dict
from mmrl.config.compose import build_run_config, resolved_dict
from mmrl.config.deprecated import nest_deprecated_keys, renamed_overrides
from mmrl.config.overrides import CONFIG_GROUPS, greedy_override_means_one_sample, number_texts, parse_override
from mmrl.config.schema import RunConfig
from mmrl.errors import ConfigError


def config_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML, in the fields' order (a run folder's ``config.yaml``)."""
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (:func:`config_yaml`)."""
    Path(path).write_text(config_yaml(cfg))


def load_saved_config(path: str | Path) -> RunConfig:
    """Read a config saved by :func:`save_config`."""
    import yaml

    return build_run_config(yaml.safe_load(Path(path).read_text()))


def trained_with(saved: dict) -> str:
    """``task=A model=B`` (plus ``(path P)`` when the model path is not the preset name) of a saved config dict."""
    task = (saved.get("task") or {}).get("name", "?")
    model = saved.get("model") or {}
    name, path = model.get("name") or model.get("type", "?"), model.get("path")
    return f"task={task} model={name}" + (f" (path {path})" if path and str(path) != str(name) else "")


def load_run_config(run_dir: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """The config a run was trained with (``<run_dir>/config.yaml``, written by :func:`save_config`) with command-line
    ``key=value`` overrides merged on top (read as ``mmrl train`` reads them, :func:`parse_override`), validated like
    :func:`load_config` (an unknown key is the usual :class:`ConfigError`). Used by ``mmrl eval checkpoint=<run>``
    (docs/evaluation.md).

    Group selections: ``task=X`` / ``model=Y`` equal to the run's are no-ops; others raise ConfigError naming the
    task and model the run was trained with (its weights belong to that model). ``algo=`` / ``trainer=`` presets
    are refused (set their fields instead). FileNotFoundError: the run has no readable config.yaml."""
    import yaml
    from omegaconf import OmegaConf

    path = Path(run_dir) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise FileNotFoundError(f"{path}: {type(e).__name__}") from None
    if (
        not isinstance(saved, dict)
        or not isinstance(saved.get("task"), dict)
        or not isinstance(saved.get("model"), dict)
    ):
        raise FileNotFoundError(f"{path}: not a run config saved by mmrl")
    nest_deprecated_keys(saved)  # a run folder of an earlier release: flat trainer keys
    overrides = renamed_overrides(list(overrides or []))
    updates = []
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override '{ov}' is not of the form key=value")
        key, value = ov.split("=", 1)
        key = key.lstrip("+")
        if key.startswith("~"):
            raise ConfigError(
                f"'{ov}': deleting keys is not supported on a saved run config; set {key[1:]}=null instead"
            )
        if key in ("task", "model"):
            own = saved[key].get("name")
            if value != own:
                raise ConfigError(
                    f"checkpoint {run_dir} was trained with {trained_with(saved)}; it does not fit "
                    f"{key}={value}: drop {key}= to evaluate it with its own {key}"
                )
            continue
        if key in CONFIG_GROUPS:
            raise ConfigError(
                f"'{ov}': a {key} preset cannot be applied on top of the run's saved config; "
                f"set its fields instead ({key}.FIELD=VALUE)"
            )
        updates.append((ov, *parse_override(ov)))  # the grammar of `mmrl train`, and its one-line errors
    conf = OmegaConf.create(saved)
    for ov, key, value in updates:
        try:
            OmegaConf.update(conf, key, value, merge=True, force_add=True)
        except Exception as e:  # noqa: BLE001 - OmegaConf refuses the update (e.g. a field below a scalar): one line
            raise ConfigError(
                f"{ov}: cannot apply it to {path}: {(str(e).splitlines() or [type(e).__name__])[0]}"
            ) from None
    raw = resolved_dict(conf)
    greedy_override_means_one_sample(raw, [o.lstrip("+") for o in overrides])
    return build_run_config(raw, texts=number_texts([ov for ov, _, _ in updates]))


def field_defaults(cfg: Any) -> dict:
    """The defaults of ``cfg``'s config sections as :func:`to_dict` writes them: every dataclass section rebuilt from
    its class (a class with a field without a default is left out), every plain top-level field's own default. A
    resume compares a run's saved config.yaml with the new config; a key the saved file lacks (a field added in a
    newer mmrl) is no change when the new value is this default."""
    out: dict = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            try:
                out[f.name] = to_dict(type(value)())
            except TypeError:  # a section whose class needs arguments: no defaults known
                continue
        elif f.default is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default_factory())
    return out
