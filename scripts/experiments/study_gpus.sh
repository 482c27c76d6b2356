#!/usr/bin/env bash
# Several plans at once on one host, each on the GPU it names: one study_runs.sh a plan, started together with
# CUDA_VISIBLE_DEVICES set to that GPU, then waited for.
#
#   scripts/experiments/study_gpus.sh RUNS_DIR DATA_ROOT GPU:PLAN [GPU:PLAN ...]
#
# GPU: a GPU's index as nvidia-smi numbers them (two plans may name one GPU; their runs then share it). A plan's runs
# go to RUNS_DIR/<the plan's file name without .txt>, with that driver's own driver.log (study_wait.sh takes those
# folders); RUNS_DIR/gpus.log says which plan ran on which GPU and when each driver ended. Every pair and every plan
# is checked before any driver starts.
. "$(dirname "$0")/arguments.sh"  # usage, die, is_count; -h/--help prints the comment above
[ $# -ge 3 ] || die "expected RUNS_DIR, DATA_ROOT and at least one GPU:PLAN, got $# argument(s)"
set -u
runs=$1 data=$2
shift 2
here=$(dirname "$0")
declare -A seen=()
for pair in "$@"; do
  [[ $pair =~ ^[0-9]+:.+$ ]] || die "'$pair': expected GPU:PLAN, a GPU index and a plan file (0:plan.txt)"
  plan=${pair#*:} name=$(basename "${pair#*:}" .txt)
  [ -z "${seen[$name]:-}" ] || die "'$pair': a second plan named $name (each plan's runs go to RUNS_DIR/$name)"
  seen[$name]=1
  if ! err=$(bash "$here/study_runs.sh" --check "$plan" "$runs/$name" "$data" 2>&1 >/dev/null); then
    die "'$pair': ${err%%$'\n'*}"
  fi
done
mkdir -p "$runs"
say() { echo "$(date -u +%FT%TZ) $*" >>"$runs/gpus.log"; }
for pair in "$@"; do
  gpu=${pair%%:*} plan=${pair#*:} name=$(basename "${pair#*:}" .txt)
  say "start $name on GPU $gpu ($plan)"
  (
    CUDA_VISIBLE_DEVICES=$gpu bash "$here/study_runs.sh" "$plan" "$runs/$name" "$data"
    say "ended $name (exit $?)"
  ) &
done
wait
say "all done"
