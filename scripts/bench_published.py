"""The published 2:4 benchmark, side by side: a plain ViT-L/16 training pass, dense against MLP
linears 2:4.

    python -m scripts.bench_published --out results/bench/published_h200.json

The result this repository reproduces reports 6% end to end on one A100 for this pass (forward +
backward, batch 8, fp16, torch.compile, the MLP linears 2:4-sparse: 717.6 against 675.3 ms, 1.063x).
Here the same pass on this GPU: timm's `vit_large_patch16_224` in fp16 (weights and inputs),
compiled, `blocks.*.mlp.fc1/fc2` turned into `SemiSparseLinear` (backend `--backend`, pruned every
forward), loss = the logits' sum, no optimizer. The two models share their initial weights; after
every row's compile and `--heat-s` of steps, the rows take turns `--rounds` times (`--iters`
CUDA-event-timed steps each), as `bench_train_step.py` does. `--batch` takes several sizes: 8 is the
published one; larger batches give the GEMMs the token counts training has.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--arch", default="vit_large_patch16_224")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--backend", default="cusparselt", choices=("cusparselt", "auto", "dense"))
    ap.add_argument(
        "--compile-mode",
        default="default",
        choices=("default", "reduce-overhead"),
        help="torch.compile's mode; reduce-overhead replays forward and backward as CUDA graphs (a "
        "batch "
        "of 8 is host-bound when launched)",
    )
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--heat-s", type=float, default=20.0)
    ap.add_argument("--out", default=None)
    return ap


if __name__ == "__main__":  # --help and a usage error answer here, before torch is imported
    build_parser().parse_args()

import torch  # noqa: E402

from scripts.benchmarks.gpu_state import gpu_state  # noqa: E402
from scripts.benchmarks.timing import heat  # noqa: E402

PUBLISHED = {
    "gpu": "A100",
    "batch": 8,
    "dense_ms": 717.598748,
    "sparse_ms": 675.275311,
}  # the seed's table
MLP_LINEARS = r"blocks\.\d+\.mlp\.fc[12]"


def build_models(arch: str, backend: str, device, dtype) -> dict:
    """{"dense": model, "2:4": a copy with its MLP linears 2:4 on `backend`}, same weights, train
    mode."""
    import timm

    from sparsity import swap_linear_modules

    torch.manual_seed(0)
    dense = timm.create_model(arch, pretrained=False).to(device=device, dtype=dtype).train()
    sparse = copy.deepcopy(dense)
    swap_linear_modules(
        sparse, pattern=MLP_LINEARS, backend=backend
    )  # refuses a pattern matching nothing
    return {"dense": dense, "2:4": sparse}


def training_pass(model, x):
    """Forward and backward of one batch (the published pass: no optimizer step); gradients fresh
    each pass."""
    # reduce-overhead: the last pass's graph outputs may be overwritten
    torch.compiler.cudagraph_mark_step_begin()
    model.zero_grad(set_to_none=True)
    model(x).float().sum().backward()


def time_rows(steps: dict, iters: int, rounds: int) -> dict:
    """The rows take turns `rounds` times, `iters` CUDA-event-timed calls each: every call's ms per
    row."""
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(iters)
            ]
            for start, end in events:
                start.record()
                step()
                end.record()
            torch.cuda.synchronize()
            times[name] += [s.elapsed_time(e) for s, e in events]
    return times


def summary(times: dict, batch: int) -> dict:
    """Median, min, max per row and the 2:4 row's speed-up against dense."""
    rows = {
        name: {
            "ms": statistics.median(t),
            "min_ms": min(t),
            "max_ms": max(t),
            "times_ms": [round(v, 3) for v in t],
        }
        for name, t in times.items()
    }
    return {
        "batch": batch,
        "rows": rows,
        "speedup": round(rows["dense"]["ms"] / rows["2:4"]["ms"], 4),
    }


def main() -> None:
    ap = build_parser()
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_published.py needs a CUDA GPU")
    if min(args.batch) < 1 or args.rounds < 1 or args.iters < 1:
        ap.error("--batch, --rounds and --iters must be at least 1")
    device = torch.device("cuda")
    models = {
        name: torch.compile(m, mode=args.compile_mode)
        for name, m in build_models(args.arch, args.backend, device, torch.float16).items()
    }
    results = []
    for batch in args.batch:
        x = torch.randn(batch, 3, 224, 224, device=device, dtype=torch.float16)
        steps = {name: (lambda m=m: training_pass(m, x)) for name, m in models.items()}
        for step in steps.values():  # compiles (each batch size its own graphs)
            for _ in range(args.warmup):
                step()
        heat(steps["dense"], args.heat_s)
        out = summary(time_rows(steps, args.iters, args.rounds), batch)
        out["gpu_state"] = gpu_state()
        results.append(out)
        print(
            f"batch {batch}: dense {out['rows']['dense']['ms']:.2f} ms, 2:4 "
            f"{out['rows']['2:4']['ms']:.2f} ms, "
            f"{out['speedup']:.3f}x",
            flush=True,
        )
    published = dict(PUBLISHED, speedup=round(PUBLISHED["dense_ms"] / PUBLISHED["sparse_ms"], 4))
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "arch": args.arch,
        "backend": args.backend,
        "compile_mode": args.compile_mode,
        "dtype": "fp16",
        "pass": "forward + backward, no optimizer",
        "rounds": args.rounds,
        "iters": args.iters,
        "results": results,
        "published": published,
    }
    print(
        f"published ({published['gpu']}, batch {published['batch']}): {published['speedup']:.3f}x"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
