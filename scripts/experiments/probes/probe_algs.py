"""Try every cuSPARSELt algorithm id (CONFIG_ID) of one GEMM, one at a time, surviving crashes
(GPU).

Some algorithms of cuSPARSELt 0.8.0 on sm90 crash the CUDA context for fp16 (illegal instruction),
which no in-process check can recover from. This script writes a line before and after each attempt;
a driver loop restarts it after the last attempted id when it dies:

    p=scripts.experiments.probes.probe_algs
    s=0; while :; do python3 -m $p --dtype fp16 --kind fwd --out f.jsonl --start $s && break;
         s=$(( $(python3 -m $p --last f.jsonl) + 1 )); done

(from the repository root). `scripts/benchmarks/bad_algs.py` reads the file back (which ids crashed,
which gave wrong results); `scripts/experiments/cslt_versions.py` runs this loop for every GEMM of
the ViT-L MLPs and each library version.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def last_alg(path: str) -> int:
    """The last attempted alg id of the most recent configuration in the file."""
    with open(path) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    key = lambda r: (r["dtype"], r["kind"], r["out_features"], r["in_features"], r["tokens"])  # noqa: E731
    cur = key(lines[-1])
    return max(r["alg"] for r in lines if "alg" in r and key(r) == cur)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--kind", default="fwd")
    ap.add_argument("--out-features", type=int, default=4096)
    ap.add_argument("--in-features", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--last", default=None, help="print the last attempted alg id of this file and exit"
    )
    args = ap.parse_args()
    if args.last:
        print(last_alg(args.last))
        return
    import torch  # imported after the --last shortcut, which the driver loop calls once per restart
    import torch.nn.functional as F

    from scripts.benchmarks.bad_algs import short_library_path
    from sparsity.backends.cusparselt.compressor import OperandLayout
    from sparsity.backends.cusparselt.library import (
        ORDER_COL,
        arch_of,
        handle,
        loaded_library_path,
        version,
    )
    from sparsity.backends.cusparselt.plans import GemmPlan, empty_d
    from sparsity.backends.timing import median_cuda_ms
    from sparsity.kernels.pack_cusparselt import prune_pack
    from sparsity.packing import layout as L

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    o, i, n = args.out_features, args.in_features, args.tokens
    tag = dict(dtype=args.dtype, kind=args.kind, out_features=o, in_features=i, tokens=n)

    def emit(**kw):
        with open(args.out, "a") as f:
            f.write(json.dumps({**tag, **kw}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    torch.manual_seed(0)
    w = torch.randn(o, i, device="cuda", dtype=dtype)
    pk = prune_pack(w)
    wp = L.unpack_reference(pk.fwd, o, i, "row", dtype)
    if args.kind == "fwd":
        a, b = pk.fwd, torch.randn(n, i, device="cuda", dtype=dtype)
        ref = F.linear(b, wp)
    else:
        a, b = pk.dgrad, torch.randn(n, o, device="cuda", dtype=dtype)
        ref = b @ wp
    lay = OperandLayout.for_weight(o, i, args.kind)
    h = handle(0)
    base = GemmPlan(("probe",), 0, h, lay, n, dtype, True, ORDER_COL, False, None)
    base.build()
    max_alg = base.max_alg()
    emit(
        event="max_alg",
        max_alg=max_alg,
        default_alg=base.current_alg(),
        alg=args.start - 1,
        arch=arch_of(0),
        cusparselt=version(),
        library=short_library_path(loaded_library_path()),
    )
    d = empty_d(base, b.device)
    for alg in range(args.start, max_alg + 1):
        emit(alg=alg, event="try")
        try:
            p = GemmPlan(("probe", alg), 0, h, lay, n, dtype, True, ORDER_COL, False, alg)
            p.build()
        except Exception as e:  # noqa: BLE001
            emit(alg=alg, event="plan_error", error=repr(e)[:120])
            continue
        try:
            d.fill_(float("nan"))
            p.run(a, b, d)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            emit(alg=alg, event="run_error", error=repr(e)[:160])
            if "cuSPARSELt" not in repr(e):
                sys.exit(3)  # a CUDA error: the context is gone, restart after this alg
            continue
        err = float((d.float() - ref.float()).norm() / ref.float().norm())
        ms = median_cuda_ms(lambda: p.run(a, b, d), 2, 5)
        emit(alg=alg, event="ok", rel_err=err, ms=round(ms, 5))
        p.destroy()
    emit(alg=max_alg, event="done")


if __name__ == "__main__":
    main()
