#!/usr/bin/env bash
# Pack what scripts/study_runs.sh has written so far, without weights or feature caches (logs, metrics, configs,
# eval JSONs): scripts/study_collect.sh RUNS_DIR ARCHIVE.tar.gz
set -eu
runs=$1 archive=$2
tar -czf "$archive" -C "$(dirname "$runs")" \
  --exclude='checkpoints' --exclude='*.pth' --exclude='*.pt' --exclude='*.tmp' --exclude='.lock' \
  --exclude='features_*' "$(basename "$runs")"
