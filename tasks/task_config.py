"""What every task config is (:class:`TaskConfig`, the type of ``RunConfig.task``) and the optional data fields the
core reads from one (:class:`TaskConfigBase`). Light: it imports only the leaf
:mod:`mmrl.dataclass_fields`, so the config schema can name it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from mmrl.dataclass_fields import declared_fields


@runtime_checkable
class TaskConfig(Protocol):
    """A task's own config dataclass (``Task.config_cls``): every field is a ``task.<field>`` setting. The core reads
    ``name`` (the registry key) from every one; the data fields of :class:`TaskConfigBase` from those that subclass
    it (:func:`task_data`)."""

    name: str


class TaskConfigBase:
    """The data fields the core reads from a task config (evaluation's description and fingerprint of its data,
    ``Task.eval_items``, ``mmrl collect``), each with the default that means "this task has none".

    Class attributes, not dataclass fields: a config dataclass that subclasses this class declares as fields only
    those it has (its saved config.yaml lists just them), and reads the others' defaults from here."""

    data: str | None = None
    """A training data file (None: the task makes its items)."""
    eval_data: str | None = None
    """A separate evaluation data file (None: the eval items come from ``data`` or the task itself)."""
    num_eval: int | None = None
    """How many items of ``data`` are held out for evaluation; 0 with no ``eval_data``: no evaluation. None: the task
    does not size its eval split this way."""
    data_format: str | None = None
    """What the task's items are made from when there is no data file (e.g. ``synthetic``)."""
    demos_path: str | None = None
    """Where ``mmrl collect`` writes expert demos (None: the task records none)."""


DATA_FIELDS = tuple(TaskConfigBase.__annotations__)
"""The fields of :class:`TaskConfigBase`, in the order it declares them."""


def task_data(cfg: TaskConfig) -> TaskConfigBase:
    """``cfg``'s data fields: ``cfg`` itself when it subclasses :class:`TaskConfigBase`; else the base's defaults,
    overridden by those of its fields that ``cfg``'s dataclass declares (a task config from outside mmrl keeps its
    own ``num_eval`` or ``eval_data``: never silently dropped)."""
    if isinstance(cfg, TaskConfigBase):
        return cfg
    view, declared = TaskConfigBase(), declared_fields(cfg)
    for name in DATA_FIELDS:
        if name in declared:
            setattr(view, name, getattr(cfg, name))
    return view
