"""First look at the cached-plan cuSPARSELt GEMMs on the GPU: correctness, layouts, padding rules,
graph capture.

python -m scripts.experiments.probes.probe_gemm --out $OUT/gemm_probe.json     # from the repository
root
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from sparsity.backends.cusparselt.compressor import Compressor, OperandLayout
from sparsity.backends.cusparselt.library import ORDER_ROW, lib, version
from sparsity.backends.cusparselt.plans import empty_d
from sparsity.backends.cusparselt.search import choice_record, get_plan
from sparsity.backends.timing import median_cuda_ms
from sparsity.pruning.reference import tile_greedy_mask


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="JSON lines file, one line appended per part")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--part", default="basic")
    args = ap.parse_args()
    dev = torch.device("cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    res = {"dtype": args.dtype, "part": args.part}

    def flush(**kw):
        res.update(kw)
        torch.cuda.synchronize()
        with open(args.out, "a") as f:
            f.write(json.dumps(res, default=str) + "\n")
        print(json.dumps(res, default=str), flush=True)

    t0 = time.perf_counter()
    lib()
    res["nvmath_import_s"] = time.perf_counter() - t0
    res["cusparselt_version"] = version()
    out_f, in_f = 4096, 1024
    torch.manual_seed(0)
    W = torch.randn(out_f, in_f, device=dev, dtype=dtype)
    mask = tile_greedy_mask(W)
    Wm = torch.where(mask, W, torch.zeros((), dtype=dtype, device=dev))
    cf = Compressor(0, OperandLayout.for_weight(out_f, in_f, "fwd"), dtype)
    cd = Compressor(0, OperandLayout.for_weight(out_f, in_f, "dgrad"), dtype)
    cw, cwt = cf(Wm), cd(Wm)
    part = args.part
    try:
        if part == "basic":
            res["compress_ms"] = {
                "fwd": median_cuda_ms(lambda: cf(Wm, cw), 10, 50),
                "dgrad": median_cuda_ms(lambda: cd(Wm, cwt), 10, 50),
            }
            for tokens in (4096, 32768):
                x = torch.randn(tokens, in_f, device=dev, dtype=dtype)
                dy = torch.randn(tokens, out_f, device=dev, dtype=dtype)
                r = res[str(tokens)] = {}
                pl = get_plan(out_f, in_f, "fwd", tokens, dtype, 0, search=False)
                y = empty_d(pl, dev)
                pl.run(cw, x, y)
                r["fwd_col"] = {
                    "err": rel(y, F.linear(x, Wm)),
                    "ms": median_cuda_ms(lambda: pl.run(cw, x, y), 10, 50),
                    "alg": pl.current_alg(),
                    "ws": pl.workspace.numel(),
                }
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(200):
                    pl.run(cw, x, y)
                r["host_us_per_call"] = (time.perf_counter() - t) / 200 * 1e6
                torch.cuda.synchronize()
                pl = get_plan(out_f, in_f, "dgrad", tokens, dtype, 0, search=False)
                dx = empty_d(pl, dev)
                pl.run(cwt, dy, dx)
                r["dgrad_col"] = {
                    "err": rel(dx, dy @ Wm),
                    "ms": median_cuda_ms(lambda: pl.run(cwt, dy, dx), 10, 50),
                    "alg": pl.current_alg(),
                }
                r["dense_fwd_ms"] = median_cuda_ms(lambda: F.linear(x, Wm), 10, 50)
                r["dense_dgrad_ms"] = median_cuda_ms(lambda: dy @ Wm, 10, 50)
                torch.cuda.synchronize()
            src = torch.empty(1 << 29, dtype=torch.uint8, device=dev).random_()
            dst = torch.empty_like(src)
            ms = median_cuda_ms(lambda: dst.copy_(src), 10, 50)
            res["copy_TBps"] = 2 * src.numel() / (ms * 1e-3) / 1e12
            small = torch.empty(8 << 20, dtype=torch.uint8, device=dev).random_()
            sdst = torch.empty_like(small)
            res["copy_8MB_us"] = median_cuda_ms(lambda: sdst.copy_(small), 20, 200) * 1e3
        elif part == "row":
            tokens = 32768
            x = torch.randn(tokens, in_f, device=dev, dtype=dtype)
            pl = get_plan(out_f, in_f, "fwd", tokens, dtype, 0, d_order=ORDER_ROW, search=False)
            y = empty_d(pl, dev)
            pl.run(cw, x, y)
            res["fwd_row"] = {
                "err": rel(y.t(), F.linear(x, Wm)),
                "ms": median_cuda_ms(lambda: pl.run(cw, x, y), 10, 50),
                "alg": pl.current_alg(),
            }
        elif part == "bN":
            tokens = 32768
            x = torch.randn(tokens, in_f, device=dev, dtype=dtype)
            xt = x.t().contiguous()
            pl = get_plan(out_f, in_f, "fwd", tokens, dtype, 0, b_transposed=False, search=False)
            y = empty_d(pl, dev)
            pl.run(cw, xt, y)
            res["fwd_bN"] = {
                "err": rel(y, F.linear(x, Wm)),
                "ms": median_cuda_ms(lambda: pl.run(cw, xt, y), 10, 50),
            }
        elif part == "bias":
            tokens = 32768
            x = torch.randn(tokens, in_f, device=dev, dtype=dtype)
            bias = torch.randn(out_f, device=dev, dtype=dtype)
            pl = get_plan(out_f, in_f, "fwd", tokens, dtype, 0, has_bias=True, search=False)
            y = empty_d(pl, dev)
            pl.run(cw, x, y, bias)
            res["fwd_bias"] = {
                "err": rel(y, F.linear(x, Wm) + bias),
                "ms": median_cuda_ms(lambda: pl.run(cw, x, y, bias), 10, 50),
            }
        elif part == "search":
            for tokens in (16384, 32768, 58496):
                x = torch.randn(tokens, in_f, device=dev, dtype=dtype)
                dy = torch.randn(tokens, out_f, device=dev, dtype=dtype)
                for kind, a, b, ref in (
                    ("fwd", cw, x, lambda: F.linear(x, Wm)),
                    ("dgrad", cwt, dy, lambda: dy @ Wm),
                ):
                    pl = get_plan(
                        out_f,
                        in_f,
                        kind,
                        tokens,
                        dtype,
                        0,
                        search=True,
                        a_compressed=a,
                        b=b,
                        reference=ref,
                    )
                    d = empty_d(pl, dev)
                    pl.run(a, b, d)
                    res[f"{kind}_{tokens}"] = {
                        "err": rel(d, ref()),
                        "ms": median_cuda_ms(lambda: pl.run(a, b, d), 10, 50),
                        "record": choice_record(pl.key),
                        "ws": pl.workspace.numel(),
                    }
                    torch.cuda.synchronize()
                    flush()
        elif part == "odd":
            odd = res["odd_tokens"] = {}
            for tokens in (4097, 4100, 4104, 4112, 4120):
                x = torch.randn(tokens, in_f, device=dev, dtype=dtype)
                try:
                    pl = get_plan(out_f, in_f, "fwd", tokens, dtype, 0, search=False)
                    y = empty_d(pl, dev)
                    pl.run(cw, x, y)
                    torch.cuda.synchronize()
                    odd[tokens] = rel(y, F.linear(x, Wm))
                except Exception as e:  # noqa: BLE001
                    odd[tokens] = repr(e)[:200]
                flush()
        elif part == "graph":
            tokens = 4096
            x = torch.randn(tokens, in_f, device=dev, dtype=dtype)
            pl = get_plan(out_f, in_f, "fwd", tokens, dtype, 0, search=False)
            y = empty_d(pl, dev)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                pl.run(cw, x, y)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                pl.run(cw, x, y)
            x.copy_(torch.randn_like(x))
            y.zero_()
            g.replay()
            torch.cuda.synchronize()
            res["graph_err"] = rel(y, F.linear(x, Wm))
        flush()
    except Exception as e:  # noqa: BLE001
        res["error"] = repr(e)[:400]
        try:
            flush()
        except Exception:  # noqa: BLE001
            with open(args.out, "a") as f:
                f.write(json.dumps(res, default=str) + "\n")
            print(json.dumps(res, default=str))


if __name__ == "__main__":
    main()
