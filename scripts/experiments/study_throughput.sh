#!/usr/bin/env bash
# Images/s of N CIFAR-10 training runs sharing one GPU, optionally under CUDA MPS (kernels of different processes run
# at once instead of time-sliced): how many runs a study should put on a GPU (results/cifar10/NOTES.md).
#
#   scripts/experiments/study_throughput.sh N SECONDS MPS DATA_ROOT OUT_DIR [key=value ...]
#
# Starts N runs of configs/cifar10.yaml (seeds 0..N-1, the extra overrides on each), measures SECONDS of all of them training
# (from SETTLE_S seconds, default 10, after the last one printed its first step line), stops them, and prints one JSON line: each run's median
# images/s over that window (up to the first run's last line) and their sum. MPS=1 starts the MPS control daemon for the measurement (pipe and log directories under OUT_DIR) and
# stops it after. SECONDS counts from the first step line because start-up (imports, data, torch.compile: about 75 s
# with a warm compile cache on one H200, more from a cold one) would otherwise eat a short window; stopping only after
# that line also keeps the SIGTERM out of torch.compile's start-up, where it kills inductor's compile workers (same
# process group) and can crash or stall the run. A run still alive 30 s after its SIGTERM is killed.
. "$(dirname "$0")/arguments.sh"  # usage, die, is_count; -h/--help prints the comment above
[ $# -ge 5 ] || die "expected at least 5 arguments, got $#"
is_count "$1" || die "N $1: expected a number of runs > 0"
is_count "$2" || die "SECONDS $2: expected a whole number of seconds > 0"
[ "$3" = 0 ] || [ "$3" = 1 ] || die "MPS $3: expected 0 or 1"
for a in "${@:6}"; do [[ $a == *=* ]] || die "$a: expected key=value"; done
set -u
n=$1 seconds=$2 mps=$3 data=$4 out=$5
settle=${SETTLE_S:-10}  # the runs' first steps after start-up (compiles, caches) stay out of the window
shift 5
mkdir -p "$out"
if [ "$mps" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=$out/mps_pipe CUDA_MPS_LOG_DIRECTORY=$out/mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || exit 1
fi
pids=()
for i in $(seq 0 $((n - 1))); do
  python train.py --config configs/cifar10.yaml --output-dir "$out/run$i" "data.root=$data" "train.seed=$i" "$@" \
    >"$out/run$i.log" 2>&1 &
  pids+=($!)
done
stepped() { grep -q "INFO train: step " "$1"; }
alive() { kill -0 "$1" 2>/dev/null; }
for i in $(seq 0 $((n - 1))); do  # every run training (or gone: the summary below names a run without step lines)
  while alive "${pids[$i]}" && ! stepped "$out/run$i.log"; do sleep 1; done
done
sleep $((seconds + settle))
kill -TERM "${pids[@]}" 2>/dev/null
for _ in $(seq 30); do
  any=0
  for pid in "${pids[@]}"; do alive "$pid" && any=1; done
  [ "$any" = 0 ] && break
  sleep 1
done
kill -KILL "${pids[@]}" 2>/dev/null
wait
[ "$mps" = 1 ] && echo quit | nvidia-cuda-mps-control
python - "$out" "$n" "$mps" "$settle" <<'EOF'
import json, re, statistics, sys
from datetime import datetime

out, n, mps, settle = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
line = re.compile(r"^(\S+ \S+) INFO train: step +(\d+)/\d+ .*images/s ([\d.]+)")
runs = []
for i in range(n):
    rows = []
    with open(f"{out}/run{i}.log") as f:
        for text in f:
            m = line.match(text)
            if m:
                t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                rows.append((t, float(m.group(3))))
    runs.append(rows)
if not all(runs):
    print(json.dumps({"runs": n, "mps": mps, "error": "a run printed no step line"}))
    sys.exit(1)
start = max(r[0][0] for r in runs) + settle
end = min(r[-1][0] for r in runs)
windows = [sum(start <= t <= end for t, _ in r) for r in runs]
if not all(windows):
    print(json.dumps({"runs": n, "mps": mps, "error": "a run printed no step line in the window", "windows": windows}))
    sys.exit(1)
inside = [[v for t, v in r if start <= t <= end] for r in runs]
medians = [statistics.median(v) for v in inside]
print(json.dumps({"runs": n, "mps": mps, "window_s": round(end - start, 1), "windows_per_run": windows,
                  "images_per_s": [round(m) for m in medians], "total_images_per_s": round(sum(medians)),
                  "min_max_per_run": [[round(min(v)), round(max(v))] for v in inside]}))
EOF
