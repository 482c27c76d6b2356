"""CUTLASS's sm90 2:4 GEMM against cuSPARSELt and cuBLAS at the ViT-L MLP shapes, on one GPU, in one
run (GPU).

    python -m scripts.experiments.cutlass_sm90.compare BIN_DIR --out results/bench/ledger_h200/cutlass_sm90_h200.json

BIN_DIR holds the binaries `build.sh` made (one per tile and cluster shape). For each shape (m = out
features, k = in features; n = tokens) this process times cuBLAS (`F.linear`) and the project's
cuSPARSELt layer GEMM (`sparsity` backend `cusparselt`, its algorithm searched), both as CUDA-graph
replays, then runs each CUTLASS binary, which times CUTLASS's own sparse and dense GEMMs and its
compressor. Ratios are against the cuBLAS time of this run. (4096, 1024) is fc1's forward and
fc2's input gradient, (1024, 4096) fc2's forward and fc1's input gradient.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

SHAPES = ((4096, 1024), (1024, 4096))


def ratio(base: float | None, ms: float | None) -> float | None:
    """base / ms (>1: faster than the base); None where either is missing."""
    return None if not base or not ms else round(base / ms, 3)


def run_binary(path: Path, m: int, n: int, k: int) -> dict:
    """The binary's JSON line, or {"error": ...} with what it printed."""
    cmd = [str(path), f"--m={m}", f"--n={n}", f"--k={k}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 120 s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": (done.stdout + done.stderr)[-300:], "returncode": done.returncode}
    return json.loads(lines[-1])


def library_times(m: int, k: int, tokens: int) -> tuple[float, float]:
    """ms of cuBLAS and of the project's cuSPARSELt GEMM, CUDA-graph replays over two input sets."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    from scripts.benchmarks.timing import graph_ms  # noqa: PLC0415
    from sparsity.backends import get_backend  # noqa: PLC0415

    sw = get_backend("cusparselt").sparsify(
        torch.randn(m, k, device="cuda", dtype=torch.bfloat16), "tile_greedy"
    )
    wp = sw.to_dense()
    xs = [torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    return graph_ms(lambda i: F.linear(xs[i], wp), 2), graph_ms(lambda i: sw.matmul(xs[i]), 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bin_dir", type=Path)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=44160)
    args = ap.parse_args()
    binaries = sorted(p for p in args.bin_dir.glob("sgemm_*") if p.suffix != ".log")
    if not binaries:
        raise SystemExit(f"{args.bin_dir}: no sgemm_* binaries (build them with build.sh)")

    import torch  # noqa: PLC0415

    res = {"device": torch.cuda.get_device_name(), "tokens": args.tokens, "shapes": []}
    for m, k in SHAPES:
        cublas, cslt = library_times(m, k, args.tokens)
        torch.cuda.empty_cache()
        rec = {"m": m, "k": k, "cublas_ms": round(cublas, 4), "cusparselt_ms": round(cslt, 4)}
        rec["cusparselt_vs_cublas"] = ratio(cublas, cslt)
        rec["cutlass"] = []
        for b in binaries:
            out = run_binary(b, m, args.tokens, k)
            out["binary"] = b.name
            out["sparse_vs_cublas"] = ratio(cublas, out.get("sparse_ms"))
            out["sparse_vs_cusparselt"] = ratio(cslt, out.get("sparse_ms"))
            out["dense_cutlass_vs_cublas"] = ratio(cublas, out.get("dense_cutlass_ms"))
            rec["cutlass"].append(out)
            print(json.dumps({"m": m, "k": k, **out}), flush=True)
        print(json.dumps({k_: v for k_, v in rec.items() if k_ != "cutlass"}), flush=True)
        res["shapes"].append(rec)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
