#!/usr/bin/env bash
# The throughput rows of the CIFAR-10 study on one GPU, one after the other, and how the aggregate of several runs
# compares with one run alone measured on the same machine (results/cifar10/NOTES.md):
#
#   scripts/study_throughput_rows.sh DATA_ROOT OUT_DIR ROWS [key=value ...]
#
# ROWS: space-separated NAME:NxSECONDS[:mps], e.g. "warm:1x30 a:1x300 b:1x300 c:2x180 d:4x180:mps"; each row is one
# scripts/study_throughput.sh (N runs, SECONDS of all of them training, under CUDA MPS with ":mps"), its runs in
# OUT_DIR/NAME, its JSON line appended to OUT_DIR/rows.jsonl with the row's name. A row named "warm" only fills the
# compile cache and is left out of the comparison. Then OUT_DIR/summary.json: the single-run rows' images/s (each
# row's median, and its windows' min and max), and each multi-run row's total against each single-run row and against
# their mean, so that a ratio is never quoted against one lucky or unlucky single run. The overrides go to every run.
set -u
data=$1 out=$2 rows=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
: >"$out/rows.jsonl"
for row in $rows; do
  name=${row%%:*} rest=${row#*:}
  spec=${rest%%:*} mps=0
  [ "$rest" != "$spec" ] && [ "${rest#*:}" = mps ] && mps=1
  n=${spec%%x*} seconds=${spec#*x}
  echo "$(date -u +%FT%TZ) row $name: $n run(s), ${seconds} s, mps=$mps"
  line=$(bash "$here/study_throughput.sh" "$n" "$seconds" "$mps" "$data" "$out/$name" "$@" | tail -n 1)
  echo "$line"
  python - "$name" "$line" >>"$out/rows.jsonl" <<'PY'
import json, sys
try:
    row = json.loads(sys.argv[2])
except ValueError:
    row = {"error": "no summary line", "output": sys.argv[2][-300:]}
print(json.dumps({"row": sys.argv[1], **row}))
PY
done
python - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = [json.loads(line) for line in open(f"{out}/rows.jsonl")]
good = [r for r in rows if r["row"] != "warm" and "error" not in r]
single = [r for r in good if r["runs"] == 1]
summary = {"single": [{"row": r["row"], "images_per_s": r["total_images_per_s"], "min_max": r["min_max_per_run"][0]}
                      for r in single],
           "failed": [r["row"] for r in rows if "error" in r]}
if single:
    mean = statistics.fmean(r["total_images_per_s"] for r in single)
    summary["single_mean"] = round(mean)
    summary["several"] = [{"row": r["row"], "runs": r["runs"], "mps": r["mps"], "total": r["total_images_per_s"],
                           "vs_single_mean": round(r["total_images_per_s"] / mean, 3),
                           "vs_each_single": {s["row"]: round(r["total_images_per_s"] / s["total_images_per_s"], 3)
                                              for s in single}}
                          for r in good if r["runs"] > 1]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary))
PY
