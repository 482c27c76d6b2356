"""Benchmark: the logistic-regression probe's C sweep at ImageNet size on one GPU (torch L-BFGS) vs
scikit-learn, and how far its float32 optimum is from the float64 one.

    python scripts/bench_probe.py --out results/bench/probe_h100_3xtf32.json   # 1.28M x 1024, 1000 classes, 45 C
    python scripts/bench_probe.py --n-train 2000 --dim 64 --classes 10 --sklearn-n 500 --device cpu \
        --out /tmp/probe_smoke.json                                      # CPU smoke test

Synthetic, learnable features: class means N(0, s^2 I) plus N(0, I) noise per row, made on the
device in `--dtype` (bf16 by default; never a float64 host copy). The whole protocol runs as
`eval_linear.py` does it (10% hold-out, the C sweep warm-started from small to large C, refit with
the best C, val top-1) in `--precision` (default auto: float32_3xtf32 on a GPU at this size, float64
on CPU). Then the chosen C is solved once more in float64 on the same device, warm-started from the
float32 refit (tighter tol, `--f64-tol`): the record's `float64_check` has both objectives, |f32 -
f64| / f64, the float32 weights' objective evaluated in float64, and both val top-1. scikit-learn's
lbfgs (float64, 16 CPU threads on the H100 host) is timed on a row subset for a few C values at a
fixed iteration count; its full-size time is extrapolated as seconds per iteration per row x rows x
the iterations the torch sweep needed (the same algorithm on the same objective; sklearn cold-starts
each C as the reference, so this is a lower bound). `--time-limit` stops the sweep early and reports
what ran (partial=true).

Superseded: the committed results/bench/probe_h100.json (39 s, 223 iterations, 47 ms per evaluation)
ran on the TF32-only path (precision float32_tf32 here, now an explicitly inexact benchmarking
option). Its weights were rounded to 10 mantissa bits in every GEMM, and from C ~ 0.3 up the
warm-started L-BFGS stopped after 0-10 iterations (0 for most C >= 1); an earlier measurement found
the fits from C ~ 18 up ending 5% above the float64 optimum, top-1 0.88 pp lower. Its iteration
count and time are not those of a converged sweep. Its prediction (25 ms per evaluation, ~4000
iterations, ~2 minutes) was for that path too.

Prediction for the converging default (float32_3xtf32), written before measuring (H100 SXM, bf16
features): one evaluation is 4 TF32 GEMMs (the bf16 features are exact in TF32: only the weights and
the softmax gradient are split into hi + lo) of 2 * 1.28M * 1024 * 1000 = 2.6 TFLOP each, 10.5
TFLOP, ~30 ms at ~350 TFLOP/s; plus the elementwise work on the fp32 (n, 1000) logits that the TF32
run measured (~30 ms of its 47 ms) and the hi/lo split of the softmax gradient (~15 GB of traffic,
~6 ms): evaluation_ms ~ 70 (range 60-85) at 1.28M rows, ~63 ms at the sweep's 1.15M. Iterations:
~3-20 per C up to C ~ 0.1 as before; above, each warm-started C now runs to max |gradient| <= 1e-6;
the problem is close to separable there (train loss 0.002 at C = 1e5), where a float64 CPU analogue
(8000 x 64, 100 classes) needed 50-135 iterations per C at C ~ 0.1-100: ~1200 iterations in all
(range 400-3000), ~1.15 evaluations each, plus ~0.2 s per C outside the solver: sweep + refit ~100 s
(range 40-250 s), under the 5-minute bound. The float64 solve at the chosen C (~3e-4, well
conditioned): ~0.3 s per evaluation, 5-40 iterations, ~10 s; relative objective gap < 1e-6, the same
val top-1 to 0.01 pp.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from configs.eval_schema import INEXACT_PRECISIONS, PRECISIONS


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n-train", type=int, default=1_281_167)
    ap.add_argument("--n-val", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--n-c", type=int, default=45)
    ap.add_argument(
        "--mean-scale",
        type=float,
        default=0.16,
        help="class-mean std (noise std 1); 0.16: 95%% val top-1 at 1024 x 1000",
    )
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--max-iter", type=int, default=1000)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument(
        "--precision",
        choices=PRECISIONS + INEXACT_PRECISIONS,
        default="auto",
        help="torch solver arithmetic (auto: float32_3xtf32 for large GPU problems); float32_tf32 "
        "is "
        "the superseded, inexact TF32-only path",
    )
    ap.add_argument(
        "--f64-tol",
        type=float,
        default=1e-8,
        help="stop tolerance of the float64 solve at the chosen C",
    )
    ap.add_argument("--f64-max-iter", type=int, default=300)
    ap.add_argument(
        "--time-limit",
        type=float,
        default=0.0,
        help="stop the sweep after this many seconds (0: none)",
    )
    ap.add_argument(
        "--sklearn-n", type=int, default=20_000, help="rows of the sklearn subset (0: skip)"
    )
    ap.add_argument(
        "--sklearn-iters", type=int, default=20, help="lbfgs iterations per C in the sklearn timing"
    )
    ap.add_argument("--sklearn-n-c", type=int, default=2, help="C values timed with sklearn")
    ap.add_argument("--device", default=None, help="default: cuda where there is a GPU, else cpu")
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON path (default: results/bench/probe_<gpu>.json)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--agreement", type=int, default=1, help="also compare torch and sklearn on a small problem"
    )
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


if __name__ == "__main__":  # --help and a usage error answer here, before torch is imported
    build_parser().parse_args()

import torch  # noqa: E402

from evaluation.logreg import (  # noqa: E402
    MATMUL_MODES,
    SklearnLBFGS,
    TorchLBFGS,
    c_grid,
    objective_and_grad,
    topk_accuracy,
)
from evaluation.probe import best_C, holdout_split  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# written before measuring (module docstring): float32_3xtf32 on an H100, bf16 features
PREDICTION = {
    "precision": "float32_3xtf32",
    "evaluation_ms": 70,
    "evaluation_ms_range": [60, 85],
    "total_iterations": 1200,
    "total_iterations_range": [400, 3000],
    "seconds": 100,
    "seconds_range": [40, 250],
    "float64_check_seconds": 10,
    "float64_rel_gap_below": 1e-6,
}


def synthetic(
    n: int, means: torch.Tensor, dtype: torch.dtype, generator: torch.Generator, chunk: int = 131072
):
    """Rows mean[y] + N(0, I), built chunk by chunk on the means' device, stored in `dtype`."""
    classes, dim = means.shape
    device = means.device
    y = torch.randint(0, classes, (n,), device=device, generator=generator)
    x = torch.empty(n, dim, dtype=dtype, device=device)
    for start in range(0, n, chunk):
        yc = y[start : start + chunk]
        noise = torch.randn(len(yc), dim, device=device, generator=generator)
        x[start : start + chunk] = (means[yc] + noise).to(dtype)
    return x, y


def gpu_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    for tag in ("h100", "h200", "a100", "l40", "a10", "v100"):
        if tag in name:
            return tag
    return name.replace(" ", "_")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torch_sweep(args, solver, x, y, xv, yv, device) -> dict:
    """The protocol of evaluation.probe.run_probe, step by step, so a time limit can stop it."""
    fit_idx, hold_idx = holdout_split(len(y), 0.1, args.seed)
    fit_idx, hold_idx = fit_idx.to(device), hold_idx.to(device)
    x_fit, y_fit, x_hold, y_hold = x[fit_idx], y[fit_idx], x[hold_idx], y[hold_idx]
    start = time.perf_counter()
    curve, fits, previous, partial = [], {}, None, False
    for C in c_grid(-6, 5, args.n_c):
        fit = solver.fit(x_fit, y_fit, args.classes, C, init=previous)
        curve.append(
            {
                "C": C,
                "holdout_top1": topk_accuracy(x_hold, y_hold, fit, ks=(1,))[1],
                "loss": fit.loss,
                "n_iter": fit.n_iter,
                "seconds": round(fit.seconds, 3),
                "precision": fit.precision,
            }
        )
        fits[C] = previous = fit
        print(json.dumps(curve[-1]), flush=True)
        if args.time_limit and time.perf_counter() - start > args.time_limit:
            partial = True
            break
    sweep_seconds = time.perf_counter() - start
    chosen = best_C(curve)
    del x_fit, x_hold
    final = solver.fit(x, y, args.classes, chosen, init=fits[chosen])
    sync(device)
    acc = topk_accuracy(xv, yv, final, ks=(1, 5))
    total_iter = sum(p["n_iter"] for p in curve) + final.n_iter
    return {
        "seconds": round(time.perf_counter() - start, 2),
        "sweep_seconds": round(sweep_seconds, 2),
        "refit_seconds": round(final.seconds, 2),
        "partial": partial,
        "n_C_done": len(curve),
        "best_C": chosen,
        "val_top1": acc[1],
        "val_top5": acc[5],
        "total_iterations": total_iter,
        "iterations_per_C": [p["n_iter"] for p in curve],
        "refit_iterations": final.n_iter,
        "max_iter_hit": sum(p["n_iter"] >= args.max_iter for p in curve),
        "C_curve": curve,
        "final": final,
    }


def float64_check(args, x, y, xv, yv, final) -> dict:
    """The chosen C solved in float64 on the same device, warm-started from the float32 refit: how
    far the float32 optimum is from the float64 one (objective and val top-1)."""
    solver = TorchLBFGS(max_iter=args.f64_max_iter, tol=args.f64_tol, precision="float64")
    f64 = solver.fit(x, y, args.classes, final.C, init=final)
    f32_in_f64 = objective_and_grad(
        x, y, final.weight.double(), final.bias.double(), final.C, need_grad=False
    )[0]
    out = {
        "C": final.C,
        "probe_precision": final.precision,
        "probe_objective": final.loss,
        "probe_weights_objective_in_float64": f32_in_f64,
        "float64_objective": f64.loss,
        "rel_gap": abs(final.loss - f64.loss) / abs(f64.loss),
        "rel_gap_probe_weights": abs(f32_in_f64 - f64.loss) / abs(f64.loss),
        "probe_val_top1": topk_accuracy(xv, yv, final, ks=(1,))[1],
        "float64_val_top1": topk_accuracy(xv, yv, f64, ks=(1,))[1],
        "float64_n_iter": f64.n_iter,
        "float64_seconds": round(f64.seconds, 2),
        "float64_tol": args.f64_tol,
    }
    print(json.dumps(out), flush=True)
    return out


def time_evaluation(x, y, classes, device, mode: str, repeats: int = 5) -> float:
    """Seconds per objective + gradient evaluation at the features' full size."""
    weight = torch.zeros(classes, x.shape[1], device=device)
    bias = torch.zeros(classes, device=device)
    objective_and_grad(x, y, weight, bias, 1.0, mode=mode)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        objective_and_grad(x, y, weight, bias, 1.0, mode=mode)
    sync(device)
    return (time.perf_counter() - start) / repeats


def sklearn_subset(args, x, y, torch_iterations: int) -> dict:
    """sklearn lbfgs on the first `--sklearn-n` rows (float64 host copy of the subset only), fixed
    iterations."""
    n = min(args.sklearn_n, len(y))
    xs, ys = x[:n].float().cpu(), y[:n].cpu()
    solver = SklearnLBFGS(
        max_iter=args.sklearn_iters, tol=1e-30
    )  # never stops early: a fixed iteration count
    Cs = c_grid(-6, 5, args.n_c)[len(c_grid(-6, 5, args.n_c)) // 2 :][: args.sklearn_n_c]
    runs = []
    for C in Cs:
        fit = solver.fit(xs, ys, args.classes, C)
        runs.append(
            {"C": C, "seconds": round(fit.seconds, 3), "n_iter": fit.n_iter, "loss": fit.loss}
        )
    per_iter_row = sum(r["seconds"] for r in runs) / sum(max(r["n_iter"], 1) for r in runs) / n
    extrapolated = per_iter_row * len(y) * torch_iterations
    return {
        "n_rows": n,
        "runs": runs,
        "seconds_per_iteration": round(per_iter_row * n, 4),
        "threads": torch.get_num_threads(),
        "extrapolated_full_seconds": round(extrapolated, 1),
        "extrapolation": "seconds per lbfgs iteration per row on the subset x n_train x the "
        "iterations the "
        "torch sweep + refit took (same algorithm and objective; sklearn cold-starts each C, "
        "so this is a lower bound)",
    }


def solver_agreement(
    device: torch.device,
    seed: int,
    precision: str,
    n: int = 4000,
    dim: int = 128,
    classes: int = 20,
) -> dict:
    """The torch solver on `device` in the sweep's precision vs sklearn (float64, CPU) on a small
    learnable problem: objective values and val top-1 at a few C values."""
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    means = torch.randn(classes, dim, device=device, generator=gen) * 0.15
    x, y = synthetic(n, means, torch.float32, gen)
    xv, yv = synthetic(n // 4, means, torch.float32, gen)
    out = []
    for C in (1e-3, 1e-1, 1.0):
        ours = TorchLBFGS(max_iter=1000, tol=1e-6, precision=precision).fit(x, y, classes, C)
        ref = SklearnLBFGS(max_iter=1000, tol=1e-6).fit(x.cpu(), y.cpu(), classes, C)
        top_ours = topk_accuracy(xv, yv, ours, ks=(1,))[1]
        top_ref = topk_accuracy(xv.cpu().double(), yv.cpu(), ref, ks=(1,))[1]
        out.append(
            {
                "C": C,
                "loss_torch": ours.loss,
                "loss_sklearn": ref.loss,
                "loss_rel_diff": abs(ours.loss - ref.loss) / abs(ref.loss),
                "top1_torch": top_ours,
                "top1_sklearn": top_ref,
                "iters_torch": ours.n_iter,
                "iters_sklearn": ref.n_iter,
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return {
        "n": n,
        "dim": dim,
        "classes": classes,
        "device": device.type,
        "precision": precision,
        "fits": out,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    scale = args.mean_scale
    means = torch.randn(args.classes, args.dim, device=device, generator=gen) * scale
    dtype = DTYPES[args.dtype]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    x, y = synthetic(args.n_train, means, dtype, gen)
    xv, yv = synthetic(args.n_val, means, dtype, gen)
    solver = TorchLBFGS(max_iter=args.max_iter, tol=args.tol, precision=args.precision)
    n_fit = args.n_train - int(args.n_train * 0.1)
    precision = solver.resolve_precision(
        x[:n_fit], args.classes
    )  # the sweep's (the refit's may differ if small)
    flops = 4.0 * n_fit * args.dim * args.classes
    eval_seconds = time_evaluation(x, y, args.classes, device, MATMUL_MODES[precision])
    print(
        f"one {precision} evaluation on {args.n_train} rows: {eval_seconds * 1e3:.1f} ms",
        flush=True,
    )
    result = torch_sweep(args, solver, x, y, xv, yv, device)
    final = result.pop("final")
    record = {
        "gpu": gpu_name(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "n_train": args.n_train,
        "n_val": args.n_val,
        "dim": args.dim,
        "classes": args.classes,
        "n_C": args.n_c,
        "solver": "torch",
        "features_dtype": args.dtype,
        "precision": precision,
        "refit_precision": final.precision,
        "max_iter": args.max_iter,
        "tol": args.tol,
        "mean_scale": scale,
        "seconds": result["seconds"],
        "peak_gpu_gb": (
            round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            if device.type == "cuda"
            else None
        ),
        "evaluation_ms": round(eval_seconds * 1e3, 2),
        "flops_per_evaluation_sweep": flops,
        "gemms_per_evaluation": {"float32_3xtf32": 4 if dtype == torch.bfloat16 else 6}.get(
            precision, 2
        ),
        "prediction": PREDICTION,
        **{k: v for k, v in result.items() if k != "seconds"},
        "torch_version": torch.__version__,
    }
    record["float64_check"] = float64_check(args, x, y, xv, yv, final)
    if args.agreement:
        record["solver_agreement"] = solver_agreement(device, args.seed, precision)
    if args.sklearn_n > 0:
        record["sklearn_subset"] = sklearn_subset(args, x, y, result["total_iterations"])
    if result["partial"]:
        done_iters = result["total_iterations"]
        remaining = args.n_c - result["n_C_done"]
        per_iter = result["sweep_seconds"] / max(done_iters, 1)
        last_iters = result["C_curve"][-1]["n_iter"]
        record["extrapolated_full_sweep_seconds"] = {
            "seconds_per_iteration": round(per_iter, 4),
            "if_remaining_C_take_mean_iterations": round(
                result["seconds"] + remaining * per_iter * done_iters / result["n_C_done"], 1
            ),
            "if_remaining_C_take_the_last_C_iterations": round(
                result["seconds"] + remaining * per_iter * last_iters, 1
            ),
            "if_remaining_C_hit_max_iter": round(
                result["seconds"] + remaining * per_iter * args.max_iter, 1
            ),
        }
    out = args.out or Path("results/bench") / f"probe_{record['gpu']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "C_curve"}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
