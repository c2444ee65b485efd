"""Reward functions given by the user in the config (``reward.fns``, docs/rewards.md).

A spec is one of::

    my_rewards.py:short_answer        a function in a Python file (path relative to the working directory)
    my_pkg.rewards:short_answer       a function in an importable module
    http://127.0.0.1:8000/score       a remote reward (mmrl.rewards.remote)

User functions have TRL's signature ``fn(prompts, completions, **columns) -> list[float | None]`` and get
the completion *text* (a sample dict's ``"text"``), as TRL's GRPOTrainer passes it, so a TRL reward works
unchanged; samples without text (diffusion images, VLA episodes) are passed as they are. A function
without ``**kwargs`` gets only the columns it names. A bad spec is a :class:`~mmrl.errors.ConfigError`
raised when the trainer is built.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Callable

from mmrl.errors import ConfigError
from mmrl.rewards.manager import RewardSpec
from mmrl.rewards.remote import RemoteReward

_FORMS = ("give FILE.py:FUNCTION (a path relative to the working directory), MODULE:FUNCTION, "
          "or an http(s):// URL")


def completion_text(sample):
    """What a user reward receives for one sample: its text, or the sample itself when it has none."""
    if isinstance(sample, dict) and isinstance(sample.get("text"), str):
        return sample["text"]
    return sample


def text_adapter(fn: Callable, name: str | None = None) -> Callable:
    """Wrap a TRL-style reward so it gets completion texts (and only the columns it accepts)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = []
    takes_all = not params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                  inspect.Parameter.KEYWORD_ONLY)}

    @functools.wraps(fn)
    def reward(prompts, completions, **columns):
        if not takes_all:
            columns = {k: v for k, v in columns.items() if k in named}
        return fn(prompts, [completion_text(c) for c in completions], **columns)

    if name:
        reward.__name__ = name
    return reward


def _is_url(spec: str) -> bool:
    return spec.lower().startswith(("http://", "https://"))


def url_name(url: str) -> str:
    """A metric-friendly name of a remote reward: host (and port) + path, e.g. ``127.0.0.1_8000_score``."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}{parts.path}")
    return name.strip("_") or "remote"


def _load_file(path_text: str, spec: str):
    path = Path(os.path.expanduser(path_text))
    full = path if path.is_absolute() else Path.cwd() / path
    if not full.is_file():
        raise ConfigError(f"reward.fns: '{spec}': file '{path_text}' not found (looked for {full}; relative paths are "
                          f"taken from the working directory {Path.cwd()}); fix the path or {_FORMS}")
    full = full.resolve()
    mod_name = f"mmrl_user_reward_{re.sub(r'[^0-9A-Za-z_]', '_', full.stem)}_{hashlib.sha1(str(full).encode()).hexdigest()[:8]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    mspec = importlib.util.spec_from_file_location(mod_name, full)
    if mspec is None or mspec.loader is None:
        raise ConfigError(f"reward.fns: '{spec}': '{path_text}' cannot be loaded as Python; give a .py file")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[mod_name] = module
    try:
        mspec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[mod_name]
        raise ConfigError(f"reward.fns: '{spec}': running {full} failed ({type(e).__name__}: {e}); "
                          "fix the file (try `python <file>`)") from e
    return module


def _load_module(mod_text: str, spec: str):
    try:
        return importlib.import_module(mod_text)
    except ModuleNotFoundError as e:
        raise ConfigError(f"reward.fns: '{spec}': module '{mod_text}' is not importable ({e}); install it or put its "
                          f"folder on PYTHONPATH, or give a file path like ./{mod_text.replace('.', '/')}.py:FUNCTION") from e
    except Exception as e:
        raise ConfigError(f"reward.fns: '{spec}': importing module '{mod_text}' failed ({type(e).__name__}: {e})") from e


def resolve_fn(spec: str) -> tuple[str, Callable]:
    """``(name, callable)`` of a ``FILE.py:FUNCTION`` or ``MODULE:FUNCTION`` spec; ConfigError if it is bad."""
    if ":" not in spec:
        raise ConfigError(f"reward.fns: '{spec}' names no function; {_FORMS}")
    target, fn_name = spec.rsplit(":", 1)
    if not target or not fn_name.isidentifier():
        raise ConfigError(f"reward.fns: '{spec}': '{fn_name}' is not a function name; {_FORMS}")
    is_file = target.endswith(".py") or "/" in target or os.sep in target or target.startswith(("~", "."))
    module = _load_file(target, spec) if is_file else _load_module(target, spec)
    if not hasattr(module, fn_name):
        funcs = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"reward.fns: '{spec}': {target} has no function '{fn_name}'"
                          + (f"; functions defined there: {', '.join(funcs)}" if funcs else ""))
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise ConfigError(f"reward.fns: '{spec}': '{fn_name}' in {target} is a {type(fn).__name__}, not a function; "
                          "give a function fn(prompts, completions, **columns) -> list[float | None]")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = None
    if params is not None:
        positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                      inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 2 and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            raise ConfigError(f"reward.fns: '{spec}': {fn_name}{inspect.signature(fn)} must take (prompts, completions, "
                              "**columns) and return one float or None per completion")
    return fn_name, fn


def user_reward_specs(reward_cfg) -> list[RewardSpec]:
    """The RewardSpecs of ``reward.fns`` (names as given by the functions / URLs, not yet made unique)."""
    weights = list(reward_cfg.weights) or [1.0] * len(reward_cfg.fns)
    if len(weights) != len(reward_cfg.fns):
        raise ConfigError(f"reward.weights has {len(weights)} values for {len(reward_cfg.fns)} reward.fns")
    specs = []
    for spec, w in zip(reward_cfg.fns, weights):
        spec = str(spec).strip()
        if _is_url(spec):
            fn = RemoteReward(spec, timeout_s=reward_cfg.timeout_s, max_retries=reward_cfg.max_retries,
                              max_concurrency=reward_cfg.max_concurrency, batch_size=reward_cfg.batch_size)
            specs.append(RewardSpec(url_name(spec), fn, float(w)))
        else:
            name, fn = resolve_fn(spec)
            specs.append(RewardSpec(name, text_adapter(fn, name), float(w)))
    return specs


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    k = 2
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def compose_reward_specs(task_specs: list[RewardSpec], reward_cfg) -> list[RewardSpec]:
    """The task's reward specs plus (``reward.mode=add``) or instead of (``replace``) the user's ``reward.fns``.

    User rewards whose names clash with a task reward or with each other get a ``_2``, ``_3``... suffix.
    Without ``reward.fns`` the task's specs are returned unchanged.
    """
    if reward_cfg is None or not reward_cfg.fns:
        return list(task_specs)
    user = user_reward_specs(reward_cfg)
    kept = list(task_specs) if reward_cfg.mode == "add" else []
    taken = {s.name for s in kept}
    for s in user:
        s.name = _unique(s.name, taken)
        taken.add(s.name)
    return kept + user
