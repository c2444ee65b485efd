#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the RL math and its wiring, in a scratch copy of the repository: the checkout is
# never modified. Prints the surviving mutants (each with its diff) and the counts. See docs/testing.md.
#
#   bash scripts/mutation.sh [TARGET ...]   TARGET: algos (default), wiring (algos/objective.py + estimators.py, the
#                                           config-to-math layer), trainer, rewards, sde, shared_prefix,
#                                           lerobot_lora, vla_gaussian, vla_flow, lerobot_policy, vla_episodes,
#                                           run_dir, remote_rewards, progress, all
#
# Environment: PYTHON (default .venv/bin/python; mutmut must be installed in it: pip install -e ".[mutation]"),
# MUTATION_DIR (scratch folder, default /tmp/mmrl-mutation-<target>; kept afterwards so `mutmut show NAME` works
# there), MUTATION_CHILDREN (parallel workers, default 1; the CI machines have 2 shared cores), MUTATION_NAMES (only
# these mutants, by name or glob, e.g. "mmrl.parallel.global_batch.x_gae_of_rank__mutmut_*": re-test a previous run's survivors
# after adding tests, in a fresh copy, without the hours of a whole target), MUTATION_RESUME=1 (continue a stopped run
# in MUTATION_DIR where it stopped, on the copy it made: `trainer` takes hours, more than one sitting).
#
# Not part of the default test run: it takes from minutes (shared_prefix) to an hour or more (algos, trainer).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python)"
"$PY" -c "import mutmut" 2>/dev/null || { echo "mutmut is not installed in $PY: $PY -m pip install -e \".[mutation]\"" >&2; exit 2; }
MUTMUT="$(dirname "$PY")/mutmut"
CHILDREN="${MUTATION_CHILDREN:-1}"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(algos)
[ "${targets[0]}" != all ] || targets=(algos trainer rewards sde shared_prefix lerobot_lora vla_gaussian vla_flow lerobot_policy
                                                 vla_episodes run_dir remote_rewards progress)

# what to mutate, and the tests that are meant to kill its mutants
spec() {
  RECHECK=""  # test files run afterwards on the survivors only (mutation_recheck.py); empty: none
  DESELECT=""  # a pytest -k expression for the first stage: tests that start the CLI in a subprocess fail under
               # mutmut's coverage pass (the child looks for mutmut's config in its own folder); give them to RECHECK
  case "$1" in
    algos) ONLY='"mmrl/algos/*"'
           # two stages: mutmut runs the fast unit tests on every mutant, then the trainer-building wiring tests run
           # only on the mutants those left alive (mutation_recheck.py): the same kills, a fraction of the time
           TESTS='"tests/algos/test_algos_advantages.py", "tests/algos/test_algos_aggregation.py", "tests/algos/test_algos_constant_groups.py",
                  "tests/algos/test_algos_kl_is_filter.py", "tests/algos/test_algos_losses.py", "tests/algos/test_algos_objective.py",
                  "tests/algos/test_tgrpo.py", "tests/algos/test_algos_edges.py"'
           RECHECK="tests/wiring/test_knobs_reach_math.py tests/wiring/test_masking_end_to_end.py" ;;
    wiring) ONLY='"mmrl/algos/objective.py", "mmrl/algos/estimators.py"'  # config -> math: a subset of algos
            TESTS='"tests/algos/test_algos_edges.py", "tests/algos/test_algos_objective.py", "tests/algos/test_algos_advantages.py",
                   "tests/algos/test_tgrpo.py", "tests/wiring/test_knobs_reach_math.py", "tests/wiring/test_masking_end_to_end.py"' ;;
    trainer) ONLY='"mmrl/trainer.py", "mmrl/collector.py", "mmrl/optim.py", "mmrl/update_metrics.py", "mmrl/parallel/global_batch.py", "mmrl/warm_start_reference.py",
                   "mmrl/run_checkpoints.py", "mmrl/run_folder.py", "mmrl/stop_signals.py", "mmrl/warm_start_phase.py"'
             TESTS='"tests/trainer/test_trainer_contract.py", "tests/trainer/test_collector_contract.py", "tests/trainer/test_fit_contract.py", "tests/wiring/test_knobs_reach_math.py", "tests/wiring/test_masking_end_to_end.py", "tests/trainer/test_trainer.py",
                    "tests/trainer/test_resume.py", "tests/trainer/test_global_batch.py"'
             # bad input, damaged checkpoints and CLI runs: a minute per mutant, so only on the survivors of the above
             # (test_run_safety.py holds the CLI runs that skip every item, which only it feeds to the collector)
             RECHECK="tests/trainer/test_bad_run_input.py tests/trainer/test_damaged_checkpoints.py tests/trainer/test_run_safety.py" ;;
    rewards) ONLY='"mmrl/rewards/manager.py", "mmrl/rewards/user.py"'
             TESTS='"tests/rewards/test_reward_contract.py", "tests/rewards/test_reward_specs_contract.py", "tests/rewards/test_reward_manager.py",
                    "tests/rewards/test_user_rewards.py", "tests/rewards/test_trl_reward_protocol.py"'
             DESELECT="not two_step_run and not cli_run"
             RECHECK="tests/wiring/test_masking_end_to_end.py tests/wiring/test_knobs_reach_math.py
                      tests/rewards/test_trl_reward_protocol.py::test_trl_rewards_run_unchanged_in_a_two_step_run
                      tests/rewards/test_trl_reward_protocol.py::test_reward_errors_in_a_cli_run_are_one_line_without_traceback" ;;
    sde) ONLY='"mmrl/rollout/sde_math.py"'
         # the flow VLA heads share this module (issue 23): their tests exercise its Gaussian step and log-density too
         TESTS='"tests/algos/test_sde_sampler.py", "tests/algos/test_sde_math_contract.py", "tests/adapters/vla/test_vla_action_heads.py", "tests/wiring/test_vla_head_knobs.py"' ;;
    shared_prefix) ONLY='"mmrl/policies/shared_prefix.py"'
                   TESTS='"tests/policies/test_shared_prefix.py", "tests/policies/test_shared_prefix_contract.py"' ;;
    lerobot_lora) ONLY='"mmrl/adapters/vla/lerobot/lora.py"'  # LoRA on LeRobot's flow VLAs: merge, save, load
                  TESTS='"tests/adapters/vla/test_lerobot_lora.py", "tests/trainer/test_planner_lerobot.py"'
                  DESELECT="not resumes_bit_exactly"  # the Trainer run (env workers in subprocesses): on the survivors only
                  RECHECK="tests/adapters/vla/test_lerobot_lora.py::test_trainer_trains_adapters_with_a_kl_reference_and_resumes_bit_exactly" ;;
    # the VLA continuous heads (issue 41): the Gaussian chunk head and the head rules / critic plumbing around it
    vla_gaussian) ONLY='"mmrl/adapters/vla/gaussian_head.py", "mmrl/adapters/vla/continuous_heads.py"'
                  TESTS='"tests/adapters/vla/test_gaussian_head_distribution.py", "tests/adapters/vla/test_vla_action_heads.py",
                         "tests/adapters/vla/test_vla_critic_inputs.py"'
                  # KL, head knobs through a Trainer, the policies on tiny VLMs: 20 s to a minute each
                  RECHECK="tests/adapters/vla/test_vla_kl.py tests/wiring/test_vla_head_knobs.py tests/adapters/vla/test_vla_continuous.py" ;;
    vla_flow) ONLY='"mmrl/adapters/vla/flow_chain.py", "mmrl/adapters/vla/flow_expert.py"'  # the flow head's chain and expert
              TESTS='"tests/adapters/vla/test_vla_action_heads.py", "tests/adapters/vla/test_vla_critic_inputs.py"'
              RECHECK="tests/adapters/vla/test_vla_kl.py tests/wiring/test_vla_head_knobs.py tests/adapters/vla/test_lerobot_smolvla.py
                       tests/adapters/vla/test_lerobot_pi0.py tests/adapters/vla/test_vla_continuous.py" ;;
    lerobot_policy) ONLY='"mmrl/adapters/vla/lerobot/policy.py"'  # LeRobot flow VLAs as mmrl policies
                    TESTS='"tests/adapters/vla/test_vla_critic_inputs.py", "tests/adapters/vla/test_lerobot_folder_errors.py"'
                    # rollouts and log-probs of tiny LeRobot policies (a minute each): on the survivors only
                    RECHECK="tests/adapters/vla/test_lerobot_flow_policy.py tests/adapters/vla/test_smolvla_policy.py tests/adapters/vla/test_lerobot_pi0.py" ;;
    vla_episodes) ONLY='"mmrl/adapters/vla/episodes.py", "mmrl/tasks/vla/base.py"'  # the episode loop; success metrics
                  TESTS='"tests/adapters/vla/test_episode_loop.py", "tests/adapters/vla/test_success_metrics.py",
                         "tests/adapters/vla/test_vla_eval_metrics.py"'
                  RECHECK="tests/adapters/vla/test_vla_tasks.py" ;;
    run_dir) ONLY='"mmrl/run_dir.py"'  # run folders: containment, overwrite, the lock, resume checks
             TESTS='"tests/trainer/test_run_dir_containment.py", "tests/trainer/test_run_dir_mutants.py", "tests/trainer/test_run_lock.py",
                    "tests/trainer/test_refused_resume.py", "tests/trainer/test_resume_after_upgrade.py"'
             RECHECK="tests/trainer/test_disk_full.py tests/trainer/test_run_safety.py" ;;
    remote_rewards) ONLY='"mmrl/rewards/remote.py"'  # HTTP reward servers: payloads, batching, retries, concurrency
                    TESTS='"tests/rewards/test_remote_payloads.py", "tests/rewards/test_remote_mutants.py", "tests/rewards/test_reward_failure_causes.py",
                           "tests/rewards/test_reward_specs_contract.py", "tests/rewards/test_user_rewards.py"' ;;
    progress) ONLY='"mmrl/progress.py"'  # progress bars / lines and the numbers shown to people
              TESTS='"tests/trainer/test_progress_mutants.py", "tests/trainer/test_run_output.py"'
              DESELECT="not log_output and not json_on_stdout and not terminal_output"  # the three `mmrl train` runs
              RECHECK="tests/trainer/test_run_output.py::test_log_output_banner_bars_eta_and_summary
                       tests/trainer/test_run_output.py::test_json_on_stdout_when_asked_and_quiet_mode
                       tests/trainer/test_run_output.py::test_terminal_output_has_bars" ;;
    *) echo "unknown target '$1'; choose from algos wiring trainer rewards sde shared_prefix lerobot_lora vla_gaussian vla_flow" \
            "lerobot_policy vla_episodes run_dir remote_rewards progress all" >&2; exit 2 ;;
  esac
}

prepare_copy() {  # $1: scratch dir. A plain copy in which mmrl.tasks / configs / simulators are real sub-packages.
  rm -rf "$1"
  mkdir -p "$1"
  (cd "$ROOT" && tar --exclude=./.venv --exclude=./.git --exclude=./mutants -cf - .) | tar -xf - -C "$1"
  for d in tasks configs simulators; do  # setup.py maps these root folders into mmrl.*; mutmut copies only mmrl/
    mv "$1/$d" "$1/mmrl/$d"
    ln -s "mmrl/$d" "$1/$d"
  done
  # mutmut 3 does not mutate decorated functions; module-level decorators (@POLICY_LOSSES.register("ppo_clip"),
  # @group_relative() @_named("grpo"), ...) are rewritten as the equivalent `f = dec1(dec2(f))` after the function so
  # their bodies are mutated
  (cd "$1" && "$PY" - $ONLY <<'EOF'
import ast, glob, sys

for pattern in sys.argv[1:]:
    for path in glob.glob(pattern.strip('",')):
        if not path.endswith(".py"):
            continue
        src = open(path).read()
        lines = src.splitlines(keepends=True)
        edits = []
        for node in ast.parse(src).body:
            decs = getattr(node, "decorator_list", [])
            if isinstance(node, ast.FunctionDef) and decs and not any(
                    isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod", "property") for d in decs):
                expr = node.name
                for d in reversed(decs):
                    expr = f"{ast.get_source_segment(src, d)}({expr})"
                edits.append((decs[0].lineno, node.lineno, node.end_lineno, f"{node.name} = {expr}\n"))
        for first, def_line, end, assign in reversed(edits):
            lines.insert(end, assign)
            del lines[first - 1:def_line - 1]
        if edits:
            open(path, "w").write("".join(lines))
            print(f"{path}: {len(edits)} decorated function(s) made mutable")
EOF
  )
  K_ARGS=""
  [ -z "$DESELECT" ] || K_ARGS=", \"-k\", \"$DESELECT\""
  cat >>"$1/pyproject.toml" <<EOF

[tool.mutmut]
source_paths = ["mmrl"]
only_mutate = [$ONLY]
pytest_add_cli_args_test_selection = [$TESTS]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"$K_ARGS]
process_isolation = "forkserver"
use_git_change_detection = false
# error messages and log lines: a changed message alters no result (the tests that match messages still run on the
# conditions that raise them, which are mutated)
do_not_mutate_patterns = ['^\\s*raise ', '^\\s*log\\.(debug|info|warning|error)\\(']
EOF
}

summary() {  # counts from mutmut's result list
  "$MUTMUT" results --all true 2>/dev/null | awk -F': ' 'NF>1 {n[$2]++; t++} END {
    printf "generated %d", t; for (k in n) printf " / %s %d", k, n[k]; printf "\n" }'
}

for target in "${targets[@]}"; do
  spec "$target"
  work="${MUTATION_DIR:-/tmp/mmrl-mutation-$target}"
  echo "=== mutation testing: $target (scratch copy $work)"
  if [ "${MUTATION_RESUME:-0}" = 1 ] && [ -d "$work/mutants" ]; then
    echo "continuing the run in $work (its copy of the code and tests, made when it started)"
  else
    prepare_copy "$work"
  fi
  cd "$work"
  PYTHONPATH="$work" "$PY" -c "import mmrl, mmrl.tasks; assert mmrl.tasks.__file__.startswith('$work'), mmrl.tasks.__file__"
  # shellcheck disable=SC2086
  nice -n 15 "$MUTMUT" run --max-children "$CHILDREN" ${MUTATION_NAMES:-} >"$work/mutmut-run.log" 2>&1 || {
    echo "mutmut run failed; the end of $work/mutmut-run.log:"; tail -30 "$work/mutmut-run.log"; exit 1; }
  echo "--- $target: $(summary)"
  survivors=$("$MUTMUT" results 2>/dev/null | awk -F': ' '$2 ~ /survived|no tests|timeout|suspicious/ {print $1}' | sed 's/^ *//')
  if [ -n "$RECHECK" ] && [ -n "$survivors" ]; then
    echo "--- $target: rechecking the $(echo "$survivors" | wc -l) survivors against $RECHECK"
    # shellcheck disable=SC2086
    nice -n 15 "$PY" "$ROOT/scripts/mutation_recheck.py" "$work" $RECHECK --jobs "$CHILDREN" \
      --survivors-out "$work/alive-after-recheck.txt" >"$work/recheck.log" 2>&1 || {
      echo "the recheck failed; the end of $work/recheck.log:"; tail -30 "$work/recheck.log"; exit 1; }
    tail -1 "$work/recheck.log"
    survivors=$(cat "$work/alive-after-recheck.txt")
  fi
  if [ -z "$survivors" ]; then
    echo "no surviving mutants"
  else
    for name in $survivors; do
      echo "--- survived: $name"
      "$MUTMUT" show "$name" 2>/dev/null | sed -n '1,40p'
    done
  fi
  cd "$ROOT"
done
