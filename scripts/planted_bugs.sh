#!/usr/bin/env bash
# Plant the three wiring bugs of issue 26, one at a time, in a scratch copy of the repository and show which tests
# catch each (docs/testing.md). The checkout itself is never modified.
#
#   bash scripts/planted_bugs.sh [pytest args...]      (default: the wiring tests below)
#
# Bugs: (1) score_rollout (mmrl/collector.py) stops AND-ing the reward validity into the rollout's (failed rewards count as 0);
#       (2) the objective passes clip_high=cfg.clip_low; (3) the objective passes dual_clip=None.
# Exit status 0 when every bug failed at least one test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python)"
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=(tests/wiring/test_knobs_reach_math.py tests/wiring/test_masking_end_to_end.py tests/trainer/test_trainer.py
                                 tests/algos/test_algos_objective.py)
WORK="$(mktemp -d /tmp/mmrl-plant.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

copy_repo() {  # $1: destination. The package maps tasks/ configs/ simulators/ into mmrl.*: link them inside the copy
  mkdir -p "$1"
  (cd "$ROOT" && tar --exclude=./.venv --exclude=./.git --exclude=./mutants -cf - .) | tar -xf - -C "$1"
  for d in tasks configs simulators; do ln -s "../$d" "$1/mmrl/$d"; done
}

plant() {  # $1: file, $2: old text, $3: new text (must occur exactly once)
  "$PY" - "$1" "$2" "$3" <<'EOF'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"cannot plant: {old!r} occurs {text.count(old)} times in {path}")
open(path, "w").write(text.replace(old, new))
EOF
}

BUGS=(
  "mmrl/collector.py|ro.valid = ro.valid & res.valid|ro.valid = ro.valid"
  "mmrl/algos/objective.py|clip_high=cfg.clip_high|clip_high=cfg.clip_low"
  "mmrl/algos/objective.py|dual_clip=cfg.dual_clip|dual_clip=None"
)
status=0
for bug in "${BUGS[@]}"; do
  IFS='|' read -r file old new <<<"$bug"
  dir="$WORK/copy"
  rm -rf "$dir"
  copy_repo "$dir"
  plant "$dir/$file" "$old" "$new"
  echo "=== planted in $file: '$old' -> '$new'"
  (cd "$dir" && PYTHONPATH="$dir" "$PY" -c "import mmrl, sys; assert mmrl.__file__.startswith('$dir'), mmrl.__file__")
  rc=0
  out="$(cd "$dir" && PYTHONPATH="$dir" nice -n 15 "$PY" -m pytest -q "${TESTS[@]}" 2>&1)" || rc=$?
  echo "$out" | grep -E '^(FAILED|ERROR) |[0-9]+ (passed|failed)' || true
  if [ "$rc" -eq 0 ]; then
    echo "!!! NOT CAUGHT: every test passed with this bug"
    status=1
  fi
done
exit $status
