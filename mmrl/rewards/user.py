"""Reward functions given by the user in the config (``reward.fns``, docs/rewards.md).

A spec is one of::

    my_rewards.py:short_answer        a function in a Python file (path relative to the working directory)
    my_pkg.rewards:short_answer       a function in an importable module
    http://127.0.0.1:8000/score       a remote reward (mmrl.rewards.remote)

User functions are called exactly as TRL's GRPOTrainer calls reward functions (:class:`TrlReward`): by
keyword, ``fn(prompts=..., completions=..., completion_ids=..., **columns, trainer_state=..., log_extra=...,
log_metric=...) -> list[float | None]``, with the completions as text or as conversational messages
(``reward.completion_format``); a function without ``**kwargs`` gets only the arguments it names. Samples
without text (diffusion images, VLA episodes) are passed as they are. A *factory* (``trl.rewards:
get_soft_overlong_punishment``) is called once with its ``reward.fn_kwargs``. A bad spec is a
:class:`~mmrl.errors.ConfigError` raised when the trainer is built.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mmrl.errors import ConfigError
from mmrl.rewards.config import RewardConfig
from mmrl.rewards.manager import RewardError, RewardSpec, new_trainer_state
from mmrl.rewards.remote import RemoteReward

_FORMS = "give FILE.py:FUNCTION (a path relative to the working directory), MODULE:FUNCTION, or an http(s):// URL"


_REWARD_FN = "a function fn(completions, **kwargs) -> list[float | None] (TRL's protocol)"

_REWARD_INPUTS = ("prompts", "completions", "completion_ids")  # a callable taking none of these is a factory
_NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # TRL never passes these item keys as columns


def completion_text(sample):
    """What a user reward receives for one sample: its text, or the sample itself when it has none."""
    if isinstance(sample, dict) and isinstance(sample.get("text"), str):
        return sample["text"]
    return sample


def completion_ids_of(sample):
    """The sampled token ids of one completion (a list of ints), or None when the sample has none."""
    ids = sample.get("completion_ids") if isinstance(sample, dict) else None
    return list(ids) if ids is not None else None


def is_conversational(prompt) -> bool:
    """TRL's test of a conversational prompt: a list of messages, the first a dict with a ``role``."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def as_trl_inputs(prompts: list, completions: list, completion_format: str = "auto") -> tuple[list, list]:
    """``(prompts, completions)`` as TRL would pass them to a reward function.

    ``text``: completion texts (str). ``conversational``: each completion ``[{"role": "assistant", "content":
    text}]`` and each plain-text prompt ``[{"role": "user", "content": prompt}]``. ``auto``: conversational when
    the prompts are (TRL's rule), else text. Samples without text (images, episodes) are passed as they are.
    """
    texts = [completion_text(c) for c in completions]
    conversational = completion_format == "conversational" or (
        completion_format == "auto" and bool(prompts) and is_conversational(prompts[0])
    )
    if not conversational:
        return list(prompts), texts
    prompts = [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]  # messages stay
    return prompts, [[{"role": "assistant", "content": t}] if isinstance(t, str) else t for t in texts]


@dataclass
class _Params:
    """What a function accepts by keyword: its named parameters, the required ones, and whether it takes **kwargs."""

    names: set[str]
    required: list[str]
    takes_all: bool
    positional_only: list[str]


def _params(fn: Callable) -> _Params | None:
    """The keyword interface of ``fn``, or None when Python cannot tell (some builtins)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    kw_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return _Params(
        names={p.name for p in params if p.kind in kw_kinds},
        required=[p.name for p in params if p.kind in kw_kinds and p.default is inspect.Parameter.empty],
        takes_all=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
        positional_only=[
            p.name
            for p in params
            if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is inspect.Parameter.empty
        ],
    )


def _await(result):
    """The value of ``result``, awaited if the function was ``async`` (TRL runs async reward functions too)."""
    if not inspect.isawaitable(result):
        return result
    import asyncio

    async def wait():
        return await result

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop here (a script, the trainer): run it
        return asyncio.run(wait())
    from concurrent.futures import ThreadPoolExecutor  # inside a running loop (a notebook): another thread

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


_DEFAULT_STATE = None


def _default_trainer_state():
    """The ``trainer_state`` of a call outside a :class:`~mmrl.rewards.manager.RewardManager` (made once)."""
    global _DEFAULT_STATE
    if _DEFAULT_STATE is None:
        _DEFAULT_STATE = new_trainer_state()
    return _DEFAULT_STATE


class TrlReward:
    """A user reward called exactly as TRL's GRPOTrainer calls it: by keyword, with ``prompts``, ``completions``,
    ``completion_ids``, the task's columns, ``trainer_state``, ``log_extra`` and ``log_metric`` (a function without
    ``**kwargs`` gets only the ones it names). The manager calls it as ``reward(prompts, samples, **columns)``.

    ``columns_as``: extra names for task columns (``{"solution": "answer"}`` passes ``answer`` also as ``solution``).
    ``fixed``: keyword arguments added to every call (``reward.fn_kwargs`` of a function that is not a factory).
    """

    def __init__(
        self,
        fn: Callable,
        name: str,
        source: str | None = None,
        *,
        completion_format: str = "auto",
        columns_as: dict | None = None,
        fixed: dict | None = None,
    ) -> None:
        self.fn = fn
        self.__name__ = name
        self.source = source or name
        self.completion_format = completion_format
        self.columns_as = dict(columns_as or {})
        self.fixed = dict(fixed or {})
        self.params = _params(fn)
        functools.update_wrapper(self, fn, assigned=("__doc__", "__module__"), updated=())

    def keywords(self, prompts: list, completions: list, columns: dict, ctx=None) -> dict:
        """The keyword arguments of one call, as TRL builds them (then filtered to what the function accepts)."""
        kw = {k: v for k, v in columns.items() if k not in _NOT_COLUMNS}
        kw.update({alias: columns[col] for alias, col in self.columns_as.items() if col in columns})
        trl_prompts, trl_completions = as_trl_inputs(prompts, completions, self.completion_format)
        kw.update(
            trainer_state=ctx.trainer_state if ctx is not None else _default_trainer_state(),
            log_extra=ctx.log_extra if ctx is not None else _ignore,
            log_metric=ctx.log_metric if ctx is not None else _ignore,
            **self.fixed,
        )
        kw.update(
            prompts=trl_prompts, completions=trl_completions, completion_ids=[completion_ids_of(c) for c in completions]
        )
        if self.params is not None and not self.params.takes_all:
            kw = {k: v for k, v in kw.items() if k in self.params.names}
        return kw

    def _check_required(self, kw: dict, columns: dict) -> None:
        """RewardError naming the parameters the function requires but no column provides."""
        missing = [p for p in (self.params.required if self.params else []) if p not in kw]
        if missing:
            have = sorted(set(columns) - set(_NOT_COLUMNS)) + sorted(self.columns_as)
            raise RewardError(
                f"reward function '{self.__name__}' ({self.source}) needs {', '.join(map(repr, missing))}, which the "
                f"task does not pass (its columns: {', '.join(have) or 'none'}); pass a task column under that name "
                f"with 'reward.columns={{{missing[0]}: COLUMN}}' or give a fixed value in reward.fn_kwargs"
            )

    def call_with_context(self, prompts: list, completions: list, columns: dict, ctx=None) -> list:
        """Call the function on one batch (``ctx``: the manager's trainer_state / log_extra / log_metric)."""
        kw = self.keywords(prompts, completions, columns, ctx)
        self._check_required(kw, columns)
        return _await(self.fn(**kw))

    def __call__(self, prompts: list, completions: list, **columns) -> list:
        return self.call_with_context(prompts, completions, columns)

    def __repr__(self) -> str:
        return f"TrlReward({self.source})"


def _ignore(*args, **kwargs) -> None:
    """``log_extra`` / ``log_metric`` outside a manager: dropped."""


# ---------------------------------------------------------------- factories


def _is_factory(params: _Params | None) -> bool:
    """A callable that TRL could not call as a reward (no prompts / completions / completion_ids, no **kwargs)."""
    return params is not None and not params.takes_all and not (params.names & set(_REWARD_INPUTS))


def _fn_kwargs_hint(names: list[str]) -> str:
    return "'reward.fn_kwargs=[{" + ",".join(f"{n}:VALUE" for n in names) + "}]'"


def make_reward_fn(fn: Callable, spec: str, fn_name: str, kwargs: dict | None) -> tuple[Callable, dict, str]:
    """The reward function of a spec, its fixed keyword arguments and its metric name.

    A *factory* (a callable without ``prompts`` / ``completions`` / ``completion_ids`` / ``**kwargs``, e.g.
    ``trl.rewards:get_soft_overlong_punishment``) is called once with ``kwargs`` and its result is the reward; one
    that needs arguments it was not given is a ConfigError naming them; the reward's name is its ``__name__`` (as in
    TRL), else the factory's. For a reward function, ``kwargs`` are fixed keyword arguments of every call.
    ConfigError when the result cannot be called as TRL calls rewards.
    """
    kwargs = dict(kwargs or {})
    params = _params(fn)
    if _is_factory(params):
        _check_kwargs(params, kwargs, spec, fn_name, factory=True)
        try:
            made = fn(**kwargs)
        except Exception as e:
            raise ConfigError(
                f"reward.fns: '{spec}': calling the reward factory {fn_name}(**{kwargs}) failed "
                f"({type(e).__name__}: {e})"
            ) from e
        if not callable(made):
            raise ConfigError(
                f"reward.fns: '{spec}': {fn_name}{inspect.signature(fn)} takes no prompts, completions, "
                f"completion_ids or **kwargs, so it was called as a reward factory, but it returned "
                f"{type(made).__name__}, not a function; give a function fn(completions, **kwargs) -> "
                "list[float | None], or a factory returning one"
            )
        made_name = getattr(made, "__name__", None)
        fn, fn_name, kwargs = made, made_name if isinstance(made_name, str) else fn_name, {}
        params = _params(fn)
        if _is_factory(params):
            raise ConfigError(
                f"reward.fns: '{spec}': the factory returned {fn_name}{inspect.signature(fn)}, which "
                "takes none of prompts, completions, completion_ids or **kwargs (TRL calls rewards by "
                "keyword with those)"
            )
    elif kwargs:
        _check_kwargs(params, kwargs, spec, fn_name, factory=False)
    if params is not None and params.positional_only:
        raise ConfigError(
            f"reward.fns: '{spec}': {fn_name}{inspect.signature(fn)} has positional-only parameters "
            f"({', '.join(params.positional_only)}); rewards are called by keyword as in TRL "
            "(prompts=, completions=, completion_ids=, columns...)"
        )
    return fn, kwargs, fn_name


def _check_kwargs(params: _Params | None, kwargs: dict, spec: str, fn_name: str, *, factory: bool) -> None:
    """ConfigError for arguments ``fn`` does not take, or, for a ``factory`` (called once with exactly these), required
    ones that are missing; a reward function gets its other arguments from each call."""
    if params is None:
        return
    unknown = [k for k in kwargs if k not in params.names and not params.takes_all]
    if unknown:
        raise ConfigError(
            f"reward.fn_kwargs for '{spec}': {fn_name} takes no argument {', '.join(map(repr, unknown))}"
            f"; its arguments: {', '.join(sorted(params.names)) or 'none'}"
        )
    missing = [k for k in params.required if k not in kwargs] if factory else []
    if missing:
        raise ConfigError(
            f"reward.fns: '{spec}' is a reward factory that needs {', '.join(missing)}: give "
            f"{_fn_kwargs_hint(missing)} (one entry per reward.fns item, in order) (it takes none of prompts, "
            "completions, completion_ids or **kwargs; a reward function needs one of them)"
        )


def _is_url(spec: str) -> bool:
    return spec.lower().startswith(("http://", "https://"))


def url_name(url: str) -> str:
    """A metric-friendly name of a remote reward: host (and port) + path, e.g. ``127.0.0.1_8000_score``."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    name = re.sub(
        r"[^A-Za-z0-9._-]+", "_", f"{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}{parts.path}"
    )
    return name.strip("_") or "remote"


def _load_file(path_text: str, spec: str, key: str = "reward.fns", forms: str = _FORMS):
    path = Path(os.path.expanduser(path_text))
    full = Path.cwd() / path  # an absolute path stays as it is
    if not full.is_file():
        raise ConfigError(
            f"{key}: '{spec}': file '{path_text}' not found (looked for {full}; relative paths are "
            f"taken from the working directory {Path.cwd()}); fix the path or {forms}"
        )
    full = full.resolve()
    mod_name = f"mmrl_user_reward_{re.sub(r'[^0-9A-Za-z_]', '_', full.stem)}_{hashlib.sha1(str(full).encode()).hexdigest()[:8]}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    mspec = importlib.util.spec_from_file_location(mod_name, full)
    if mspec is None or mspec.loader is None:
        raise ConfigError(f"{key}: '{spec}': '{path_text}' cannot be loaded as Python; give a .py file")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[mod_name] = module
    try:
        mspec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[mod_name]
        raise ConfigError(
            f"{key}: '{spec}': running {full} failed ({type(e).__name__}: {e}); fix the file (try `python <file>`)"
        ) from e
    return module


def _load_module(mod_text: str, spec: str, key: str = "reward.fns"):
    try:
        return importlib.import_module(mod_text)
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"{key}: '{spec}': module '{mod_text}' is not importable ({e}); install it or put its "
            f"folder on PYTHONPATH, or give a file path like ./{mod_text.replace('.', '/')}.py:FUNCTION"
        ) from e
    except Exception as e:
        raise ConfigError(f"{key}: '{spec}': importing module '{mod_text}' failed ({type(e).__name__}: {e})") from e


def resolve_fn(
    spec: str, *, key: str = "reward.fns", forms: str = _FORMS, wants: str = _REWARD_FN
) -> tuple[str, Callable]:
    """``(name, callable)`` of a ``FILE.py:FUNCTION`` or ``MODULE:FUNCTION`` spec; ConfigError if it is bad. The
    loader of every user callable named in a config: ``key`` is the config key the errors name, ``forms`` how to
    write a spec, ``wants`` what the callable must be (defaults: a reward function of ``reward.fns``)."""
    if ":" not in spec:
        raise ConfigError(f"{key}: '{spec}' names no function; {forms}")
    target, fn_name = spec.rsplit(":", 1)
    if not target:
        raise ConfigError(f"{key}: '{spec}' names no file or module before the ':'; {forms}")
    if not fn_name.isidentifier():
        raise ConfigError(f"{key}: '{spec}': '{fn_name}' is not a function name; {forms}")
    is_file = target.endswith(".py") or "/" in target or os.sep in target or target.startswith(("~", "."))
    module = _load_file(target, spec, key, forms) if is_file else _load_module(target, spec, key)
    if not hasattr(module, fn_name):
        funcs = sorted(
            k
            for k, v in vars(module).items()
            if inspect.isfunction(v) and not k.startswith("_") and v.__module__ == module.__name__
        )
        raise ConfigError(
            f"{key}: '{spec}': {target} has no function '{fn_name}'"
            + (f"; functions defined there: {', '.join(funcs)}" if funcs else "")
        )
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise ConfigError(
            f"{key}: '{spec}': '{fn_name}' in {target} is a {type(fn).__name__}, not a function; give {wants}"
        )
    return fn_name, fn


def _per_fn(values, n: int, key: str) -> list:
    """``reward.<key>`` as one entry per reward.fns item (empty: None each)."""
    values = list(values or [])
    if values and len(values) != n:
        raise ConfigError(f"reward.{key} has {len(values)} entries for {n} reward.fns; give one per function, in order")
    return values or [None] * n


def user_reward_specs(reward_cfg: RewardConfig) -> list[RewardSpec]:
    """The RewardSpecs of ``reward.fns`` (names as given by the functions / URLs, not yet made unique); factories are
    called here, once, with their ``reward.fn_kwargs``."""
    n = len(reward_cfg.fns)
    weights = [1.0 if w is None else w for w in _per_fn(reward_cfg.weights, n, "weights")]
    fn_kwargs = _per_fn(reward_cfg.fn_kwargs, n, "fn_kwargs")
    specs = []
    for spec, w, kwargs in zip(reward_cfg.fns, weights, fn_kwargs):
        spec = str(spec).strip()
        if _is_url(spec):
            if kwargs:
                raise ConfigError(
                    f"reward.fn_kwargs for '{spec}': a remote reward takes no arguments; give {{}} or null"
                )
            fn = RemoteReward(
                spec,
                timeout_s=reward_cfg.timeout_s,
                max_retries=reward_cfg.max_retries,
                max_concurrency=reward_cfg.max_concurrency,
                batch_size=reward_cfg.batch_size,
            )
            specs.append(RewardSpec(url_name(spec), fn, float(w), source=spec))
        else:
            name, fn = resolve_fn(spec)
            fn, fixed, name = make_reward_fn(fn, spec, name, kwargs)
            reward = TrlReward(
                fn,
                name,
                spec,
                completion_format=reward_cfg.completion_format,
                columns_as=reward_cfg.columns,
                fixed=fixed,
            )
            specs.append(RewardSpec(name, reward, float(w), source=spec))
    return specs


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    k = 2
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def compose_reward_specs(task_specs: list[RewardSpec], reward_cfg: RewardConfig) -> list[RewardSpec]:
    """The task's reward specs plus (``reward.mode=add``) or instead of (``replace``) the user's ``reward.fns``.

    User rewards whose names clash with a task reward or with each other get a ``_2``, ``_3``... suffix.
    Without ``reward.fns`` the task's specs are returned unchanged.
    """
    if not reward_cfg.fns:
        return list(task_specs)
    user = user_reward_specs(reward_cfg)
    kept = list(task_specs) if reward_cfg.mode == "add" else []
    taken = {s.name for s in kept}
    for s in user:
        s.name = _unique(s.name, taken)
        taken.add(s.name)
    return kept + user
