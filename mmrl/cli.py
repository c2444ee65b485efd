"""`mmrl` command line: train, eval, tasks, collect, plan.

    mmrl train task=vqa_grounding algo=dapo trainer.max_steps=50
    mmrl train task=<a plugin's task>                 # installed plugin packages load first (mmrl/plugins.py)
    mmrl eval checkpoint=runs/<name>                  # the run's own config.yaml (+ overrides); docs/evaluation.md
    mmrl tasks
    mmrl train --help

Overrides are Hydra-style ``key=value``; a bad key, value or option exits with code 2 and a message
that names it and the valid choices.
"""

from __future__ import annotations

import json
import logging
import os
import sys

USAGE = """usage: mmrl <command> [key=value ...]

commands:
  train   run RL training (e.g. `mmrl train task=vqa_grounding trainer.max_steps=50`)
  eval    evaluate a run as trained (`mmrl eval checkpoint=runs/<run> [eval.name=NAME] [key=value ...]`)
  tasks   list the tasks with one-line descriptions
  plan    per-device memory, nothing loaded (`mmrl plan model=qwen2_5_vl_7b plan.world_size=8`; docs/scaling.md)

`mmrl <command> --help` lists every config group option and field.
"""


def _help(command: str) -> str:
    from mmrl.config import AgentConfig, AlgoConfig, RewardConfig, TrainerConfig, describe_fields, group_options
    from mmrl.models.registry import model_config_class, model_types
    from mmrl.tasks import get_task_class, task_names

    lines = [f"usage: mmrl {command} [group=option ...] [group.field=value ...]", "", "config groups:"]
    for g in ("task", "model", "algo", "trainer"):
        lines.append(f"  {g}=  one of: {', '.join(group_options(g))}")
    lines += ["", "top-level:", "  checkpoint=PATH  checkpoint (or run dir) to evaluate / initialise from", ""]
    lines.append("algo fields:")
    lines += describe_fields(AlgoConfig, "algo")
    lines += ["", "trainer fields:"]
    lines += describe_fields(TrainerConfig, "trainer")
    lines += ["", "reward fields (your own reward functions, docs/rewards.md):"]
    lines += describe_fields(RewardConfig, "reward")
    lines += ["", "agent fields (multi-turn tool use, model.type=vlm_agent, docs/agents.md):"]
    lines += describe_fields(AgentConfig, "agent")
    for t in model_types():
        lines += ["", f"model fields (model.type={t}):"]
        lines += describe_fields(model_config_class(t), "model")
    for n in task_names():
        lines += ["", f"task fields (task={n}):"]
        lines += describe_fields(get_task_class(n).config_cls, "task")
    return "\n".join(lines)


def _setup_logging() -> None:
    logging.basicConfig(level=os.environ.get("MMRL_LOG_LEVEL", "INFO"), format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "urllib3", "PIL", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def cmd_tasks() -> int:
    from mmrl.tasks import list_tasks

    rows = list_tasks()
    width = max(len(n) for n, _ in rows)
    for name, desc in rows:
        print(f"{name.ljust(width)}  {desc}")
    return 0


def resume_command(overrides: list[str], run_dir, output_dir: str, checkpoint=None) -> str:
    """The command that continues a stopped run: the same overrides with ``trainer.run_name=<name>
    trainer.checkpointing.resume=auto`` (or ``trainer.checkpointing.resume=<checkpoint>`` when it is not below ``output_dir``)."""
    import shlex
    from pathlib import Path

    keep = [o for o in overrides if not o.startswith(("trainer.run_name=", "trainer.checkpointing.resume="))]
    run_dir = Path(run_dir)
    try:
        name = run_dir.relative_to(Path(output_dir)).as_posix()
    except ValueError:
        name = None
    again = (
        [f"trainer.run_name={name}", "trainer.checkpointing.resume=auto"]
        if name and checkpoint is None
        else [f"trainer.checkpointing.resume={checkpoint or run_dir}"]
    )
    return shlex.join(["mmrl", "train", *keep, *again])


def _stopped_line(trainer, overrides: list[str], cfg) -> str:
    """One line for a run that stopped on an error after :meth:`Trainer.fit` saved what it trained."""
    from mmrl.run_report import checkpoint_outcome

    ckpt = trainer.stop_checkpoint
    where = checkpoint_outcome(ckpt, rescued=trainer.rescued, run_dir=trainer.run_dir, lost=trainer.checkpoint_lost)
    line = f"aborted at step {trainer.step}: {trainer.stop_reason}; {where}"
    if trainer.stop_error_log is not None:
        line += f"; traceback in {trainer.stop_error_log}"
    if ckpt:
        line += "; resume with: " + resume_command(
            overrides, trainer.run_dir, cfg.trainer.output_dir, ckpt if trainer.rescued else None
        )
    return line


def cmd_train(overrides: list[str]) -> int:
    """`mmrl train [--json] key=value ...`: the start banner, a bar per phase and an end summary on stderr
    (`trainer.logging.progress=false`: quiet, the run folder and the last metrics on stdout); `--json` also prints the last
    metrics as JSON on stdout, for scripts."""
    as_json = "--json" in overrides
    overrides = [o for o in overrides if o != "--json"]
    from mmrl.config import ConfigError, load_config

    cfg = load_config(overrides)  # before the trainer's heavy imports: a config error is one line at once
    from mmrl.parallel.shutdown import shutdown_distributed
    from mmrl.trainer import NothingTrained, Trainer

    trainer = Trainer(cfg)
    run_dir = trainer.setup_run_dir()
    try:
        final = trainer.fit()
    except (KeyboardInterrupt, ConfigError):
        raise
    except NothingTrained as e:
        if trainer.is_main:
            print(f"mmrl train: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        prompt_too_long = sys.modules.get("mmrl.policies.vlm_errors")
        if (
            prompt_too_long is not None
            and isinstance(e, prompt_too_long.PromptTooLongError)
            and trainer.stop_checkpoint is None
        ):  # the warm start cannot train on it: one line from main, exit 2
            raise
        if trainer.is_main:
            print(f"mmrl train: {_stopped_line(trainer, overrides, cfg)}", file=sys.stderr)
        return 1
    finally:
        trainer.policy.close()  # simulator workers, a rollout engine: released however the run ended
        shutdown_distributed()
    signum = trainer.stopped_by_signal
    if signum is not None:  # checkpointed, but not finished: a job script must see the difference (130 / 143)
        if trainer.is_main:
            import signal

            from mmrl.checkpoint_files import latest_checkpoint

            print(
                f"mmrl train: stopped by {signal.Signals(signum).name} at step {trainer.step}; checkpoint saved in "
                f"{latest_checkpoint(run_dir) or run_dir}; resume with: "
                f"{resume_command(overrides, run_dir, cfg.trainer.output_dir)}",
                file=sys.stderr,
            )
        return 128 + signum
    if trainer.rescued:
        if trainer.is_main:
            print(
                f"mmrl train: error: the run finished but its folder {run_dir} could not be written; checkpoint saved "
                f"in {trainer.stop_checkpoint}; continue or evaluate from there (mmrl eval "
                f"checkpoint={trainer.stop_checkpoint})",
                file=sys.stderr,
            )
        return 1
    if trainer.is_main:
        shown = {
            k: round(v, 4) for k, v in final.items() if k.startswith(("eval/", "reward/mean")) and isinstance(v, float)
        }
        if cfg.trainer.logging.progress:  # for people: the end summary on stderr; stdout gets the JSON only with --json
            from mmrl.checkpoint_files import latest_checkpoint
            from mmrl.run_report import end_summary

            print(
                end_summary(
                    trainer.report,
                    run_dir=run_dir,
                    step=trainer.step,
                    checkpoint=latest_checkpoint(run_dir),
                    plot=cfg.trainer.logging.plot,
                    tensorboard=cfg.trainer.logging.tensorboard,
                    resume_cmd=resume_command(
                        [o for o in overrides if not o.startswith("trainer.max_steps=")],
                        run_dir,
                        cfg.trainer.output_dir,
                    ),
                ),
                file=sys.stderr,
            )
            if as_json:
                print(json.dumps(shown, indent=1))
        else:  # quiet mode (trainer.logging.progress=false): the run folder and the last metrics, as before
            print(f"run directory: {run_dir}")
            print(json.dumps(shown, indent=1))
    return 0


def cmd_eval(overrides: list[str]) -> int:
    """`mmrl eval checkpoint=runs/<run> [eval.name=NAME] [key=value ...]` (docs/evaluation.md): the run's saved config
    plus overrides; writes <run>/eval/<NAME>/{results.json,predictions.jsonl}. `mmrl eval task=NAME [...]` without a
    checkpoint evaluates model.path as built (into <output_dir>/eval/<task>_<model>/). stdout: the metrics as JSON;
    stderr: a (metric, value) table, the one-line summary and, for simulator tasks, the success table per suite."""
    from mmrl.evaluation import evaluate_checkpoint
    from mmrl.models.configs import model_path

    ev = evaluate_checkpoint(overrides)
    metrics = ev.metrics
    if not int(metrics.get("eval/n", 0)):  # an evaluation that scored nothing is not a result
        print(
            f"mmrl eval: error: nothing was scored: all {ev.n_items} items of {ev.data} were skipped "
            f"({int(metrics.get('eval/skipped', 0))} skipped; the warnings above name the files and reasons); "
            f"no score written",
            file=sys.stderr,
        )
        return 1
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}, indent=1))
    width = max([len("metric"), *(len(k) for k in metrics)])
    rows = [f"{'metric'.ljust(width)}  value"] + [
        f"{k.ljust(width)}  {v:.4f}" if isinstance(v, float) else f"{k.ljust(width)}  {v}"
        for k, v in sorted(metrics.items())
    ]
    skipped = int(metrics.get("eval/skipped", 0))
    weights = (
        f"checkpoint {ev.checkpoint}"
        if ev.checkpoint is not None
        else f"model.path={model_path(ev.config.model)} (no checkpoint)"
    )
    rows.append(
        f"evaluated {ev.n_items} items ({int(metrics.get('eval/n', 0))} samples"
        + (f", {skipped} items skipped" if skipped else "")
        + f") of {ev.data} with {weights}"
        + (f" (step {ev.step})" if ev.step is not None else "")
        + f"; results in {ev.out_dir}"
    )
    table_md = ev.out_dir / "success_table.md"
    if ev.table is not None and table_md.exists():
        rows += ["", table_md.read_text()]
    print("\n".join(rows), file=sys.stderr)
    return 0


def cmd_collect(overrides: list[str]) -> int:
    """`mmrl collect task=vla_reach task.demo_episodes=8 task.demos_path=demos/reach`: record expert demos."""
    from mmrl.config import ConfigError, load_config
    from mmrl.tasks import get_task_class
    from mmrl.tasks.task_config import task_data

    cfg = load_config(overrides)
    task = get_task_class(cfg.task.name)(cfg.task, cfg)
    path = task_data(cfg.task).demos_path
    if not path:
        raise ConfigError(
            "mmrl collect needs a task with scripted experts (vla_reach, vla_lift, metaworld) or demo files "
            "(libero*: task.demo_hdf5=DIR) and task.demos_path=PATH"
        )
    demos = task.collect_demos(path)  # the base Task raises a ConfigError naming the tasks that have experts
    print(
        json.dumps(
            {
                "path": path,
                "episodes": len(demos),
                "successes": sum(d.success for d in demos),
                "steps": sum(d.length for d in demos),
            },
            indent=1,
        )
    )
    return 0


def cmd_plan(overrides: list[str]) -> int:
    """`mmrl plan [train overrides] [plan.device_gb=80] [plan.world_size=1] [plan.strategy=ddp|fsdp2]
    [plan.offload=none|optimizer|params] [plan.optim=fp32|model] [plan.text_tokens=128] [plan.images=N]
    [plan.image_tokens=N] [plan.overhead_gb=1] [plan.json=true]` (docs/scaling.md): the per-device memory of the run
    and, when it does not fit, the cheapest changes that do. Loads no weights; the ``plan.*`` keys are taken out
    before the rest is read as `mmrl train` would. Exit 0 whether or not it fits (it is a report)."""
    from mmrl.planning.report import build_plan, format_report, report_json

    cfg, settings, inp, info, bd, sugg = build_plan(overrides)
    print(report_json(inp, info, bd, sugg) if settings.json else format_report(cfg, settings, inp, info, bd, sugg))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    commands = {"train": cmd_train, "eval": cmd_eval, "tasks": None, "collect": cmd_collect, "plan": cmd_plan}
    if command not in commands:
        print(f"mmrl: unknown command '{command}'; valid commands: {', '.join(commands)}", file=sys.stderr)
        return 2
    _setup_logging()
    from mmrl.config import ConfigError

    try:
        from mmrl.plugins import load_entry_points

        load_entry_points()  # installed plugin packages: their tasks and model types, in every command and --help
        if command == "tasks":
            return cmd_tasks()
        if "--help" in rest or "-h" in rest:
            print(_help(command))
            return 0
        return commands[command](rest)
    except ConfigError as e:
        print(f"mmrl {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mmrl: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # known, user-facing failure modes get one line, not a traceback
        from mmrl.errors import RunStopped

        if isinstance(e, RunStopped):
            print(f"mmrl {command}: aborted: {e}", file=sys.stderr)
            return 1
        prompt_too_long = sys.modules.get("mmrl.policies.vlm_errors")  # loaded only if a VLM policy ran
        if prompt_too_long is not None and isinstance(e, prompt_too_long.PromptTooLongError):
            # RL and evaluation skip and count such prompts; the supervised warm start cannot train on them
            print(f"mmrl {command}: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
