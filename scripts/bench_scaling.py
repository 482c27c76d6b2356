"""Weak scaling of DINOv2 training on one host: 1, 2, 4 GPUs, data parallel (DDP over NCCL), in one
command.

    python -m scripts.bench_scaling --gpus 1 2 4                      # writes results/bench/scaling_<gpu>.json/.png
    python -m scripts.bench_scaling --cpu --gpus 1 2 --models small --iters 2 ...   # gloo smoke mode (tests)
    python -m scripts.bench_scaling --compare DENSE.json SPARSE.json --out DIR     # results side by side
    python -m scripts.bench_scaling --gpus 1 2 --models vitl16 --curve-steps 0 --profile 3   # where DDP's time goes

For each N it starts N processes (torch.multiprocessing), which run the trainer's real step
(`Trainer.train_step`: student + teacher forward, backward with DDP's bucketed gradient all-reduce,
per-module clipping, AdamW, EMA) on a synthetic batch of the loader's shapes (each rank its own
pixels and masks), so the data pipeline is out of the timing. Models: the embedded default
(vit_tiny/8, configs/default.yaml) at the recipe's per-GPU batch and at a GPU-sized one, and
ViT-L/16 (configs/vitl16_imagenet.yaml) at 64 per GPU. images/s = N x per-GPU batch / median step
time; efficiency = images/s(N) / (N x images/s(1)).

Loss curves (small model, real data through the real loader, dense phase unless overridden): N GPUs
x b against 1 GPU x N*b for the first --curve-steps steps, same seed: they see the same samples in
the same steps, and differ only by what is per-rank by design (KoLeo's neighbours, iBOT masks,
drop-path draws) and GPU non-determinism. The run-to-run noise band is 1 GPU x N*b with another
seed. Digits need scikit-learn; without it a synthetic image set stands in (the JSON says which).
"""

import argparse
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from configs.command_line import parse_command_line

REPO = Path(__file__).resolve().parents[1]

MODELS = {  # name -> (config, description)
    "small": (
        "configs/default.yaml",
        "embedded default: vit_tiny/8, 32/16 px crops, 1024 prototypes",
    ),
    "vitl16": (
        "configs/vitl16_imagenet.yaml",
        "ViT-L/16, 224/96 px crops (2 + 8), 65536 prototypes",
    ),
}
# Dense phase by default: this measures data parallelism, not the 2:4 kernels (pass
# sparsity.sparse_fraction=1).
BENCH_OVERRIDES = ["data.dataset=digits", "sparsity.sparse_fraction=0", "train.resume=false"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--gpus",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        help="process counts (1 must be among them)",
    )
    ap.add_argument("--models", nargs="+", default=["small", "vitl16"], choices=sorted(MODELS))
    ap.add_argument(
        "--small-batches",
        type=int,
        nargs="+",
        default=[32, 256],
        help="per-GPU batches, small model",
    )
    ap.add_argument("--vitl-batch", type=int, default=64, help="per-GPU batch, ViT-L/16")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--vitl-iters", type=int, default=15)
    ap.add_argument("--curve-steps", type=int, default=100, help="0: no loss curves")
    ap.add_argument(
        "--curve-batch", type=int, default=32, help="per-GPU batch b of the N x b curves"
    )
    ap.add_argument(
        "--curve-workers", type=int, default=8, help="loader workers per process for the curves"
    )
    ap.add_argument(
        "--compiled-curves",
        action="store_true",
        help="compile the curves' steps too (default eager: the same arithmetic without one "
        "compilation "
        "per curve, which dominates a short curve's time)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="profile this many more steps of every timed row on rank 0 (GPU only): kernel time by "
        "category, and the collectives exposed or overlapped with the computation",
    )
    ap.add_argument(
        "--cpu", action="store_true", help="gloo on CPU processes (smoke test of the harness)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "results" / "bench")
    ap.add_argument(
        "--plot-only", type=Path, default=None, help="redraw the PNG of an existing JSON and exit"
    )
    ap.add_argument(
        "--compare",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="put results of this script side by side (the first is the baseline, e.g. the dense "
        "phase "
        "then the sparse one): writes <--out>/scaling_phases_<gpu>.json/.png and exits",
    )
    ap.add_argument(
        "overrides", nargs="*", help="config overrides for every model, e.g. train.amp_dtype=fp16"
    )
    return ap


if __name__ == "__main__":  # --help and a usage error answer here, before torch is imported
    parse_command_line(build_parser())

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from PIL import Image  # noqa: E402

from configs import load_config  # noqa: E402
from scripts.benchmarks.batch import synthetic_batch  # noqa: E402
from scripts.benchmarks.scaling_plots import compare_phases, plot, plot_phases  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    ap = build_parser()
    args = parse_command_line(ap, argv)  # options and overrides in any order
    if 1 not in args.gpus:
        ap.error("--gpus must include 1: efficiencies are relative to one GPU")
    return args


# -------------------------------------------------------------------------------------- worker side
class SyntheticImages:
    """Stand-in image set when scikit-learn (digits) is missing: smooth random RGB images, fixed per
    index."""

    def __init__(self, n: int = 1797, size: int = 48):
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        rng = np.random.default_rng(index)
        coarse = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((self.size, self.size), Image.Resampling.BICUBIC)
        return image, int(index % 10)


def curve_dataset(cfg):
    from data import build_dataset

    try:
        return build_dataset(cfg), "digits"
    except ImportError:
        return SyntheticImages(size=cfg.data.digits_image_size), "synthetic (scikit-learn missing)"


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_steps(ctx, trainer, batch, values, steps: int) -> dict:
    """Kernel time of `steps` more steps on rank 0 (every rank steps, so the collectives complete):
    by category, and the collectives against the computation (`communication`: exposed and
    overlapped ms, compute busy ms)."""
    from scripts.benchmarks.profiling import communication_overlap, kernel_summary
    from scripts.benchmarks.step_profiles import profiled_steps

    prof = profiled_steps(trainer, batch, values, steps, record=ctx.is_main)
    if prof is None:
        return {}
    return {
        **kernel_summary(prof, steps=steps, top=8),
        "communication": communication_overlap(prof, steps=steps),
    }


def time_model(ctx, cfg, warmup: int, iters: int, workdir: Path, profile: int = 0) -> dict:
    from training.trainer import Trainer

    trainer = Trainer(cfg, workdir, ctx)
    trainer.model.train()
    batch = synthetic_batch(
        cfg, ctx.device, ctx.rank, seed=1000 + ctx.rank
    )  # pixels and masks differ per rank
    step = cfg.optim.warmup_epochs * cfg.train.epoch_length  # past warm-up: lr > 0
    values = trainer.schedules.at(step)
    # the phase of that step, as the training loop enters it (a new trainer is dense until told
    # otherwise)
    trainer.enter_phase(trainer.sparsity.phase_at(step))
    phase = {"phase": trainer.sparsity.phase, "sparse_linears": len(trainer.sparsity.converted)}
    for _ in range(warmup):
        trainer.train_step(batch, values)
    _sync(ctx.device)
    if ctx.is_distributed:
        dist.barrier()
    times = []
    # each step ends in a host sync (the trainer's flag all-reduce), so wall time is exact
    for _ in range(iters):
        start = time.perf_counter()
        trainer.train_step(batch, values)
        _sync(ctx.device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(ctx.device) / 2**30 if ctx.device.type == "cuda" else 0.0
    profiled = (
        profile_steps(ctx, trainer, batch, values, profile)
        if profile and ctx.device.type == "cuda"
        else {}
    )
    del trainer, batch
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    median = statistics.median(times)
    row = {
        **phase,
        "step_ms": 1e3 * median,
        "min_ms": 1e3 * min(times),
        "max_ms": 1e3 * max(times),
        "images_per_s": ctx.world_size * cfg.train.batch_size_per_gpu / median,
        "peak_gib": peak,
    }
    return {**row, "profile": profiled} if profiled else row


def loss_curve(ctx, cfg, steps: int, workdir: Path, workers: int) -> tuple[dict, str]:
    """The global-batch loss and its KoLeo term over the first `steps` steps: the trainer's step on
    the real loader's batches."""
    from data import build_ssl_loader
    from training.distributed import mean_over_ranks
    from training.trainer import Trainer

    trainer = Trainer(cfg, workdir, ctx)
    trainer.model.train()
    dataset, data_name = curve_dataset(cfg)
    # Workers as fresh processes, not forks of this one, which has compiled and timed models. On
    # H200 hosts a worker aborted as its loader was closed ("terminate called without an active
    # exception") with fork and with spawn; the loader's close logs that as a warning, since every
    # batch was delivered by then.
    loader = build_ssl_loader(
        cfg,
        rank=ctx.rank,
        world_size=ctx.world_size,
        start_step=0,
        dataset=dataset,
        num_workers=workers,
        multiprocessing_context="spawn",
    )
    batches = iter(loader)
    losses, koleo = [], []
    for step in range(steps):
        trainer.enter_phase(trainer.sparsity.phase_at(step))
        batch = loader.to_device(next(batches), ctx.device)
        loss, terms, _ = trainer.train_step(batch, trainer.schedules.at(step))
        loss, terms = mean_over_ranks(loss, terms, trainer.ctx)
        losses.append(loss.item())
        koleo.append(terms["koleo_loss"].item())
    loader.close()  # stop this curve's workers before the next curve starts its own
    del batches, loader, trainer
    return {"loss": losses, "koleo_loss": koleo}, data_name


def curve_plan(world: int, gpus: list[int], b: int) -> list[tuple[int, int]]:
    """(per-GPU batch, seed) runs for this process count: N x b on N > 1; 1 x N*b (seeds 0 and 1) on
    one."""
    if world > 1:
        return [(b, 0)]
    return [(n * b, seed) for n in sorted(set(gpus)) if n > 1 for seed in (0, 1)]


def worker(rank: int, world: int, port: int, args: argparse.Namespace, result_path: str) -> None:
    from training.distributed import DistContext

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // (2 * world)) if not args.cpu else 1)
    if args.cpu:
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world > 1:
        dist.init_process_group(
            "gloo" if args.cpu else "nccl",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            device_id=None if args.cpu else device,
        )
    ctx = DistContext(rank, world, rank, device)
    out = {"rows": [], "curves": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for model in args.models:
                path = REPO / MODELS[model][0]
                batches = args.small_batches if model == "small" else [args.vitl_batch]
                iters = args.iters if model == "small" else args.vitl_iters
                for b in batches:
                    cfg = load_config(
                        path, [*BENCH_OVERRIDES, f"train.batch_size_per_gpu={b}", *args.overrides]
                    )
                    row = time_model(ctx, cfg, args.warmup, iters, Path(tmp), args.profile)
                    out["rows"].append(
                        {
                            "model": model,
                            "arch": cfg.student.arch,
                            "gpus": world,
                            "per_gpu_batch": b,
                            "global_batch": b * world,
                            **row,
                        }
                    )
                    if ctx.is_main:
                        print(
                            f"[{world} proc] {model} b={b}: {row['step_ms']:.1f} ms/step, "
                            f"{row['images_per_s']:.0f} images/s",
                            flush=True,
                        )
                        if "profile" in row:
                            c = row["profile"]["communication"]
                            print(
                                f"[{world} proc] {model} b={b} kernels per step: compute busy "
                                f"{c['compute_busy_ms']:.1f} ms, collectives "
                                f"{c['communication_ms']:.1f} ms "
                                f"({c['exposed_ms']:.1f} ms with no compute beside them)",
                                flush=True,
                            )
            if args.curve_steps > 0:
                for b, seed in curve_plan(world, args.gpus, args.curve_batch):
                    cfg = load_config(
                        REPO / MODELS["small"][0],
                        [
                            *BENCH_OVERRIDES,
                            f"train.batch_size_per_gpu={b}",
                            f"train.seed={seed}",
                            *([] if args.compiled_curves else ["train.compile=false"]),
                            *args.overrides,
                        ],
                    )
                    losses, data_name = loss_curve(
                        ctx, cfg, args.curve_steps, Path(tmp), args.curve_workers
                    )
                    out["curves"].append(
                        {
                            "gpus": world,
                            "per_gpu_batch": b,
                            "global_batch": b * world,
                            "seed": seed,
                            "data": data_name,
                            **losses,
                        }
                    )
                    if ctx.is_main:
                        print(
                            f"[{world} proc] curve {world}x{b} seed {seed}: loss "
                            f"{losses['loss'][0]:.4f} -> "
                            f"{losses['loss'][-1]:.4f}",
                            flush=True,
                        )
        if ctx.is_main:
            Path(result_path).write_text(json.dumps(out))
    finally:
        if world > 1:
            dist.barrier()
            dist.destroy_process_group()


# -------------------------------------------------------------------------------------- parent side
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'cpu' -> 'cpu'."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", name)
    return (m.group(1) if m else re.sub(r"[^A-Za-z0-9]+", "_", name)).lower()


def compare_curves(curves: list[dict], gpus: list[int], b: int) -> list[dict]:
    """|loss(N x b) - loss(1 x N*b)| next to the seed band |loss(1 x N*b, seed 0) - loss(1 x N*b,
    seed 1)|, for the total loss and for the loss without KoLeo (KoLeo's nearest neighbours are
    searched within each GPU's batch, as in the reference, so that term depends on b by design, not
    by noise)."""

    def find(world, batch, seed, without_koleo):
        c = next(
            (
                c
                for c in curves
                if (c["gpus"], c["per_gpu_batch"], c["seed"]) == (world, batch, seed)
            ),
            None,
        )
        if c is None:
            return None
        return np.array(c["loss"]) - (np.array(c["koleo_loss"]) if without_koleo else 0.0)

    result = []
    for n in sorted(set(gpus) - {1}):
        for without_koleo in (False, True):
            multi, single = find(n, b, 0, without_koleo), find(1, n * b, 0, without_koleo)
            other_seed = find(1, n * b, 1, without_koleo)
            if multi is None or single is None or other_seed is None:
                continue
            diff, band = np.abs(multi - single), np.abs(other_seed - single)
            result.append(
                {
                    "gpus": n,
                    "per_gpu_batch": b,
                    "vs": f"1 x {n * b}",
                    "quantity": "loss - koleo_loss" if without_koleo else "loss",
                    "max_abs_diff": float(diff.max()),
                    "mean_abs_diff": float(diff.mean()),
                    "seed_band_max_abs_diff": float(band.max()),
                    "seed_band_mean_abs_diff": float(band.mean()),
                    "within_seed_band": bool(diff.mean() <= band.mean()),
                }
            )
    return result


def summarise(rows, curves, counts, gpu_name, available, skipped, args, started) -> dict:
    base = {(r["model"], r["per_gpu_batch"]): r["images_per_s"] for r in rows if r["gpus"] == 1}
    for r in rows:
        r["efficiency"] = r["images_per_s"] / (r["gpus"] * base[(r["model"], r["per_gpu_batch"])])
    return {
        "gpu": gpu_name,
        "torch": torch.__version__,
        "host_gpus": available,
        "skipped_gpu_counts": skipped,
        "model": "; ".join(f"{m}: {MODELS[m][1]}" for m in args.models),
        "configs": {m: MODELS[m][0] for m in args.models},
        "overrides": BENCH_OVERRIDES + args.overrides,
        "method": "median step of DDP data parallel Trainer.train_step on a synthetic batch per "
        "rank "
        f"({args.warmup} warm-up steps, {args.iters} timed, {args.vitl_iters} for vitl16); bf16 "
        f"autocast "
        "on GPU; efficiency = images/s(N) / (N x images/s(1))",
        "rows": rows,
        "loss_curves": {
            "steps": args.curve_steps,
            "runs": curves,
            "compiled": args.compiled_curves,
            "comparisons": compare_curves(curves, counts, args.curve_batch),
        },
        "wall_s": round(time.time() - started, 1),
    }


def compare(paths: list[Path], out_dir: Path) -> None:
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        sys.exit(f"--compare: no such result file: {', '.join(missing)}")
    try:
        summary = compare_phases([json.loads(p.read_text()) for p in paths])
    except (
        KeyError,
        TypeError,
        json.JSONDecodeError,
    ) as e:  # JSONDecodeError first: it is a ValueError too
        sys.exit(f"--compare: {e!r} (expected JSON files written by this script)")
    except ValueError as e:
        sys.exit(f"--compare: {e}")
    summary["sources"] = [str(p) for p in paths]  # as given on the command line
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"scaling_phases_{gpu_slug(summary['gpu'])}.json"
    out.write_text(json.dumps(summary, indent=1))
    w = 2 + max(
        len(label) for label in summary["phases"]
    )  # a label: the phase and the settings that differ
    print(
        f"{'phase':{w}s}{'model':8s}{'b/GPU':>7s}{'GPUs':>6s}{'ms/step':>10s}{'images/s':>10s}{'eff.':>8s}"
        f"   vs {summary['baseline']}"
    )
    for r in summary["rows"]:
        print(
            f"{r['phase']:{w}s}{r['model']:8s}{r['per_gpu_batch']:7d}{r['gpus']:6d}{r['step_ms']:10.1f}"
            f"{r['images_per_s']:10.0f}{100 * r['efficiency']:7.1f}%{r['speedup_vs_first']:8.3f}x"
        )
    print(f"wrote {out}")
    plot_phases(summary, out.with_suffix(".png"))


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.plot_only:
        plot(json.loads(args.plot_only.read_text()), args.plot_only.with_suffix(".png"))
        return
    if args.compare:
        compare(args.compare, args.out)
        return
    if args.cpu:
        gpu_name, available = "cpu", max(args.gpus)
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA GPU: run with --cpu for the gloo smoke mode")
        gpu_name, available = torch.cuda.get_device_name(0), torch.cuda.device_count()
        for var in (
            "NCCL_NVLS_ENABLE",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST",
        ):  # keep NVLink multicast off
            os.environ.setdefault(var, "0" if var == "NCCL_NVLS_ENABLE" else "1")
    skipped = [n for n in args.gpus if n > available]
    counts = [n for n in sorted(set(args.gpus)) if n <= available]
    rows, curves, started = [], [], time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"scaling_{gpu_slug(gpu_name)}.json"
    with tempfile.TemporaryDirectory() as tmp:
        for i, n in enumerate(counts):
            path = os.path.join(tmp, f"result_{n}.json")
            mp.spawn(worker, args=(n, free_port(), args, path), nprocs=n, join=True)
            part = json.loads(Path(path).read_text())
            rows += part["rows"]
            curves += part["curves"]
            # Written after every process count, so a run cut by a time limit keeps what it
            # measured.
            result = summarise(
                rows, curves, counts[: i + 1], gpu_name, available, skipped, args, started
            )
            result["partial"] = i + 1 < len(counts)
            out.write_text(json.dumps(result, indent=1))
    print(f"\n{gpu_name} x{available}: weak scaling ({result['wall_s']} s)")
    print(f"{'model':8s}{'b/GPU':>7s}{'GPUs':>6s}{'ms/step':>10s}{'images/s':>11s}{'eff.':>8s}")
    for r in rows:
        print(
            f"{r['model']:8s}{r['per_gpu_batch']:7d}{r['gpus']:6d}{r['step_ms']:10.1f}{r['images_per_s']:11.0f}"
            f"{100 * r['efficiency']:7.1f}%"
        )
    for c in result["loss_curves"]["comparisons"]:
        print(
            f"{c['quantity']:17s} {c['gpus']} x {c['per_gpu_batch']} vs {c['vs']}: mean |diff| "
            f"{c['mean_abs_diff']:.4f} "
            f"(max {c['max_abs_diff']:.4f}); seed band mean {c['seed_band_mean_abs_diff']:.4f} "
            f"(max {c['seed_band_max_abs_diff']:.4f})"
        )
    if skipped:
        print(f"skipped {skipped}: only {available} GPUs")
    print(f"wrote {out}")
    plot(result, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
