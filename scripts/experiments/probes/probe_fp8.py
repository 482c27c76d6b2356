"""Probe (GPU): does 2:4 pay on top of FP8 on Hopper? cuSPARSELt's e4m3 2:4 GEMM against an FP8
dense GEMM (cuBLASLt through `torch._scaled_mm`) at the ViT-L MLP shapes, per GEMM and per MLP, with
the bf16 pair beside them measured in the same run.

    python -m scripts.experiments.probes.probe_fp8 --out results/bench/ledger_h200/fp8_24_h200.json

Shapes: y = x W^T with W (m x k) and x (tokens x k). (4096, 1024) is fc1's forward and fc2's input
gradient (with W^T materialised: FP8 tensor cores read both operands K-major, so an FP8 input
gradient needs a transposed copy of the weight, as the 2:4 path already packs one); (1024, 4096) is
fc2's forward and fc1's input gradient. The MLP's four GEMMs that 2:4 covers in the student are
twice the sum of the two shapes. Rows, each timed as CUDA-graph replays (no host time), medians of
`--rounds` rounds after a heat phase:

  bf16 dense      F.linear
  bf16 2:4        torch._cslt_sparse_mm (cuSPARSELt), the algorithm searched
  fp8 dense       torch._scaled_mm, per-tensor scales, bf16 out (plain and fast accumulation)
  fp8 2:4         torch._cslt_sparse_mm on e4m3 operands, bf16 out, the algorithm searched, then
                  the two scales applied to its output (fp8_24_no_scale: without that multiply)

Beside them, what an FP8 step would add: the per-tensor quantisation of x (amax, scale, cast;
eager and compiled) and cuSPARSELt's compression of an e4m3 weight (once per step, as the 2:4 path
re-packs its weights after every optimizer step). Numerics are checked against an independent fp32
product of the dequantised operands. Every refusal is recorded with the library's message, not
raised: what the installed stack cannot do is part of the answer.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
SHAPES = (("fc1", 4096, 1024), ("fc2", 1024, 4096))  # (name, m = out features, k = in features)
ROWS = (
    "bf16_dense",
    "bf16_24",
    "fp8_dense",
    "fp8_dense_fast_accum",
    "fp8_24",
    "fp8_24_no_scale",
    "fp8_24_alpha",
)


def quantize_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3: (q, scale) with x ~ q * scale and the largest |x| mapped to E4M3_MAX."""
    amax = x.detach().abs().amax().float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def prune_24(w: torch.Tensor) -> torch.Tensor:
    """The two entries of largest magnitude kept in each group of four along the last dim (ties as
    torch.topk breaks them), the others zero."""
    groups = w.reshape(*w.shape[:-1], -1, 4)
    keep = groups.abs().float().topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return (groups * mask).reshape(w.shape)


def mlp_totals(per_shape: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """ms of the MLP's four 2:4-covered GEMMs per row: twice the sum over the two shapes (forward and
    input gradient of fc1 and fc2); None where any shape lacks the row."""
    out = {}
    for row in ROWS:
        vals = [shape.get(row) for shape in per_shape.values()]
        out[row] = None if any(v is None for v in vals) else round(2 * sum(vals), 4)
    return out


def ratios(ms: dict[str, float | None]) -> dict[str, float | None]:
    """Speed ratios (baseline ms / row ms, >1 faster): 2:4 against dense in each dtype, and FP8 rows
    against bf16 dense."""

    def r(base, row):
        a, b = ms.get(base), ms.get(row)
        return None if a is None or b is None or b <= 0 else round(a / b, 3)

    return {
        "bf16_24_vs_bf16_dense": r("bf16_dense", "bf16_24"),
        "fp8_24_vs_fp8_dense": r("fp8_dense", "fp8_24"),
        "fp8_24_vs_fp8_dense_fast_accum": r("fp8_dense_fast_accum", "fp8_24"),
        "fp8_24_no_scale_vs_fp8_dense": r("fp8_dense", "fp8_24_no_scale"),
        "fp8_24_alpha_vs_fp8_dense": r("fp8_dense", "fp8_24_alpha"),
        "fp8_dense_vs_bf16_dense": r("bf16_dense", "fp8_dense"),
        "fp8_24_vs_bf16_dense": r("bf16_dense", "fp8_24"),
    }


def _searched(compressed, dense_b, **kw):
    """torch's cuSPARSELt product with the algorithm its search picks (the search's answer is an id,
    or (id, split_k, split_k_mode, ...) in newer releases)."""
    found = torch._cslt_sparse_mm_search(compressed, dense_b, **kw)
    if isinstance(found, int):
        return {"alg_id": found}
    return {"alg_id": int(found[0]), "split_k": int(found[1]), "split_k_mode": int(found[2])}


def _try(record: dict, key: str, fn):
    """fn()'s value, or None with the refusal recorded under record['errors'][key]."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a refusal is a result here
        record.setdefault("errors", {})[key] = repr(e)[:300]
        return None


def _shape_case(name: str, m: int, k: int, tokens: int, sets: int, record: dict):
    """The inputs and the row callables of one shape (those the stack accepts); numerics into
    record."""
    import torch.nn.functional as F  # noqa: PLC0415

    from scripts.bench_sparse import rel  # noqa: PLC0415

    dev = "cuda"
    w = prune_24(torch.randn(m, k, device=dev) * 0.02)
    xs = [torch.randn(tokens, k, device=dev).to(torch.bfloat16) for _ in range(sets)]
    wb = w.to(torch.bfloat16)
    wq, sw = quantize_e4m3(w)  # pruned before the cast: zeros stay zeros
    quant = [quantize_e4m3(x) for x in xs]
    ref = (quant[0][0].float() * quant[0][1]) @ (wq.float() * sw).t()
    rows = {"bf16_dense": lambda i: F.linear(xs[i], wb)}

    cb = _try(record, "bf16_compress", lambda: torch._cslt_compress(wb))
    if cb is not None:
        kw_b = _try(record, "bf16_search", lambda: _searched(cb, xs[0].t(), transpose_result=True))
        kw_b = kw_b or {}
        record["bf16_24_alg"] = kw_b
        rows["bf16_24"] = lambda i: torch._cslt_sparse_mm(
            cb, xs[i].t(), transpose_result=True, **kw_b
        )

    def scaled(i, fast):
        q, s = quant[i]
        return torch._scaled_mm(
            q, wq.t(), scale_a=s, scale_b=sw, out_dtype=torch.bfloat16, use_fast_accum=fast
        )

    if _try(record, "fp8_dense", lambda: scaled(0, False)) is not None:
        record["fp8_dense_rel_err"] = round(rel(scaled(0, False), ref), 6)
        rows["fp8_dense"] = lambda i: scaled(i, False)
        rows["fp8_dense_fast_accum"] = lambda i: scaled(i, True)

    cq = _try(record, "fp8_compress", lambda: torch._cslt_compress(wq))
    if cq is not None:
        common = {"out_dtype": torch.bfloat16, "transpose_result": True}
        kw = _try(record, "fp8_search", lambda: _searched(cq, quant[0][0].t(), **common))
        kw = {**common, **(kw or {})}
        record["fp8_24_alg"] = {k: v for k, v in kw.items() if k.endswith(("_id", "split_k"))}

        def sparse_fp8(i):
            q, s = quant[i]
            # the two per-tensor scales applied by the caller: cuSPARSELt's alpha is a host scalar
            # or a per-row vector in torch's binding; one multiply of a bf16 output is the honest
            # upper bound of what the scale costs
            return torch._cslt_sparse_mm(cq, q.t(), **kw).mul_(s * sw)

        out = _try(record, "fp8_24", lambda: sparse_fp8(0))
        if out is not None:
            record["fp8_24_rel_err"] = round(rel(out, ref), 6)
            rows["fp8_24"] = sparse_fp8
            rows["fp8_24_no_scale"] = lambda i: torch._cslt_sparse_mm(cq, quant[i][0].t(), **kw)
        # the scales inside the GEMM: cuSPARSELt's per-row alpha vector (one value repeated here)
        alphas = [(s * sw).float().expand(m).contiguous() for _, s in quant]
        out = _try(
            record,
            "fp8_24_alpha",
            lambda: torch._cslt_sparse_mm(cq, quant[0][0].t(), alpha=alphas[0], **kw),
        )
        if out is not None:
            record["fp8_24_alpha_rel_err"] = round(rel(out, ref), 6)
            rows["fp8_24_alpha"] = lambda i: torch._cslt_sparse_mm(
                cq, quant[i][0].t(), alpha=alphas[i], **kw
            )
    return rows, xs


def _side_costs(tokens: int, k: int, m: int, record: dict):
    """ms of quantising x (tokens x k, bf16) eager and compiled, and of compressing an e4m3 weight."""
    from scripts.benchmarks.timing import median_ms  # noqa: PLC0415

    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    record["quantize_eager_ms"] = round(median_ms(lambda i: quantize_e4m3(x), 1, 3, 20), 4)
    compiled = torch.compile(quantize_e4m3)
    record["quantize_compiled_ms"] = _try(
        record, "quantize_compiled", lambda: round(median_ms(lambda i: compiled(x), 1, 3, 20), 4)
    )
    # the floor: read bf16, write e4m3, at the copy bandwidth measured in this run
    record["quantize_floor_ms"] = round(3 * x.numel() / (record["copy_TBps"] * 1e12) * 1e3, 4)
    wq, _ = quantize_e4m3(prune_24(torch.randn(m, k, device="cuda")))
    record["compress_e4m3_weight_ms"] = _try(
        record,
        "compress",
        lambda: round(median_ms(lambda i: torch._cslt_compress(wq), 1, 3, 20), 4),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--tokens", type=int, default=44160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--heat-s", type=float, default=20.0)
    args = ap.parse_args()

    from scripts.bench_sparse import ceilings  # noqa: PLC0415
    from scripts.benchmarks.timing import graph_ms, heat  # noqa: PLC0415

    sets = 2
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cusparselt": torch.backends.cusparselt.version(),
        "host": platform.node(),
        "tokens": args.tokens,
        "rounds": args.rounds,
        **ceilings(),
        "shapes": {},
    }
    for name, m, k in SHAPES:
        rec = {"m": m, "k": k}
        rows, _ = _shape_case(name, m, k, args.tokens, sets, rec)
        heat(lambda: [fn(0) for fn in rows.values()], args.heat_s / len(SHAPES))
        per_round = {row: [] for row in rows}
        for _ in range(args.rounds):
            for row, fn in rows.items():
                ms = _try(rec, f"time_{row}", lambda fn=fn: graph_ms(fn, sets))
                if ms is not None:
                    per_round[row].append(ms)
        rec["ms"] = {
            row: (round(statistics.median_high(v), 4) if v else None)
            for row, v in per_round.items()
        }
        rec["ms_rounds"] = {row: [round(t, 4) for t in v] for row, v in per_round.items()}
        rec["ratios"] = ratios(rec["ms"])
        flops = 2 * m * k * args.tokens
        rec["dense_TFLOPs"] = {
            row: round(flops / (ms * 1e-3) / 1e12, 1) for row, ms in rec["ms"].items() if ms
        }
        res["shapes"][name] = rec
        print(json.dumps({name: {"ms": rec["ms"], "ratios": rec["ratios"]}}), flush=True)
    per_shape_ms = {n: r["ms"] for n, r in res["shapes"].items()}
    res["mlp_ms"] = mlp_totals(per_shape_ms)
    res["mlp_ratios"] = ratios(res["mlp_ms"])
    side = {"copy_TBps": res["copy_TBps"]}
    _side_costs(args.tokens, 1024, 4096, side)
    res["side_costs"] = side
    print(json.dumps({"mlp_ms": res["mlp_ms"], "mlp_ratios": res["mlp_ratios"], **side}))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
