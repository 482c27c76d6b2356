"""Time whole DINOv2 training steps, sparse phase vs dense phase, on one GPU, in the same run.

    python scripts/bench_train_step.py --config configs/vitl16_imagenet.yaml --backends cusparselt auto

One synthetic multi-crop batch (the real collate's shapes and masks, random pixels) is reused, so the data
pipeline is out of the measurement: forward (student + teacher) + backward + clipping + AdamW + EMA, bf16 autocast
over fp32 master weights, exactly `Trainer._train_step`. Medians of CUDA-event timings after warm-up; the dense
phase is measured in the same process and is the baseline of every ratio. JSON to --out, a table printed last.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs import load_config  # noqa: E402

from data.collate import SSLCollate, SSLSample  # noqa: E402
from models.training.distributed import DistContext  # noqa: E402
from models.training.trainer import Trainer  # noqa: E402


def synthetic_batch(cfg, device) -> dict:
    """A batch shaped exactly like the loader's: real masks from the collate, random pixels."""
    gen = torch.Generator().manual_seed(0)
    g, l, n = cfg.crops.global_crops_size, cfg.crops.local_crops_size, cfg.crops.local_crops_number
    samples = [SSLSample(global_crops=[torch.randn(3, g, g, generator=gen) for _ in range(2)],
                         local_crops=[torch.randn(3, l, l, generator=gen) for _ in range(n)],
                         label=0, position=i, corrupt_skipped=0) for i in range(cfg.train.batch_size_per_gpu)]
    collate = SSLCollate(patches_per_side=g // cfg.student.patch_size, local_crops_size=l,
                         mask_ratio_min_max=tuple(cfg.ibot.mask_ratio_min_max),
                         mask_sample_probability=cfg.ibot.mask_sample_probability, seed=0, rank=0)
    batch = collate(samples)
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def time_steps(trainer: Trainer, batch: dict, warmup: int, iters: int) -> list[float]:
    values = trainer.schedules.at(20_000)  # a mid-training point: last layer unfrozen, lr > 0
    for _ in range(warmup):
        trainer._train_step(batch, values)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        trainer._train_step(batch, values)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def sparse_decisions(backends) -> dict:
    """What the sparse backends saw and chose: auto's per-shape decisions, cuSPARSELt's plans (token counts)."""
    from sparsity.backends import get_backend

    out = {}
    for name in backends:
        try:
            out[name] = get_backend(name).describe()
        except Exception as e:  # noqa: BLE001
            out[name] = repr(e)
    return out


def profile_steps(trainer: Trainer, batch: dict, steps: int) -> dict:
    """Kernel time by category and GPU idle time per step (CUDA activity only, so host timing is barely
    disturbed), for `steps` steps after the timed ones."""
    from torch.profiler import ProfilerActivity, profile

    from sparsity.profiling import kernel_summary

    values = trainer.schedules.at(20_000)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer._train_step(batch, values)
        torch.cuda.synchronize()
    return kernel_summary(prof, steps=steps, top=15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/vitl16_imagenet.yaml")
    ap.add_argument("--backends", nargs="*", default=["cusparselt", "auto"])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", type=int, default=2, help="steps per phase profiled for the kernel breakdown (0: off)")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. train.batch_size_per_gpu=32")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_train_step.py needs a CUDA GPU")
    device = torch.device("cuda")
    cfg = load_config(args.config, ["data.dataset=digits", *args.overrides])
    trainer = Trainer(cfg, Path("/tmp/bench_train_step"), DistContext(0, 1, 0, device))
    trainer.model.train()
    batch = synthetic_batch(cfg, device)
    backbone = trainer.model.student.backbone
    rows = []
    for phase, backend in [("dense", None), *[("sparse", b) for b in args.backends]]:
        trainer.sparse_schedule.cfg.backend = backend or "dense"
        trainer.sparse_schedule.set_phase(backbone, phase, step=0)
        torch.cuda.reset_peak_memory_stats()
        times = time_steps(trainer, batch, args.warmup, args.iters)
        row = {"phase": phase, "backend": backend or "-", "ms": statistics.median(times),
               "min_ms": min(times), "max_ms": max(times), "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
        if phase == "sparse":
            row["sparse_modules"] = len(trainer.sparse_schedule.swapped)
        if args.profile:
            row["profile"] = profile_steps(trainer, batch, args.profile)
        rows.append(row)
        trainer.sparse_schedule.set_phase(backbone, "dense", step=0)
    dense_ms = rows[0]["ms"]
    for r in rows:
        r["speedup"] = dense_ms / r["ms"]
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "config": args.config,
              "overrides": args.overrides, "images_per_step": cfg.train.batch_size_per_gpu, "rows": rows,
              "sparse_decisions": sparse_decisions(args.backends)}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\n{result['gpu']}, {args.config} {' '.join(args.overrides)}, batch {cfg.train.batch_size_per_gpu}/GPU")
    print(f"{'phase':8s}{'backend':12s}{'ms/step':>10s}{'min':>8s}{'max':>8s}{'GiB':>7s}{'vs dense':>10s}")
    for r in rows:
        print(f"{r['phase']:8s}{r['backend']:12s}{r['ms']:10.1f}{r['min_ms']:8.1f}{r['max_ms']:8.1f}"
              f"{r['peak_gib']:7.1f}{r['speedup']:9.3f}x")
    for r in rows:
        if "profile" in r:
            p = r["profile"]
            print(f"{r['phase']}/{r['backend']}: span {p['span_ms']} ms, busy {p['busy_ms']}, idle {p['idle_ms']}, "
                  f"{p['kernels_per_step']} kernels; by category (ms/step) {p['by_category_ms']}")


if __name__ == "__main__":
    main()
