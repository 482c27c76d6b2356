"""Benchmark 2:4 sparse training kernels against dense, side by side in one run (GPU).

    python3 -m scripts.bench_sparse --out results/bench/sparse_h100.json --md results/bench/sparse_h100.md

Shapes: the ViT-L MLP linears, fc1 1024->4096 and fc2 4096->1024, at 16384, 32768 and 58496 tokens;
bf16 and fp16. Rows (`op`):
  gemm           one GEMM alone, `gemm` = fwd (x @ W^T) or dgrad (dy @ W): dense cuBLAS on the pruned W vs
                 cusparselt (cached nvmath plan, searched algorithm) vs torch's stock `_cslt_sparse_mm`
  linear_fwd_bwd a linear layer forward + backward through the real autograd function: nn.Linear vs
                 SemiSparseLinear(backend=...), fp32 master weights under autocast (the usual training set-up),
                 bias, input that needs a gradient; sparse rows include re-pruning and packing W every step
  mlp_fwd_bwd    fc1 -> GELU -> fc2 forward + backward, same set-up
  prune_pack     prune W (tile_greedy) and produce what both sparse GEMMs read (W and W^T), 4096x1024 / 1024x4096;
                 `floor_us` = bytes moved / measured copy bandwidth
  wgrad          the weight gradient dW = dy^T @ x with dy^T pruned 2:4 along tokens by MVUE (the operand changes
                 every step): the dense GEMM against the GEMM on cuSPARSELt, and what making the operand costs
                 (today's kernels unfused; the floor of one pass reading dy and writing the compressed operand; the
                 floor of a pass fused into the kernel that already writes dy: the compressed write alone)
Timing: CUDA events around each call after warm-up, median; inputs rotated over several sets
(weights over 8 for prune_pack) so that nothing is served from the 50 MB L2. `graph` = true rows
replay a captured CUDA graph (one per input set), false rows run eagerly (host overhead included).
`dense_ms` is the dense reference of the same row measured in the same run; speedup = dense_ms / ms.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from scripts.benchmarks import bad_algs

TOKENS = [16384, 32768, 58496]
N_SETS = 3


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="results/bench/sparse_h100.json")
    ap.add_argument("--md", default=None, help="also write the table as markdown here")
    ap.add_argument("--tokens", type=int, nargs="*", default=TOKENS)
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "fp16"])
    ap.add_argument(
        "--ops",
        nargs="*",
        default=["prune_pack", "gemm", "linear_fwd_bwd", "mlp_fwd_bwd", "kernels"],
    )
    bad_algs.add_argument(ap)
    ap.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="RUN",
        help="merge earlier runs (their JSON, or stdout logs) into --out/--md instead of measuring",
    )
    return ap


if __name__ == "__main__":  # --help and a usage error answer here, before torch is imported
    build_parser().parse_args()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from scripts.benchmarks.linear_layers import linear_pair, mlp  # noqa: E402
from scripts.benchmarks.linear_profiles import bench_host, kernel_breakdown  # noqa: E402
from scripts.benchmarks.sparse_results import fmt_table, merge_runs, write_json  # noqa: E402
from scripts.benchmarks.timing import graph_ms, median_ms  # noqa: E402

SHAPES = [(1024, 4096), (4096, 1024)]  # (in, out): fc1, fc2


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


class Bench:
    def __init__(self, args):
        self.args = args
        self.rows = []
        self.t0 = time.time()

    def add(self, **row):
        if row.get("dense_ms") and row.get("ms"):
            row["speedup"] = round(row["dense_ms"] / row["ms"], 4)
        for k in ("ms", "dense_ms"):
            if k in row and row[k] is not None:
                row[k] = round(row[k], 5)
        self.rows.append(row)
        print(json.dumps(row), flush=True)


# --------------------------------------------------------------------------------------------------


def bench_prune_pack(B, dtype, copy_tbps):
    for in_f, out_f in SHAPES:
        _bench_prune_pack_shape(B, dtype, copy_tbps, in_f, out_f)


def _bench_prune_pack_shape(B, dtype, copy_tbps, in_f, out_f):
    """The prune_pack rows of one weight shape. A function of its own so that its weights and copy
    buffers are freed on return, before the next shape allocates its own (the timed closures all run
    before then)."""
    from sparsity.backends.cusparselt.compressor import OperandLayout, compressor
    from sparsity.kernels.pack_cusparselt import prune_dense, prune_pack
    from sparsity.packing import layout as L
    from sparsity.pruning import prune

    dn = str(dtype).replace("torch.", "")
    ws = [torch.randn(out_f, in_f, device="cuda", dtype=dtype) for _ in range(8)]
    size = L.compressed_size(out_f, in_f)
    nbytes = out_f * in_f * 2 + 2 * size + out_f * in_f // 8
    floor_us = nbytes / (copy_tbps * 1e12) * 1e6
    base = {
        "op": "prune_pack",
        "tokens": 0,
        "in_features": in_f,
        "out_features": out_f,
        "dtype": dn,
        "floor_us": round(floor_us, 2),
        "bytes": nbytes,
    }
    # a plain copy of the same traffic, for the ceiling at this size
    srcs = [torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda") for _ in range(8)]
    dsts = [torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda") for _ in range(8)]
    copy_ms = median_ms(lambda i: dsts[i].copy_(srcs[i]), 8, 10, 100)
    copy_g = graph_ms(lambda i: dsts[i].copy_(srcs[i]), 8, 3, 100)
    B.add(**base, backend="copy_same_bytes", ms=copy_ms, graph=False, dense_ms=None)
    B.add(**base, backend="copy_same_bytes", ms=copy_g, graph=True, dense_ms=None)
    # dense path's pruning (the Triton tile_greedy kernel writing values + mask): what "dense" pays
    # per step
    dense_prune = median_ms(lambda i: prune(ws[i], "tile_greedy"), 8, 10, 100)
    B.add(
        **base,
        backend="prune_dense_fused (auto's dense path)",
        ms=graph_ms(lambda i: prune_dense(ws[i]), 8, 3, 100),
        graph=True,
        dense_ms=dense_prune,
    )
    fused = median_ms(lambda i: prune_pack(ws[i]), 8, 10, 100)
    fused_g = graph_ms(lambda i: prune_pack(ws[i]), 8, 3, 100)
    B.add(**base, backend="cusparselt_fused", ms=fused, graph=False, dense_ms=dense_prune)
    B.add(**base, backend="cusparselt_fused", ms=fused_g, graph=True, dense_ms=dense_prune)
    # the library path: Triton prune + cusparseLtSpMMACompress2 for W and for W^T
    cf = compressor(0, OperandLayout.for_weight(out_f, in_f, "fwd"), dtype)
    cd = compressor(0, OperandLayout.for_weight(out_f, in_f, "dgrad"), dtype)

    def lib_path(i):
        v, _ = prune(ws[i], "tile_greedy")
        cf(v)
        cd(v)

    B.add(
        **base,
        backend="cusparselt_library_compress",
        ms=median_ms(lib_path, 8, 5, 50),
        graph=False,
        dense_ms=dense_prune,
    )

    def torch_path(i):
        v, _ = prune(ws[i], "tile_greedy")
        torch._cslt_compress(v)
        torch._cslt_compress(v.t().contiguous())

    B.add(
        **base,
        backend="torch_cslt_compress",
        ms=median_ms(torch_path, 8, 5, 50),
        graph=False,
        dense_ms=dense_prune,
    )


def bench_gemms(B, dtype, in_f, out_f, tokens):
    from sparsity.backends import get_backend

    dn = str(dtype).replace("torch.", "")
    cs = get_backend("cusparselt")
    w = torch.randn(out_f, in_f, device="cuda", dtype=dtype)
    sw = cs.sparsify(w, "tile_greedy")
    wp = sw.to_dense()
    xs = [torch.randn(tokens, in_f, device="cuda", dtype=dtype) for _ in range(N_SETS)]
    dys = [torch.randn(tokens, out_f, device="cuda", dtype=dtype) for _ in range(N_SETS)]
    # correctness on this exact shape (fresh inputs)
    err_f = rel(sw.matmul(xs[0]), xs[0].float() @ wp.float().t())
    err_d = rel(sw.matmul_t(dys[0]), dys[0].float() @ wp.float())
    base = {"op": "gemm", "tokens": tokens, "in_features": in_f, "out_features": out_f, "dtype": dn}
    cw = torch._cslt_compress(wp)
    cwt = torch._cslt_compress(wp.t().contiguous())
    for gemm, dense_fn, sparse_fn, torch_fn, err in (
        (
            "fwd",
            lambda i: F.linear(xs[i], wp),
            lambda i: sw.matmul(xs[i]),
            lambda i: torch._cslt_sparse_mm(cw, xs[i].t(), transpose_result=True),
            err_f,
        ),
        (
            "dgrad",
            lambda i: dys[i] @ wp,
            lambda i: sw.matmul_t(dys[i]),
            lambda i: torch._cslt_sparse_mm(cwt, dys[i].t(), transpose_result=True),
            err_d,
        ),
    ):
        for graph in (False, True):
            timer = (lambda f: graph_ms(f, N_SETS)) if graph else (lambda f: median_ms(f, N_SETS))
            d = timer(dense_fn)
            B.add(**base, gemm=gemm, backend="dense", ms=d, dense_ms=d, graph=graph)
            B.add(
                **base,
                gemm=gemm,
                backend="cusparselt",
                ms=timer(sparse_fn),
                dense_ms=d,
                graph=graph,
                rel_err=round(err, 7),
            )
            # torch's eager fp16 path takes 0.2-0.35 s per call on the H100 (transpose_result): time
            # it briefly
            slow = dtype == torch.float16 and not graph
            t_torch = (lambda f: median_ms(f, N_SETS, 1, 3)) if slow else timer
            try:
                B.add(
                    **base,
                    gemm=gemm,
                    backend="torch_cslt",
                    ms=t_torch(torch_fn),
                    dense_ms=d,
                    graph=graph,
                )
            except Exception as e:  # noqa: BLE001
                B.add(
                    **base,
                    gemm=gemm,
                    backend="torch_cslt",
                    ms=None,
                    dense_ms=d,
                    graph=graph,
                    error=repr(e)[:200],
                )


def bench_wgrad(B, dtype, in_f, out_f, tokens):
    """The `wgrad` rows of one shape: is 2:4 on the weight gradient worth a pruning pass? (graph
    replays only: the question is GPU time)."""
    from sparsity.backends.cusparselt.backend import CuSparseLtSparseWeight
    from sparsity.backends.cusparselt.ops import prune_pack
    from sparsity.packing import layout as L
    from sparsity.pruning import mvue, prune

    dn = str(dtype).replace("torch.", "")
    xs = [torch.randn(tokens, in_f, device="cuda", dtype=dtype) for _ in range(N_SETS)]
    dys = [torch.randn(tokens, out_f, device="cuda", dtype=dtype) for _ in range(N_SETS)]
    operands = [
        prune(mvue(dy.t(), seed), "rowwise") for seed, dy in enumerate(dys)
    ]  # (out, tokens): MVUE is 2:4
    sws = [
        CuSparseLtSparseWeight(
            (out_f, tokens), prune_pack(v, m, False)[0], None, dtype, mask=m, values=v
        )
        for v, m in operands
    ]
    err = rel(
        sws[0].matmul(xs[0].t()).t(), operands[0][0].float() @ xs[0].float()
    )  # dW^T comes back
    written = L.compressed_size(out_f, tokens)
    read = tokens * out_f * dtype.itemsize
    base = {
        "op": "wgrad",
        "gemm": "wgrad",
        "tokens": tokens,
        "in_features": in_f,
        "out_features": out_f,
        "dtype": dn,
        "graph": True,
    }
    dense = graph_ms(lambda i: dys[i].t() @ xs[i], N_SETS)
    B.add(**base, backend="dense", ms=dense, dense_ms=dense)
    B.add(
        **base,
        backend="cusparselt",
        ms=graph_ms(lambda i: sws[i].matmul(xs[i].t()), N_SETS),
        dense_ms=dense,
        rel_err=round(err, 7),
    )
    B.add(
        **base,
        backend="pass: mvue24 kernel (strided dy^T read)",
        ms=graph_ms(lambda i: mvue(dys[i].t(), i), N_SETS),
        dense_ms=None,
    )
    B.add(
        **base,
        backend="pass: pack of the pruned operand",
        ms=graph_ms(lambda i: prune_pack(operands[i][0], operands[i][1], False), N_SETS),
        dense_ms=None,
    )
    half = (read + written) // 2  # a copy of n bytes reads n and writes n
    srcs = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(N_SETS)]
    dsts = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(N_SETS)]
    B.add(
        **base,
        backend="floor: one pass, dy read + operand written",
        bytes=read + written,
        ms=graph_ms(lambda i: dsts[i].copy_(srcs[i]), N_SETS),
        dense_ms=None,
    )
    outs = [torch.empty(written, dtype=torch.uint8, device="cuda") for _ in range(N_SETS)]
    B.add(
        **base,
        backend="floor: fused, operand written alone",
        bytes=written,
        ms=graph_ms(lambda i: outs[i].zero_(), N_SETS),
        dense_ms=None,
    )
    # what `sparsity.weight_grad=mvue24` runs: the one-pass kernel, and the whole weight gradient
    # (pass + 2:4 GEMM)
    from sparsity.backends.cusparselt.ops import cslt_mvue_wgrad
    from sparsity.kernels.mvue import mvue_pack_t

    seeds = [torch.tensor([i], device="cuda") for i in range(N_SETS)]
    B.add(
        **base,
        backend="pass: mvue_pack_t (one pass)",
        ms=graph_ms(lambda i: mvue_pack_t(dys[i], seeds[i]), N_SETS),
        dense_ms=None,
    )
    B.add(
        **base,
        backend="pass: mvue_pack_t (one pass, approximate division)",
        dense_ms=None,
        ms=graph_ms(lambda i: mvue_pack_t(dys[i], seeds[i], exact=False), N_SETS),
    )
    err = rel(cslt_mvue_wgrad(dys[0], xs[0], seeds[0]), mvue(dys[0].t(), 0).float() @ xs[0].float())
    B.add(
        **base,
        backend="mvue24 weight gradient (pass + 2:4 GEMM)",
        rel_err=round(err, 7),
        ms=graph_ms(lambda i: cslt_mvue_wgrad(dys[i], xs[i], seeds[i]), N_SETS),
        dense_ms=dense,
    )


def bench_modules(
    B, dtype, op, tokens, in_f, out_f, backends, x_dtype=torch.float32, input_note=""
):
    """x_dtype: the layer input's dtype. Under autocast a ViT MLP's fc1 reads the LayerNorm output
    (fp32) and fc2 the GELU output (already bf16/fp16, no cast); both are measured, each row says
    which (`input_dtype`)."""
    dn = str(dtype).replace("torch.", "")
    xs = [
        torch.randn(tokens, in_f, device="cuda", dtype=x_dtype, requires_grad=True)
        for _ in range(N_SETS)
    ]
    dys = [torch.randn(tokens, out_f, device="cuda", dtype=dtype) for _ in range(N_SETS)]
    base = {
        "op": op,
        "tokens": tokens,
        "in_features": in_f,
        "out_features": out_f,
        "dtype": dn,
        "input_dtype": str(x_dtype).replace("torch.", "")
        + (f" ({input_note})" if input_note else ""),
    }

    def make(backend):
        return mlp(backend) if op == "mlp_fwd_bwd" else linear_pair(in_f, out_f, backend)

    def stepper(model):
        params = list(model.parameters())

        def step(i):
            for p in params:
                p.grad = None
            xs[i].grad = None
            with torch.autocast("cuda", dtype=dtype):
                y = model(xs[i])
            y.backward(dys[i])

        return step

    dense = {}
    for graph in (False, True):
        for backend in [None] + backends:
            name = backend or "nn.Linear"
            try:
                model = make(backend)
                step = stepper(model)
                step(0)  # first call: plans, algorithm sweeps, auto decisions
                ms = graph_ms(step, N_SETS) if graph else median_ms(step, N_SETS)
                if backend is None:
                    dense[graph] = ms
                B.add(**base, backend=name, ms=ms, dense_ms=dense.get(graph), graph=graph)
            except Exception as e:  # noqa: BLE001
                B.add(
                    **base,
                    backend=name,
                    ms=None,
                    dense_ms=dense.get(graph),
                    graph=graph,
                    error=repr(e)[:300],
                )
            finally:
                torch.cuda.synchronize()


def bench_pack_variants(B, dtype):
    """Launch configurations of the fused kernel (block of units, warps, preload), 4096x1024 and
    1024x4096."""
    from sparsity.kernels import pack_cusparselt as K

    keep = dict(K.CONFIG)
    for in_f, out_f in SHAPES:
        _bench_pack_variants_shape(B, dtype, in_f, out_f)
    K.CONFIG.clear()
    K.CONFIG.update(keep)


def _bench_pack_variants_shape(B, dtype, in_f, out_f):
    """The pack_variant rows of one weight shape; `same_bytes`: the variant packs as the first one
    does."""
    from sparsity.kernels import pack_cusparselt as K

    dn = str(dtype).replace("torch.", "")
    ws = [torch.randn(out_f, in_f, device="cuda", dtype=dtype) for _ in range(8)]
    ref = None
    for preload in (True, False):
        for block, warps in ((128, 4), (64, 2), (256, 8), (128, 8)):
            K.CONFIG.update(block=block, num_warps=warps, preload=preload)
            pk = K.prune_pack(ws[0])
            same = True
            if ref is None:
                ref = pk
            else:
                same = all(torch.equal(a, b) for a, b in zip(ref, pk))
            ms = graph_ms(lambda i: K.prune_pack(ws[i]), 8, 3, 100)
            B.add(
                op="pack_variant",
                backend=f"preload={preload},block={block},warps={warps}",
                tokens=0,
                in_features=in_f,
                out_features=out_f,
                dtype=dn,
                ms=ms,
                dense_ms=None,
                graph=True,
                same_bytes=same,
            )


# --------------------------------------------------------------------------------------------------


def _copy_tbps():
    """Device-to-device copy bandwidth over 1 GiB, TB/s (bytes read + written). A function of its
    own so that the 2 GiB of buffers are freed on return, before `ceilings` allocates its matmul's
    inputs."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda i: dst.copy_(src), 1, 3, 20)
    return 2 * src.numel() / (ms * 1e-3) / 1e12


def ceilings():
    copy_tbps = _copy_tbps()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = median_ms(lambda i: a @ b, 1, 3, 20)
    tflops = 2 * 8192**3 / (ms * 1e-3) / 1e12
    return {"copy_TBps": round(copy_tbps, 3), "bf16_8192cube_TFLOPs": round(tflops, 1)}


def main():
    ap = build_parser()
    args = ap.parse_args()
    if args.merge:
        merge_runs(args.merge, args.out, args.md)
        return
    if not torch.cuda.is_available():
        sys.exit("bench_sparse.py needs a CUDA GPU")
    logging_setup()
    from sparsity.backends import BackendUnavailable, get_backend
    from sparsity.backends.cusparselt.library import (
        loaded_library_path,
        version as cusparselt_version,
    )

    dtypes = [{"bf16": torch.bfloat16, "fp16": torch.float16}[d] for d in args.dtypes]
    B = Bench(args)
    major, minor = torch.cuda.get_device_capability()
    info = {
        "gpu": torch.cuda.get_device_name(),
        "arch": f"sm{major}{minor}",
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "cusparselt": cusparselt_version(),
        "cusparselt_library": bad_algs.short_library_path(loaded_library_path()),
        "bad_algs": bad_algs.apply(args.bad_algs),
        "torch_cusparselt": torch.backends.cusparselt.version(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    info["ceilings"] = ceilings()
    print(json.dumps(info), flush=True)
    backends = []
    unavailable = {}
    for name in ("cusparselt", "cutlass", "auto"):
        try:
            get_backend(name).check(torch.device("cuda"), torch.bfloat16)
            backends.append(name)
        except BackendUnavailable as e:
            unavailable[name] = str(e)
    info["backends"] = backends
    info["unavailable"] = unavailable
    for dtype in dtypes:
        if "pack_variants" in args.ops:
            bench_pack_variants(B, dtype)
        if "host" in args.ops:
            bench_host(B, dtype)
        if "prune_pack" in args.ops:
            bench_prune_pack(B, dtype, info["ceilings"]["copy_TBps"])
        for tokens in args.tokens:
            for in_f, out_f in SHAPES:
                if "gemm" in args.ops:
                    bench_gemms(B, dtype, in_f, out_f, tokens)
                if "wgrad" in args.ops:
                    bench_wgrad(B, dtype, in_f, out_f, tokens)
                if "linear_fwd_bwd" in args.ops:
                    fc1 = in_f < out_f
                    bench_modules(
                        B,
                        dtype,
                        "linear_fwd_bwd",
                        tokens,
                        in_f,
                        out_f,
                        ["dense"] + backends,
                        torch.float32,
                        "LayerNorm output, fc1's real input" if fc1 else "cast inside",
                    )
                    if not fc1:  # fc2's real input: the GELU output, already in the compute dtype
                        bench_modules(
                            B,
                            dtype,
                            "linear_fwd_bwd",
                            tokens,
                            in_f,
                            out_f,
                            ["dense"] + backends,
                            dtype,
                            "GELU output, fc2's real input",
                        )
                x_real = (
                    torch.float32 if in_f < out_f else dtype
                )  # fc1 reads the LayerNorm output, fc2 the GELU's
                if "kernels" in args.ops and dtype == torch.bfloat16 and tokens >= 32768:
                    info.setdefault("kernel_breakdown", []).extend(
                        kernel_breakdown(dtype, tokens, in_f, out_f, x_real)
                    )
                # where auto's eager steps lose time
                if "kernels_auto" in args.ops and dtype == torch.bfloat16:
                    info.setdefault("kernel_breakdown", []).extend(
                        kernel_breakdown(
                            dtype,
                            tokens,
                            in_f,
                            out_f,
                            x_real,
                            backends=(None, "auto", "cusparselt"),
                        )
                    )
            if "mlp_fwd_bwd" in args.ops:
                bench_modules(
                    B,
                    dtype,
                    "mlp_fwd_bwd",
                    tokens,
                    1024,
                    1024,
                    ["dense"] + backends,
                    torch.float32,
                    "LayerNorm output",
                )
            torch.cuda.empty_cache()
            write_json(
                args.out, {**info, "complete": False, "rows": B.rows}
            )  # partial results survive a timeout
    info["auto_decisions"] = (
        get_backend("auto").describe()["decisions"] if "auto" in backends else []
    )
    info["cusparselt_describe"] = (
        get_backend("cusparselt").describe() if "cusparselt" in backends else {}
    )
    info["elapsed_s"] = round(time.time() - B.t0, 1)
    write_json(args.out, {**info, "complete": True, "rows": B.rows})
    table = fmt_table(B.rows)
    if args.md:
        with open(args.md, "w") as f:
            f.write(
                f"# 2:4 sparse vs dense on {info['gpu']} ({info['arch']}), torch {info['torch']}, "
                f"cuSPARSELt {info['cusparselt']}\n\nGenerated by `scripts/bench_sparse.py` "
                f"({info['started']}); "
                f"ceilings: {info['ceilings']}. Backends unavailable here: "
                f"{unavailable}.\n\n{table}\n"
            )
    print(table)


def logging_setup():
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("torch").setLevel(logging.WARNING)


if __name__ == "__main__":
    main()
