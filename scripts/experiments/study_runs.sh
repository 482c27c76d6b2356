#!/usr/bin/env bash
# Several training runs on one GPU at once, each probed as soon as it finishes: the driver of the CIFAR-10 ablations
# (results/cifar10/NOTES.md). Small runs are host-bound, so runs sharing a GPU add up to more images/s than one run.
#
#   scripts/experiments/study_runs.sh PLAN RUNS_DIR DATA_ROOT [CONFIG]
#
# PLAN: one run per line, "NAME START_DELAY_S [key=value ...]" (# comments allowed); each run starts START_DELAY_S
# seconds after the driver (staggered starts line up one run alone, two, three, ... for the throughput table), or,
# with "after" in place of the delay, when the line above has finished training: runs in series, each one's probes
# beside the next one's training (runs with train.cuda_graph=true keep the GPU busy alone). Each run is
# trained with `train.py --config CONFIG` (default configs/cifar10.yaml) and the line's overrides, then probed with
# `eval_linear.py` (linear + k-NN on the final teacher, then again with its MLPs the other way: pruned 2:4 where the
# run ended dense, dense where it ended sparse) and k-NN on every intermediate teacher export, as it is and pruned
# 2:4 (`prune_mlp=true`: the network a sparse phase computes). Everything a
# run prints goes to RUNS_DIR/NAME.train.log / NAME.eval*.log; RUNS_DIR/driver.log says when each step started and
# ended. A finished run is skipped by train.py itself, so rerunning the driver only does what is left.
#
# A plan may say what its runs are for in a line "# role: screening" (runs that choose settings) or "# role:
# confirmatory" (fresh seeds of settings already chosen): each trained run then gets RUNS_DIR/NAME/study.json with
# the role and the plan's name, which study_import.py keeps and make_table.py reads (a screening run is kept out of
# every mean).
#
# With --check first, the arguments and the plan are checked and nothing runs (exit 0 if both are good): what
# study_gpus.sh asks of every plan before it starts any.
. "$(dirname "$0")/arguments.sh"  # usage, die, is_count; -h/--help prints the comment above
check_only=false
[ "${1:-}" = --check ] && { check_only=true; shift; }
[ $# -ge 3 ] && [ $# -le 4 ] || die "expected 3 or 4 arguments, got $#"
[ -f "$1" ] || die "PLAN $1: no such file"
set -u
plan=$1 runs=$2 data=$3 config=${4:-configs/cifar10.yaml}
[ -f "$config" ] || die "CONFIG $config: no such file"
say() { echo "$(date -u +%FT%TZ) $*" >>"$runs/driver.log"; }

one_run() {
  local name=$1 delay=$2
  shift 2
  if [[ $delay == after:* ]]; then
    until [ -e "$runs/${delay#after:}.trained" ]; do sleep 1; done
  else
    sleep "$delay"
  fi
  say "start $name ($*)"
  if ! python train.py --config "$config" --output-dir "$runs/$name" "data.root=$data" "$@" \
      >"$runs/$name.train.log" 2>&1; then
    say "FAILED training $name"
    touch "$runs/$name.trained"  # a run waiting for this one starts all the same
    return
  fi
  if [ -n "$role" ]; then
    printf '{"role": "%s", "plan": "%s"}\n' "$role" "$(basename "$plan")" >"$runs/$name/study.json"
  fi
  touch "$runs/$name.trained"
  say "trained $name"
  python eval_linear.py --run "$runs/$name" >"$runs/$name.eval.log" 2>&1 || say "FAILED eval $name"
  # the final teacher probed the other way too: 2:4-pruned where the run ended dense (*_pruned_mlp.json: for a dense
  # run, the one-shot-pruned floor), with dense MLPs where it ended sparse (*_dense_mlp.json); then k-NN of every
  # intermediate export as it is and pruned
  local other
  other=$(python -c 'import json, sys; i = json.load(open(sys.argv[1]))
print("false" if i["sparse_steps"] >= i["total_steps"] else "true")' "$runs/$name/run_info.json")
  python eval_linear.py --run "$runs/$name" "prune_mlp=$other" \
    >"$runs/$name.eval_other_mlp.log" 2>&1 || say "FAILED eval $name prune_mlp=$other"
  # the final student, where the run exported it (train.export_student=true): eval_linear_student_backbone_step_<last step>.json
  if [ -e "$runs/$name/student_backbone.pth" ]; then
    python eval_linear.py --run "$runs/$name" "checkpoint=$runs/$name/student_backbone.pth" \
      >"$runs/$name.eval_student.log" 2>&1 || say "FAILED eval $name student"
  fi
  local export
  for export in "$runs/$name"/eval/step_*/teacher_backbone.pth; do
    [ -e "$export" ] || continue
    local step
    step=$(basename "$(dirname "$export")")
    python eval_linear.py --run "$runs/$name" "checkpoint=$export" mode=knn \
      >"$runs/$name.eval_$step.log" 2>&1 || say "FAILED eval $name $step"
    python eval_linear.py --run "$runs/$name" "checkpoint=$export" mode=knn prune_mlp=true \
      >"$runs/$name.eval_${step}_pruned.log" 2>&1 || say "FAILED eval $name $step pruned"
  done
  say "done $name"
}

# the whole plan checked before any run starts
role=$(sed -n 's/^# *role: *\([^ ]*\).*$/\1/p' "$plan" | head -n 1)
case "$role" in
  '' | screening | confirmatory) ;;
  *) die "PLAN $plan: role '$role' is not screening or confirmatory" ;;
esac
prev=""
while read -r name delay _; do
  case "$name" in '' | '#'*) continue ;; esac
  if [ "$delay" = after ]; then
    [ -n "$prev" ] || die "PLAN $plan: $name starts 'after' the line above it, and has none"
  elif ! [[ $delay =~ ^[0-9]+$ ]]; then
    die "PLAN $plan: $name: the start delay must be whole seconds or 'after', not '$delay'"
  fi
  prev=$name
done <"$plan"
$check_only && exit 0
mkdir -p "$runs"
prev=""
while read -r name delay overrides; do
  case "$name" in '' | '#'*) continue ;; esac
  [ "$delay" = after ] && delay="after:$prev"
  rm -f "$runs/$name.trained"  # an earlier driver's, on this folder
  # shellcheck disable=SC2086  # the overrides are words
  one_run "$name" "$delay" $overrides &
  prev=$name
done <"$plan"
wait
say "all done"
