#!/usr/bin/env bash
# Images/s of N CIFAR-10 training runs sharing one GPU, optionally under CUDA MPS (kernels of different processes run
# at once instead of time-sliced): how many runs a study should put on a GPU (results/cifar10/NOTES.md).
#
#   scripts/study_throughput.sh N SECONDS MPS DATA_ROOT OUT_DIR [key=value ...]
#
# Starts N runs of configs/cifar10.yaml (seeds 0..N-1, the extra overrides on each), stops them after SECONDS, and
# prints one JSON line: each run's median images/s over the window in which all N were training (from 10 s after the
# last run's first step line to the first run's last line) and their sum. MPS=1 starts the MPS control daemon for the
# measurement (pipe and log directories under OUT_DIR) and stops it after. SECONDS must cover the start-up: a SIGTERM
# that lands while torch.compile is still compiling kills its compile workers too (same process group), which can
# crash or stall the run, so `timeout -k` follows with SIGKILL after 30 s; the first measurement on a machine compiles
# from a cold cache (~1-2 minutes), later ones reuse it.
set -u
n=$1 seconds=$2 mps=$3 data=$4 out=$5
shift 5
mkdir -p "$out"
if [ "$mps" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=$out/mps_pipe CUDA_MPS_LOG_DIRECTORY=$out/mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || exit 1
fi
for i in $(seq 0 $((n - 1))); do
  timeout -k 30 "$seconds" python train.py --config configs/cifar10.yaml --output-dir "$out/run$i" "data.root=$data" \
    "train.seed=$i" "$@" >"$out/run$i.log" 2>&1 &
done
wait
[ "$mps" = 1 ] && echo quit | nvidia-cuda-mps-control
python - "$out" "$n" "$mps" <<'EOF'
import json, re, statistics, sys
from datetime import datetime

out, n, mps = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
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
start = max(r[0][0] for r in runs) + 10
end = min(r[-1][0] for r in runs)
medians = [statistics.median([v for t, v in r if start <= t <= end] or [float("nan")]) for r in runs]
windows = [sum(start <= t <= end for t, _ in r) for r in runs]
print(json.dumps({"runs": n, "mps": mps, "window_s": round(end - start, 1), "windows_per_run": windows,
                  "images_per_s": [round(m) for m in medians], "total_images_per_s": round(sum(medians))}))
EOF
