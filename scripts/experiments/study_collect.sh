#!/usr/bin/env bash
# Pack what scripts/experiments/study_runs.sh has written so far, without weights or feature caches (logs, metrics,
# configs, eval JSONs):
#
#   scripts/experiments/study_collect.sh RUNS_DIR ARCHIVE.tar.gz
. "$(dirname "$0")/arguments.sh"  # usage, die, is_count; -h/--help prints the comment above
[ $# -eq 2 ] || die "expected 2 arguments, got $#"
[ -d "$1" ] || die "RUNS_DIR $1: no such folder"
[[ $2 == *.tar.gz ]] || die "ARCHIVE $2: expected a name ending in .tar.gz"
set -eu
runs=$1 archive=$2
tar -czf "$archive" -C "$(dirname "$runs")" \
  --exclude='checkpoints' --exclude='*.pth' --exclude='*.pt' --exclude='*.tmp' --exclude='.lock' \
  --exclude='features_*' "$(basename "$runs")"
