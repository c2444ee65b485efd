"""TRL's reward protocol, exactly: mmrl calls user rewards as TRL's GRPOTrainer does and combines them as TRL does.

- a signature matrix, each case checked against TRL's own ``GRPOTrainer._calculate_rewards`` (the keyword call, None
  -> NaN) run on the same inputs, and TRL's combination (nansum of the weighted values; a row that is NaN for every
  function is unscorable);
- every function of ``trl.rewards`` in a two-step ``mmrl train`` run (subprocess), its metric checked;
- reward errors (NaN, inf, a string, a bare float, a wrong length, an exception): exit code, one line naming the
  function and the value, no traceback.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmrl.config import ConfigError, RewardConfig, load_config
from mmrl.rewards.manager import RewardError, RewardManager, RewardSpec
from mmrl.rewards.user import compose_reward_specs

trl_rewards_module = pytest.importorskip("trl.rewards")
ME = "tests.rewards.test_trl_reward_protocol"
ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- reward functions of the signature matrix


def _text(c):
    """The text of a completion, plain or conversational."""
    return c[0]["content"] if isinstance(c, list) else c


def _prompt_text(p):
    return p[-1]["content"] if isinstance(p, list) else p


def prompts_then_completions(prompts, completions, **kwargs):
    return [len(_prompt_text(p)) + 10.0 * len(_text(c)) for p, c in zip(prompts, completions)]


def completions_then_prompts(completions, prompts, **kwargs):
    """TRL's order in its own rewards: a positional call would swap the two."""
    return [len(_prompt_text(p)) + 10.0 * len(_text(c)) for p, c in zip(prompts, completions)]


def completions_only(completions, **kwargs):
    return [float(len(_text(c))) for c in completions]


def keyword_only(*, completions, answer, **kwargs):
    return [1.0 if _text(c).strip() == a else 0.0 for c, a in zip(completions, answer)]


def no_kwargs_some_columns(completions, answer):
    """No **kwargs: gets completions and the one column it names, nothing else."""
    return [2.0 if _text(c).strip() == a else -1.0 for c, a in zip(completions, answer)]


def ids_only(completion_ids):
    return [float(sum(ids)) for ids in completion_ids]


def with_defaults(prompts=None, completions=None, scale=1.0, **kwargs):
    return [scale * len(_text(c)) for c in completions]


def uses_state(completions, trainer_state, **kwargs):
    return [float(trainer_state.global_step)] * len(completions)


def logs_a_metric(completions, log_metric, **kwargs):
    log_metric("custom/mean_len", sum(len(_text(c)) for c in completions) / len(completions))
    return [0.25] * len(completions)


async def async_reward(completions, **kwargs):
    return [float(len(_text(c)) % 2) for c in completions]


def none_on_ones(completions, **kwargs):
    """No opinion on completions starting with '1'."""
    return [None if _text(c).startswith("1") else 1.0 for c in completions]


def none_on_ones_and_twos(completions, **kwargs):
    return [None if _text(c)[:1] in ("1", "2") else 0.5 for c in completions]


def always_none(completions, **kwargs):
    return [None] * len(completions)


def make_scaled(scale, offset=0.0):
    """A factory: arguments in, reward function out."""

    def scaled(completions, **kwargs):
        return [scale * len(_text(c)) + offset for c in completions]

    return scaled


# ---------------------------------------------------------------- TRL's own computation


class _TRLStandIn:
    """The attributes ``GRPOTrainer._calculate_rewards`` reads of its trainer (no model, no dataset)."""

    def __init__(self, funcs, names, global_step, loop):
        from transformers import TrainerState

        self.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True)
        self.args = SimpleNamespace(report_to=[])
        self.state = TrainerState(global_step=global_step)
        self.reward_funcs = funcs
        self.reward_func_names = names
        self.reward_processing_classes = [None] * len(funcs)
        self.environments = None
        self.async_loop = loop
        self.metrics, self.extra = {}, {}

    def _log_metric(self, name, value):
        self.metrics.setdefault(name, []).append(value)

    def _log_completion_extra(self, column, values):
        self.extra[column] = values


@pytest.fixture(scope="module")
def trl_rewards():
    """``fn(funcs, weights, inputs, prompts, completions, ids, step) -> (per_fn [N, K], total [N], unscorable [N],
    logged metrics)`` computed by TRL's GRPOTrainer code."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def compute(funcs, weights, inputs, prompts, completions, ids, step=0):
        stand_in = _TRLStandIn(funcs, [getattr(f, "__name__", "f") for f in funcs], step, loop)
        per_fn = GRPOTrainer._calculate_rewards(stand_in, inputs, prompts, completions, ids)
        # TRL's combination (GRPOTrainer._generate_and_score_completions, multi_objective_aggregation=
        # "sum_then_normalize"): the weighted values nansum'ed per row; rows NaN for every function are unscorable
        total = (per_fn * torch.tensor(weights, dtype=torch.float32).unsqueeze(0)).nansum(dim=1)
        unscorable = torch.isnan(per_fn).all(dim=1)
        return per_fn, total, unscorable, {k: sum(v) / len(v) for k, v in stand_in.metrics.items()}

    yield compute
    loop.call_soon_threadsafe(loop.stop)


TEXTS = ["3", "12", "4", "21", "", "7"]
ANSWERS = ["3", "3", "4", "5", "6", "7"]
PROMPTS = ["1+2=", "1+2=", "2+2=", "2+3=", "3+3=", "3+4="]
IDS = [[3, 0], [1, 2, 0], [4, 0], [2, 1, 0], [0], [7]]


def _trl_batch(conversational: bool):
    """The batch as TRL hands it to a reward: inputs rows, prompts, completions, completion ids."""
    inputs = [{"prompt": p, "answer": a, "id": i} for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS))]
    if not conversational:
        return inputs, list(PROMPTS), list(TEXTS), IDS
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    for row, p in zip(inputs, prompts):
        row["prompt"] = p
    return inputs, prompts, [[{"role": "assistant", "content": t}] for t in TEXTS], IDS


def _mmrl_result(fns, weights, fn_kwargs=None, completion_format="auto", prompts=None, step=0):
    cfg = RewardConfig(
        fns=fns, weights=weights, fn_kwargs=fn_kwargs or [], mode="replace", completion_format=completion_format
    )
    manager = RewardManager(compose_reward_specs([], cfg), error_threshold=1.0)
    manager.set_progress(step, 10)
    samples = [{"text": t, "length": len(i), "truncated": False, "completion_ids": i} for t, i in zip(TEXTS, IDS)]
    columns = {"answer": list(ANSWERS), "id": list(range(len(TEXTS)))}
    return manager, manager(list(prompts or PROMPTS), samples, columns)


# (mmrl spec names, TRL's reward functions, weights, fn_kwargs, completion format)
MATRIX = {
    "prompts_then_completions": (["prompts_then_completions"], [prompts_then_completions], [1.0], None, "text"),
    "completions_then_prompts": (["completions_then_prompts"], [completions_then_prompts], [1.0], None, "text"),
    "completions_only": (["completions_only"], [completions_only], [1.0], None, "text"),
    "keyword_only": (["keyword_only"], [keyword_only], [1.0], None, "text"),
    # without **kwargs TRL's call raises TypeError (test below); mmrl passes only what the function names, so the
    # reference is TRL's call of the function given exactly those
    "no_kwargs_some_columns": (
        ["no_kwargs_some_columns"],
        [lambda completions, answer, **kw: no_kwargs_some_columns(completions, answer)],
        [1.0],
        None,
        "text",
    ),
    "completion_ids_only": (["ids_only"], [lambda completion_ids, **kw: ids_only(completion_ids)], [1.0], None, "text"),
    "defaults_and_fixed_kwargs": (
        ["with_defaults"],
        [lambda **kw: with_defaults(scale=3.0, **kw)],
        [1.0],
        [{"scale": 3.0}],
        "text",
    ),
    "trainer_state": (["uses_state"], [uses_state], [1.0], None, "text"),
    "log_metric": (["logs_a_metric"], [logs_a_metric], [1.0], None, "text"),
    "async": (["async_reward"], [async_reward], [1.0], None, "text"),
    "factory": (["make_scaled"], [make_scaled(0.5, offset=1.0)], [1.0], [{"scale": 0.5, "offset": 1.0}], "text"),
    "weighted_mix": (
        ["completions_then_prompts", "keyword_only", "completions_only"],
        [completions_then_prompts, keyword_only, completions_only],
        [0.5, 2.0, -1.0],
        None,
        "text",
    ),
    "one_none_on_some_samples": (
        ["none_on_ones", "completions_only"],
        [none_on_ones, completions_only],
        [1.0, 0.5],
        None,
        "text",
    ),
    "all_none_on_some_samples": (
        ["none_on_ones", "none_on_ones_and_twos"],
        [none_on_ones, none_on_ones_and_twos],
        [1.0, 2.0],
        None,
        "text",
    ),
    "none_everywhere_but_a_zero_weight": (
        ["always_none", "completions_only"],
        [always_none, completions_only],
        [1.0, 0.0],
        None,
        "text",
    ),
    "conversational": (
        ["completions_then_prompts", "keyword_only", "none_on_ones"],
        [completions_then_prompts, keyword_only, none_on_ones],
        [1.0, 1.0, 1.0],
        None,
        "conversational",
    ),
    "trl_think_format_reward": (
        ["trl.rewards:think_format_reward"],
        ["think_format_reward"],
        [1.0],
        None,
        "conversational",
    ),
}


@pytest.mark.parametrize("case", list(MATRIX))
def test_signature_matrix_matches_trl(case, trl_rewards):
    specs, funcs, weights, fn_kwargs, fmt = MATRIX[case]
    funcs = [getattr(trl_rewards_module, f) if isinstance(f, str) else f for f in funcs]
    specs = [s if ":" in s else f"{ME}:{s}" for s in specs]
    step = 7
    inputs, prompts, completions, ids = _trl_batch(fmt == "conversational")
    per_fn, total, unscorable, trl_metrics = trl_rewards(funcs, weights, inputs, prompts, completions, ids, step)
    manager, res = _mmrl_result(specs, weights, fn_kwargs, fmt, step=step)
    ours = torch.stack([res.per_fn[s.name] for s in manager.specs], dim=1)
    assert torch.equal(torch.isnan(ours), torch.isnan(per_fn)), (ours, per_fn)
    assert torch.equal(torch.nan_to_num(ours, nan=-99.0), torch.nan_to_num(per_fn, nan=-99.0)), (ours, per_fn)
    assert res.valid.tolist() == (~unscorable).tolist()
    assert torch.equal(res.total[res.valid], total[~unscorable])
    assert res.metrics["reward/all_none"] == float(unscorable.sum())
    for name, value in trl_metrics.items():  # log_metric reaches the step's metrics
        assert res.metrics[name] == pytest.approx(value)


@pytest.mark.parametrize("fn", [no_kwargs_some_columns, ids_only])
def test_trl_itself_refuses_a_function_without_kwargs(fn, trl_rewards):
    """Where mmrl is more lenient than TRL: TRL passes every argument, so a function without **kwargs raises."""
    inputs, prompts, completions, ids = _trl_batch(False)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        trl_rewards([fn], [1.0], inputs, prompts, completions, ids)


def test_matrix_cases_cover_nones_and_auto_conversational(trl_rewards):
    """The None cases mask exactly the rows TRL finds unscorable; auto turns conversational prompts into
    conversational completions, as TRL does."""
    _, res = _mmrl_result([f"{ME}:none_on_ones", f"{ME}:none_on_ones_and_twos"], [1.0, 2.0])
    assert res.valid.tolist() == [True, False, True, True, True, True]  # "12" starts with '1': no function scored it
    _, res = _mmrl_result([f"{ME}:none_on_ones", f"{ME}:completions_only"], [1.0, 0.5])
    assert res.valid.all()  # a None from one function is no opinion
    inputs, prompts, completions, ids = _trl_batch(True)
    per_fn, total, _, _ = trl_rewards([completions_then_prompts], [1.0], inputs, prompts, completions, ids)
    _, res = _mmrl_result([f"{ME}:completions_then_prompts"], [1.0], completion_format="auto", prompts=prompts)
    assert res.total.tolist() == total.tolist()


def test_a_positional_call_would_have_been_wrong():
    """The bug this protocol fixes: f(completions, prompts) called positionally swaps the two."""
    right = completions_then_prompts(completions=TEXTS, prompts=PROMPTS)
    assert completions_then_prompts(PROMPTS, TEXTS) != right
    _, res = _mmrl_result([f"{ME}:completions_then_prompts"], [1.0], completion_format="text")
    assert res.total.tolist() == right


def test_factories_and_fn_kwargs_are_checked_at_start_up():
    with pytest.raises(
        ConfigError,
        match=r"is a reward factory that needs max_completion_len, soft_punish_cache: "
        r"give 'reward.fn_kwargs=\[\{max_completion_len:VALUE,soft_punish_cache",
    ):
        compose_reward_specs([], RewardConfig(fns=["trl.rewards:get_soft_overlong_punishment"]))
    with pytest.raises(ConfigError, match="takes no argument 'cache'"):
        compose_reward_specs([], RewardConfig(fns=[f"{ME}:make_scaled"], fn_kwargs=[{"cache": 1}]))
    with pytest.raises(ConfigError, match="reward.fn_kwargs has 1 entries for 2 reward.fns"):
        load_config(
            [
                "task=toy_arithmetic",
                f"reward.fns=[{ME}:make_scaled,{ME}:completions_only]",
                "reward.fn_kwargs=[{scale:2}]",
            ]
        )
    with pytest.raises(
        ConfigError, match="reward.completion_format: 'chat' is not valid; choose from auto, text, conversational"
    ):
        load_config(["task=toy_arithmetic", "reward.completion_format=chat"])
    cfg = load_config(
        [
            "task=toy_arithmetic",
            "reward.fns=[trl.rewards:get_soft_overlong_punishment]",
            "reward.fn_kwargs=[{max_completion_len:64,soft_punish_cache:16}]",
        ]
    )
    (spec,) = compose_reward_specs([], cfg.reward)[-1:]
    assert spec.name == "soft_overlong_punishment_reward"  # the product's __name__, as TRL names it
    assert spec.fn(["p"], [{"text": "x", "completion_ids": [1] * 56}]) == [-0.5]


def test_a_missing_column_names_the_argument_and_the_fix():
    manager = RewardManager(
        compose_reward_specs([], RewardConfig(fns=["trl.rewards:accuracy_reward"], completion_format="conversational"))
    )
    with pytest.raises(
        RewardError,
        match=r"needs 'solution', which the task does not pass \(its columns: answer, "
        r"id\); pass a task column under that name with 'reward.columns="
        r"\{solution: COLUMN\}'",
    ):
        manager(["1+2="], [{"text": "3"}], {"answer": ["3"], "id": [0]})


def test_text_policy_samples_carry_their_completion_ids(tmp_path):
    """What reaches ``completion_ids``: the sampled token ids of each completion, as trained."""
    from tests.helpers import toy_trainer

    tr = toy_trainer(tmp_path, steps=1)
    batch, _ = tr._next_prompts()
    ro = tr.policy.rollout(batch, 2)
    for i, sample in enumerate(ro.samples):
        assert sample["completion_ids"] == ro.payload["completion_ids"][i].tolist()
        assert len(sample["completion_ids"]) == sample["length"] == int(ro.mask[i].sum())


# ---------------------------------------------------------------- reward errors, in process


BAD = {  # name: (function body's return, the message expected)
    "nan": ("[math.nan] * len(completions)", "returned a float (nan) for sample 3, expected a finite number or None"),
    "inf": ("[math.inf] * len(completions)", "returned a float (inf) for sample 3, expected a finite number or None"),
    "string": ("['high'] * len(completions)", "returned a str ('high') for sample 3, expected a finite number or None"),
    "bare_float": ("0.5", "returned a float (0.5), expected a list of 4 numbers or None (one per completion)"),
    "wrong_length": ("[1.0]", "returned a list of 1 values for 4 samples, expected a list of 4 numbers or None"),
    "raises": ("1 / 0", "raised ZeroDivisionError: division by zero on sample 3"),
}


@pytest.fixture
def bad_rewards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    body = "import math\n" + "".join(
        f"def {k}(completions, **kwargs):\n    return {v}\n\n" for k, (v, _) in BAD.items()
    )
    (tmp_path / "bad.py").write_text(body)
    return tmp_path


@pytest.mark.parametrize("kind", list(BAD))
def test_reward_errors_name_the_function_and_the_value(bad_rewards, kind):
    manager = RewardManager(
        compose_reward_specs([], RewardConfig(fns=[f"bad.py:{kind}"], mode="replace")), error_threshold=0.5, window=4
    )
    with pytest.raises(RewardError) as info:
        manager(["p"] * 4, [{"text": "a"}] * 4, {})
    message = str(info.value)
    assert f"reward function '{kind}' (bad.py:{kind})" in message and BAD[kind][1] in message
    if kind in ("nan", "inf", "string", "raises"):  # per-sample failures: the abort line carries the last cause
        assert "failed on 100% of the last 4 samples" in message and "last cause: it " in message


def test_nonfinite_values_fail_the_sample_and_are_counted(bad_rewards):
    specs = compose_reward_specs([RewardSpec("ok", lambda p, c, **_: [1.0] * len(c))], RewardConfig(fns=["bad.py:nan"]))
    res = RewardManager(specs, error_threshold=1.0)(["p"] * 3, [{"text": "a"}] * 3, {})
    assert not res.valid.any()  # NaN is that sample failing for that function, never a silent 0
    assert res.metrics["reward/nan/nonfinite"] == 3 and res.metrics["reward/nan/errors"] == 3


# ---------------------------------------------------------------- CLI runs


def _cli(tmp_path: Path, *overrides: str, steps: int = 2) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``python -m mmrl.cli train task=toy_arithmetic`` with tiny settings, run from ``tmp_path``;
    returns (process, metric rows)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "mmrl.cli",
        "train",
        "task=toy_arithmetic",
        f"trainer.output_dir={tmp_path / 'out'}",
        "trainer.run_name=r",
        f"trainer.max_steps={steps}",
        "trainer.batch_size=4",
        "algo.group_size=4",
        "trainer.eval.every=0",
        "trainer.eval.at_end=false",
        "trainer.logging.progress=false",
        "trainer.logging.tensorboard=false",
        "trainer.logging.plot=false",
        "trainer.logging.every=1",
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    metrics = tmp_path / "out" / "r" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return proc, rows


def _soft_overlong(row):
    # max_completion_len=3, soft_punish_cache=3: every completion (1..3 tokens) gets -length/3
    return -row["response/length"] / 3


# trl.rewards function: (reward name, fn_kwargs, per row: the value, f(row) -> the value, or check(value, row))
TRL_RUNS = {
    "think_format_reward": ("think_format_reward", {}, 0.0),  # the tiny LM writes digits, never <think>
    "accuracy_reward": ("accuracy_reward", {}, 0.0),  # digits without \boxed{} / $...$: math_verify finds no answer
    "reasoning_accuracy_reward": ("reasoning_accuracy_reward", {}, 0.0),  # no </think>: "incomplete reasoning"
    "get_cosine_scaled_reward": ("cosine_scaled_reward", {"max_len": 3}, lambda v, row: -0.875 <= v <= -0.5),
    "get_repetition_penalty_reward": ("repetition_penalty_reward", {}, 0.0),  # <= 3 tokens: no repeated 3-gram
    "get_soft_overlong_punishment": (
        "soft_overlong_punishment_reward",
        {"max_completion_len": 3, "soft_punish_cache": 3},
        _soft_overlong,
    ),
}
_COMMON = ("reward.completion_format=conversational", "reward.columns={solution:answer}")


def _hydra_dict(d: dict) -> str:
    return "{" + ",".join(f"{k}:{v}" for k, v in d.items()) + "}"


def _check_trl_metric(rows, fn, name, expected):
    assert len(rows) == 2
    for row in rows:
        value = row[f"reward/{name}"]
        assert math.isfinite(value), (fn, row)
        assert row[f"reward/{name}/errors"] == 0 and row[f"reward/{name}/none"] == 0, (fn, row)
        if callable(expected) and expected.__code__.co_argcount == 2:
            assert expected(value, row), (fn, value)
        elif callable(expected):
            assert value == pytest.approx(expected(row), abs=1e-5), (fn, value, row)
        else:
            assert value == pytest.approx(expected, abs=1e-7), (fn, value)


def test_the_trl_runs_cover_every_trl_reward():
    public = {n for n in dir(trl_rewards_module) if not n.startswith("_") and callable(getattr(trl_rewards_module, n))}
    assert public == set(TRL_RUNS)


# "all_together": every trl.rewards function in one run (by default); each one alone: -m slow (~20-40 s a run)
@pytest.mark.parametrize("fn", ["all_together"] + [pytest.param(f, marks=pytest.mark.slow) for f in TRL_RUNS])
def test_trl_rewards_run_unchanged_in_a_two_step_run(tmp_path, fn):
    pytest.importorskip("math_verify")  # trl's accuracy rewards need it (the dev extra installs it)
    chosen = list(TRL_RUNS) if fn == "all_together" else [fn]
    proc, rows = _cli(
        tmp_path,
        "reward.fns=[" + ",".join(f"trl.rewards:{f}" for f in chosen) + "]",
        "reward.fn_kwargs=[" + ",".join(_hydra_dict(TRL_RUNS[f][1]) for f in chosen) + "]",
        *_COMMON,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for f in chosen:
        name, _, expected = TRL_RUNS[f]
        _check_trl_metric(rows, f, name, expected)


# one CLI run per kind takes ~20-40 s here: the first runs by default, the rest with -m slow (all kinds are also
# checked in process above)
CLI_BAD = ["bare_float"] + [
    pytest.param(k, marks=pytest.mark.slow) for k in ("nan", "inf", "string", "wrong_length", "raises")
]


@pytest.mark.parametrize("kind", CLI_BAD)
def test_reward_errors_in_a_cli_run_are_one_line_without_traceback(bad_rewards, kind):
    proc, _ = _cli(
        bad_rewards, f"reward.fns=[bad.py:{kind}]", "reward.mode=replace", "trainer.limits.reward_error_window=8"
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mmrl train: aborted")]
    assert len(lines) == 1, proc.stderr
    expected = BAD[kind][1].replace("4", "16").replace("sample 3", "sample 15")  # 16 samples per step here
    assert f"reward function '{kind}' (bad.py:{kind})" in lines[0] and expected in lines[0], lines[0]
