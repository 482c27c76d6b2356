#!/usr/bin/env bash
# The throughput rows of the CIFAR-10 study on one GPU, one after the other, and how the aggregate of several runs
# compares with one run alone measured on the same machine (results/cifar10/NOTES.md):
#
#   scripts/experiments/study_throughput_rows.sh DATA_ROOT OUT_DIR ROWS [key=value ...]
#
# ROWS: space-separated NAME:NxSECONDS[:mps][:key=value...], e.g. "warm:1x30 a:1x300 b:1x300 c:2x180 d:4x180:mps
# g:1x180:train.compile_mode=reduce-overhead"; each row is one scripts/experiments/study_throughput.sh (N runs, SECONDS of all of
# them training, under CUDA MPS with ":mps", the row's own overrides after the common ones), its runs in OUT_DIR/NAME,
# its JSON line appended to OUT_DIR/rows.jsonl with the row's name and overrides. A row named "warm" only fills the
# compile cache and is left out of the comparison. Then OUT_DIR/summary.json: the baseline single-run rows' images/s
# (one run, no overrides of its own: each row's median, and its windows' min and max), and every other row's total
# (several runs, or one run set up differently) against each baseline row and against their mean, so that a ratio is
# never quoted against one lucky or unlucky single run. The common overrides go to every run.
. "$(dirname "$0")/arguments.sh"  # usage, die, is_count; -h/--help prints the comment above
[ $# -ge 3 ] || die "expected at least 3 arguments, got $#"
[ -n "$3" ] || die "ROWS is empty"
for a in "${@:4}"; do [[ $a == *=* ]] || die "$a: expected key=value"; done
set -u
data=$1 out=$2 rows=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
for row in $rows; do  # check every row before the first one runs
  IFS=: read -r -a parts <<<"$row"
  spec=${parts[1]:-}
  if ! [[ $spec =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]]; then
    echo "row '$row': expected NAME:NxSECONDS[:mps][:key=value...], e.g. c:2x180" >&2
    exit 2
  fi
  for p in "${parts[@]:2}"; do
    if [ "$p" != mps ] && [[ $p != *=* ]]; then
      echo "row '$row': '$p' is neither 'mps' nor key=value" >&2
      exit 2
    fi
  done
done
mkdir -p "$out"
: >"$out/rows.jsonl"
summarize() {  # summary.json from the rows so far: rewritten after every row, so a lost machine keeps it
  python - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = [json.loads(line) for line in open(f"{out}/rows.jsonl")]
good = [r for r in rows if r["row"] != "warm" and "error" not in r]
single = [r for r in good if r["runs"] == 1 and not r.get("overrides")]
summary = {"single": [{"row": r["row"], "images_per_s": r["total_images_per_s"], "min_max": r["min_max_per_run"][0]}
                      for r in single],
           "failed": [r["row"] for r in rows if "error" in r]}
if single:
    mean = statistics.fmean(r["total_images_per_s"] for r in single)
    summary["single_mean"] = round(mean)
    summary["compared"] = [{"row": r["row"], "runs": r["runs"], "mps": r["mps"], "overrides": r.get("overrides", []),
                            "total": r["total_images_per_s"],
                            "vs_single_mean": round(r["total_images_per_s"] / mean, 3),
                            "vs_each_single": {s["row"]: round(r["total_images_per_s"] / s["total_images_per_s"], 3)
                                               for s in single}}
                           for r in good if r not in single]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary))
PY
}
for row in $rows; do
  IFS=: read -r -a parts <<<"$row"
  name=${parts[0]} spec=${parts[1]} mps=0 extra=()
  for p in "${parts[@]:2}"; do
    if [ "$p" = mps ]; then mps=1; else extra+=("$p"); fi
  done
  n=${spec%%x*} seconds=${spec#*x}
  echo "$(date -u +%FT%TZ) row $name: $n run(s), ${seconds} s, mps=$mps ${extra[*]+${extra[*]}}"
  line=$(bash "$here/study_throughput.sh" "$n" "$seconds" "$mps" "$data" "$out/$name" "$@" \
    ${extra[@]+"${extra[@]}"} | tail -n 1)
  echo "$line"
  python - "$name" "$line" ${extra[@]+"${extra[@]}"} >>"$out/rows.jsonl" <<'PY'
import json, sys
try:
    row = json.loads(sys.argv[2])
except ValueError:
    row = {"error": "no summary line", "output": sys.argv[2][-300:]}
print(json.dumps({"row": sys.argv[1], "overrides": sys.argv[3:], **row}))
PY
  summarize >/dev/null
done
summarize
