"""Every config value is type-checked where it is read (issue 22): a value of the wrong type for any field of any
config dataclass, or an override the grammar cannot read, is one ConfigError naming the key (the CLI: one line,
exit 2), never a TypeError / ValueError / AttributeError from deeper code or a parser exception name."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterator

import pytest

from mmrl.config import (
    AlgoConfig,
    ConfigError,
    RewardConfig,
    RunConfig,
    TrainerConfig,
    build_run_config,
    compose_dict,
    load_config,
    load_run_config,
    parse_override,
    quoted_override,
)
from mmrl.models.registry import model_config_class, model_types
from mmrl.tasks import get_task_class, task_names

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the sweep over every field


def dataclass_keys(cls: type, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(dotted key, annotation)`` of every field of config dataclass ``cls`` and of the dataclasses nested in it
    (``model.lora.r``, ``algo.tgrpo.alpha``, ``task.video.fps`` ...)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}.{f.name}", hints[f.name]
        yield key, tp
        for inner in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(inner):
                yield from dataclass_keys(inner, key)


def sweep_cases() -> dict[str, list[tuple[str, Any]]]:
    """Per task preset, the keys to sweep with it: the task's own fields for every task; the model fields of each
    model type with the first task whose preset uses it; algo, trainer, reward and checkpoint with toy_arithmetic."""
    cases: dict[str, list[tuple[str, Any]]] = {}
    seen_types = set()
    for name in task_names():
        keys = list(dataclass_keys(get_task_class(name).config_cls, "task"))
        model_type = compose_dict([f"task={name}"])["model"]["type"]
        if model_type not in seen_types:
            seen_types.add(model_type)
            keys += dataclass_keys(model_config_class(model_type), "model")
        cases[name] = keys
    assert seen_types == set(model_types()), "a model type no task preset uses would not be swept"
    cases["toy_arithmetic"] += [
        *dataclass_keys(AlgoConfig, "algo"),
        *dataclass_keys(TrainerConfig, "trainer"),
        *dataclass_keys(RewardConfig, "reward"),
        ("checkpoint", typing.get_type_hints(RunConfig)["checkpoint"]),
    ]
    return cases


def wrong_values(tp: Any) -> list[str]:
    """Override texts whose value is of the wrong type for annotation ``tp``: a list or mapping for a scalar, text
    for a number, a number for a bool, a bool for a number, a scalar for a list / mapping / nested config, a list of
    the wrong items."""
    members = (
        [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (typing.Union, types.UnionType)
        else [tp]
    )
    if len(members) > 1:  # str | list[str]: neither a mapping nor a bool
        return ["{a: 1}", "true"]
    t = members[0]
    origin, args = typing.get_origin(t) or t, typing.get_args(t)
    if t is bool:
        return ["1", "abc", "[true]"]
    if t is int:
        return ["abc", "1.5", "true", "[1]"]
    if t is float:
        return ["abc", "true", "{a: 1}"]
    if t is str:
        return ["[a,b]", "{a: 1}", "true"]
    if origin in (list, tuple):
        item = "[[x]]" if args and args[0] is str else "[abc]"
        return ["abc", "{a: 1}", item]
    if origin is dict:
        return ["[1]", "abc"]
    if dataclasses.is_dataclass(t):
        return ["5", "[1]"]
    raise AssertionError(f"no wrong values for annotation {tp}: add them here")


def with_value(raw: dict, key: str, value: Any) -> dict:
    """A copy of the composed config ``raw`` with ``key`` set to ``value``, as ``++key=value`` sets it."""
    raw = copy.deepcopy(raw)
    node = raw
    *parents, last = key.split(".")
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[last] = value
    return raw


CASES = sweep_cases()


@pytest.mark.parametrize("task", sorted(CASES))
def test_a_wrong_type_for_any_field_is_a_config_error_naming_it(task):
    """Every field the task preset's run reads, every wrong-typed value: ConfigError naming the key. The values are
    read by the override grammar (:func:`parse_override`) and validated by :func:`build_run_config`, which is what
    ``load_config`` does after Hydra's composition (test_load_config_path_is_the_same shows the full path)."""
    base = compose_dict([f"task={task}"])
    build_run_config(copy.deepcopy(base))  # the preset itself is valid
    failures = []
    for key, tp in CASES[task]:
        for text in wrong_values(tp):
            ov = f"{key}={text}"
            try:
                build_run_config(with_value(base, key, parse_override(ov)[1]))
            except ConfigError as e:
                if key not in str(e) or "\n" in str(e):
                    failures.append(f"{ov}: message does not name the key on one line: {e}")
            except Exception as e:  # noqa: BLE001 - this is what the test looks for
                failures.append(f"{ov}: {type(e).__name__}: {e}")
            else:
                failures.append(f"{ov}: accepted")
    assert not failures, "\n".join(failures)


def test_load_config_path_is_the_same():
    """One field of each annotation through the whole ``load_config([...])`` path (Hydra's composition included):
    the same one-line ConfigError naming the key."""
    first: dict[str, tuple[str, str, Any]] = {}
    for task, keys in CASES.items():
        for key, tp in keys:
            first.setdefault(str(tp), (task, key, tp))
    for task, key, tp in first.values():
        for text in wrong_values(tp)[:2]:
            with pytest.raises(ConfigError) as e:
                load_config([f"task={task}", f"{key}={text}"])
            assert key in str(e.value) and "\n" not in str(e.value), (key, text, str(e.value))


# ---------------------------------------------------------------- values that are read before the dataclasses


@pytest.mark.parametrize(
    "override, needle",
    [
        ("task.name=12345", "task.name: unknown task '12345'"),
        ("task.name=[a]", "task.name: expected a string, got ['a']"),
        ("model.type=[a]", "model.type: expected a string, got ['a']"),
        ("model.type=5", "unknown model.type '5'"),
        ("checkpoint=[1]", "checkpoint: expected a string or null, got [1]"),
        ("reward=5", "reward: expected a mapping of RewardConfig fields, got 5"),
        ("model.lora=null", "model.lora: expected a mapping of LoraConfig fields, got None"),
        ("trainer.run_name=true", """for the text 'true' quote it: 'trainer.run_name="true"'"""),
        ("trainer.run_name=${oops}", "trainer.run_name: Interpolation key 'oops' not found"),
        ("reward.columns={solution: [1]}", "reward.columns.solution: expected a string"),
        ("trainer.optim.adam_betas=[0.9]", "trainer.optim.adam_betas: expected 2 values"),
    ],
)
def test_values_read_before_the_dataclasses_are_checked_too(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(["task=toy_arithmetic", override])
    assert needle in str(e.value)


def test_numbers_for_text_fields_keep_the_text_as_typed():
    """A number for a str field is taken as text, exactly as typed (1.10 stays '1.10', not '1.1')."""
    cfg = load_config(["task=toy_arithmetic", "trainer.run_name=1.10", "trainer.logging.wandb_project=1e3"])
    assert cfg.trainer.run_name == "1.10" and cfg.trainer.logging.wandb_project == "1e3"
    assert load_config(["task=toy_arithmetic", "trainer.run_name=123"]).trainer.run_name == "123"


# ---------------------------------------------------------------- unparseable values: how to quote them


@pytest.mark.parametrize(
    "key, value",
    [
        ("trainer.run_name", "café"),
        ("task.ops", "répondez"),
        ("trainer.run_name", "日本"),
        ("trainer.run_name", "é x"),
        ("trainer.run_name", 'é"x'),
    ],
)
def test_non_ascii_values_name_the_key_and_the_quoted_form(key, value):
    with pytest.raises(ConfigError) as e:
        load_config(["task=toy_arithmetic", f"{key}={value}"])
    assert (
        str(e.value) == f"{key}={value}: a value with non-ASCII characters must be quoted: "
        f"{quoted_override(key, value)}"
    )


@pytest.mark.parametrize(
    "value, reason",
    [
        ("a[b", "mismatched input '['"),
        ("a=b", "mismatched input '='"),
        ("(x)", "extraneous input '('"),
        ("a#b", "token recognition error"),
        ("it's", "token recognition error"),
        ("a,b", "a comma makes a sweep"),
    ],
)
def test_unparseable_values_name_the_key_and_the_quoted_form(value, reason):
    with pytest.raises(ConfigError) as e:
        load_config(["task=toy_arithmetic", f"trainer.run_name={value}"])
    msg = str(e.value)
    assert msg.startswith(f"trainer.run_name={value}: ") and reason in msg
    assert msg.endswith(quoted_override("trainer.run_name", value)) and "Exception" not in msg


@pytest.mark.parametrize("value", ["café", "a[b", "a,b", 'say "hi"', "it's", 'it\'s "x"', "a=b c", "日本"])
def test_the_quoted_form_given_in_the_hint_reads_back_as_the_text(value):
    """What the hint tells the user to type, once the shell has removed its own quotes, gives the field the text."""
    import shlex

    (word,) = shlex.split(quoted_override("trainer.run_name", value))
    assert load_config(["task=toy_arithmetic", word]).trainer.run_name == value


def test_a_key_with_spaces_is_named_as_not_a_key():
    with pytest.raises(ConfigError, match="'trainer.run name' is not a config key"):
        load_config(["task=toy_arithmetic", "trainer.run name=x"])


# ---------------------------------------------------------------- the command line, as a user runs it


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m mmrl.cli ARGS`` in ``cwd`` (the checkout on the path)."""
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "mmrl.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def assert_one_line_exit_2(p: subprocess.CompletedProcess, command: str, *needles: str) -> None:
    """Exit code 2, one ``mmrl COMMAND: error:`` line on stderr holding every needle, no traceback."""
    lines = [line for line in p.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and len(lines) == 1, p.stderr[-3000:]
    assert lines[0].startswith(f"mmrl {command}: error: "), lines
    assert all(n in lines[0] for n in needles), (needles, lines[0])


@pytest.mark.parametrize(
    "override, needles",
    [
        ("task.name=12345", ["task.name", "unknown task '12345'"]),
        ("trainer.run_name=café", ["""'trainer.run_name="café"'"""]),
    ],
)
def test_cli_train_wrong_values_are_one_line_exit_2(tmp_path, override, needles):
    p = run_cli("train", "task=toy_arithmetic", f"trainer.output_dir={tmp_path}", override, cwd=tmp_path)
    assert_one_line_exit_2(p, "train", *needles)
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A one-step toy run with its checkpoint and config.yaml, for ``mmrl eval checkpoint=``."""
    from tests.helpers import toy_trainer

    tmp = tmp_path_factory.mktemp("run")
    tr = toy_trainer(tmp, steps=1)
    tr.setup_run_dir()
    tr.fit()
    return tr.run_dir


@pytest.mark.parametrize(
    "override, needles",
    [
        ("trainer.eval.size=abc", ["trainer.eval.size: expected an integer or null, got 'abc'"]),
        ("task.ops=répondez", ["""'task.ops="répondez"'"""]),
    ],
)
def test_cli_eval_wrong_values_are_one_line_exit_2(trained_run, tmp_path, override, needles):
    p = run_cli("eval", f"checkpoint={trained_run}", override, cwd=tmp_path)
    assert_one_line_exit_2(p, "eval", *needles)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("task.name=12345", "task.name: unknown task '12345'"),
        ("trainer.eval.greedy=[1]", "trainer.eval.greedy: expected true/false, got [1]"),
        ("model.lora=5", "model.lora: expected a mapping of LoraConfig fields, got 5"),
        ("checkpoint=[1]", "checkpoint: expected a string or null"),
        ("trainer.run_name=a[b", """quote it: 'trainer.run_name="a[b"'"""),
        ("trainer.run_name=${oops}", "trainer.run_name: Interpolation key 'oops' not found"),
        ("trainer.optim.lr.x=1", "trainer.optim.lr: expected a number, got {'x': 1}"),
    ],
)
def test_eval_overrides_of_the_wrong_type_name_the_key(trained_run, override, needle):
    """The saved run config with overrides on top (``mmrl eval checkpoint=``) is checked as ``mmrl train``'s."""
    with pytest.raises(ConfigError) as e:
        load_run_config(trained_run, [override])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_eval_overrides_read_as_train_overrides(trained_run):
    """``mmrl eval`` reads overrides with the grammar of ``mmrl train``: quoted text, numbers kept as typed."""
    cfg = load_run_config(
        trained_run, ['trainer.run_name="café"', "trainer.eval.size=2", "trainer.logging.wandb_project=1e3"]
    )
    assert cfg.trainer.run_name == "café" and cfg.trainer.eval.size == 2 and cfg.trainer.logging.wandb_project == "1e3"


def test_a_model_type_the_task_cannot_run_is_refused():
    """Every shipped task declares its model types; another type is one ConfigError naming both."""
    from mmrl.tasks import get_task_class, task_names

    assert all(get_task_class(n).model_types for n in task_names())
    with pytest.raises(ConfigError, match="model.type=vlm cannot run task libero, which takes model.type=vla"):
        load_config(["task=libero", "model=tiny_qwen2_vl"])
    with pytest.raises(ConfigError, match="cannot run task t2i_color"):
        load_config(["task=t2i_color", "model=tiny_lm"])
    assert load_config(["task=vla_reach", "model=tiny_vla"]).model.type == "vla"
