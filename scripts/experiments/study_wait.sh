#!/usr/bin/env bash
# Wait for scripts/experiments/study_runs.sh drivers to finish, at most MAX_SECONDS, then say where every run stands:
#
#   scripts/experiments/study_wait.sh MAX_SECONDS RUNS_DIR [RUNS_DIR ...]
#
# Checks every 10 s whether each RUNS_DIR/driver.log says "all done"; returns as soon as all do (exit 0) or when
# MAX_SECONDS have passed (exit 1: some still running). Then prints each run's last step line (cut to 100 characters)
# and each driver's events other than starts (trained, done, FAILED ...), so one short command both waits and reports.
. "$(dirname "$0")/arguments.sh"  # usage, die, is_count; -h/--help prints the comment above
[ $# -ge 2 ] || die "expected MAX_SECONDS and at least one RUNS_DIR, got $# argument(s)"
is_count "$1" || die "MAX_SECONDS $1: expected a whole number of seconds > 0"
for d in "${@:2}"; do [ -d "$d" ] || die "RUNS_DIR $d: no such folder"; done
set -u
max=$1
shift
all_done() {
  local d
  for d in "$@"; do grep -q "all done" "$d/driver.log" 2>/dev/null || return 1; done
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }  # bash's SECONDS ticks on whole seconds: up to 1 s early
status=1
end=$(( $(now_ms) + max * 1000 ))
while :; do
  if all_done "$@"; then status=0; break; fi
  left=$(( end - $(now_ms) ))
  [ "$left" -le 0 ] && break
  sleep $(( left < 10000 ? (left + 999) / 1000 : 10 ))
done
for d in "$@"; do
  for log in "$d"/*.train.log; do
    [ -e "$log" ] || continue
    echo "$(basename "$log" .train.log): $(grep " step " "$log" | tail -n 1 | cut -c 1-100)"
  done
  grep -v " start " "$d/driver.log" 2>/dev/null | sed "s|^|$(basename "$d"): |"
done
[ "$status" -eq 0 ] && echo "all done" || echo "still running after ${max} s"
exit "$status"
