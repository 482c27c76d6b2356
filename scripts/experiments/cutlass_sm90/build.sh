#!/usr/bin/env bash
# Build sparse_gemm_bench.cu for sm90a once per tile/cluster configuration (no GPU needed, ~80 s each).
#
#   scripts/experiments/cutlass_sm90/build.sh CUTLASS_DIR OUT_DIR
#
# CUTLASS_DIR: a checkout of NVIDIA/cutlass (3.x or 4.x: its include/ and tools/util/include/); OUT_DIR gets
# one binary per configuration, named sgemm_<tile m>x<n>x<k>_c<cluster m>x<n>. A configuration CUTLASS refuses
# at compile time is reported and skipped.
set -u
[ $# -eq 2 ] || { echo "usage: $0 CUTLASS_DIR OUT_DIR" >&2; exit 2; }
cutlass=$1 out=$2
[ -d "$cutlass/include/cutlass" ] || { echo "$cutlass: no include/cutlass in it" >&2; exit 2; }
mkdir -p "$out"
src="$(dirname "$0")/sparse_gemm_bench.cu"
# tile m n k (k counts the dense operand's k: a sparse 128 reads 64 stored values a row), cluster m n
configs=("128 128 128 1 2" "128 256 128 1 1" "256 128 128 2 1" "128 128 256 1 2")
for c in "${configs[@]}"; do
  read -r tm tn tk cm cn <<<"$c"
  name="sgemm_${tm}x${tn}x${tk}_c${cm}x${cn}"
  [ -x "$out/$name" ] && continue
  if nvcc -std=c++17 -O3 -arch=sm_90a --expt-relaxed-constexpr -DNDEBUG \
      -DTILE_M="$tm" -DTILE_N="$tn" -DTILE_K="$tk" -DCLUSTER_M="$cm" -DCLUSTER_N="$cn" \
      -I"$cutlass/include" -I"$cutlass/tools/util/include" -o "$out/$name" "$src" >"$out/$name.build.log" 2>&1; then
    echo "built $name"
  else
    echo "refused $name: $(grep -m1 -E 'error' "$out/$name.build.log")"
  fi
done
