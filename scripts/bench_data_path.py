"""Does the data path keep up with the GPU step? The loader alone against the training step alone,
one process.

    python -m scripts.bench_data_path --config configs/cifar10.yaml data.root=/data/cifar10 \
        --out results/cifar10/bench/data_path_vit_tiny.json

Rows: `loader-workers` (the per-image PIL augmentation in `--workers` data workers, the reference
path), `loader-device` (the in-memory images augmented per batch on the GPU: `data.in_memory=true
data.augment_on=device`), `augmentation-device` and `augmentation-device-compiled` (that augmentation
alone, eager and as one compiled graph, `data.augment_compile=true`, with the ratio of their GPU
times), each timed as batches/s delivered to the GPU including the host-to-device
copy (and the device augmentation); `step-dense` and `step-sparse` (`Trainer.train_step` on one real
batch reused: forward, backward, AdamW, EMA, under the config's compile setting; the sparse row with
`sparsity.backend` as configured). Images/s are per training image (2 global + n local crops each).
The data path keeps up when its images/s exceed the step's.

Prediction (written before measuring, H100, ViT-S/4, batch 512, 2 x 32 px + 8 x 16 px crops): the
PIL pipeline costs ~4 ms of CPU per image (measured 8.6 ms on a slower core here), so 14 workers
give ~3.5k images/s; the step is ~37 GFLOP per image (student fwd+bwd on 232 tokens, teacher fwd on
130, ViT-S 22M params) at an effective ~150 TFLOP/s for 65-token sequences: ~4k images/s. The device
augmentation: ~20 small batched ops per crop type, ~10-20 ms per 512 images: ~30k images/s. So the
workers path would bound the step at < 1x, the device path not. Measured (results/cifar10/bench,
NOTES.md): step 4,658 images/s, workers 2,207 (0.47x), device path 27,028 (5.8x), the augmentation
alone 16.2 ms of GPU per 512 images.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from configs.command_line import parse_command_line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--workers", type=int, default=14, help="data workers of the loader-workers row"
    )
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("overrides", nargs="*")
    return ap


if __name__ == "__main__":  # --help and a usage error answer here, before torch is imported
    parse_command_line(build_parser())

import torch  # noqa: E402

from configs import load_config  # noqa: E402
from data import build_ssl_loader, build_training_dataset  # noqa: E402
from scripts.benchmarks.timing import time_steps  # noqa: E402
from training.distributed import DistContext  # noqa: E402
from training.trainer import Trainer  # noqa: E402


def time_loader(
    cfg, device, batches: int, warmup: int, num_workers: int, to_device: bool = True
) -> dict:
    """Sustained rate: timed from the first batch after warm-up over `batches` batches, many more
    than the workers prefetch (2 per worker), so what was queued during start-up does not count as
    speed."""
    dataset = build_training_dataset(cfg)
    loader = build_ssl_loader(
        cfg, rank=0, world_size=1, start_step=0, dataset=dataset, num_workers=num_workers
    )
    it = iter(loader)
    fetch = (lambda: loader.to_device(next(it), device)) if to_device else (lambda: next(it))
    for _ in range(warmup):
        fetch()
    torch.cuda.synchronize()
    batches = max(batches, 8 * max(num_workers, 1))
    start = time.perf_counter()
    for _ in range(batches):
        batch = fetch()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    loader.close()
    images = batches * cfg.train.batch_size_per_gpu
    return {
        "images_per_s": round(images / seconds, 1),
        "ms_per_batch": round(1e3 * seconds / batches, 2),
        "num_workers": num_workers,
        "batch": batch,
    }


def time_augmentation(cfg, device, batch_images: torch.Tensor, iters: int) -> dict:
    """The device augmentation alone on a resident uint8 batch: GPU time (CUDA events) and host time
    per batch."""
    from data.loader import build_batched_augmentation

    aug = build_batched_augmentation(cfg)
    g = torch.Generator(device=device).manual_seed(0)
    for _ in range(3):
        aug(batch_images, g)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(iters):
        aug(batch_images, g)
    end.record()
    host = time.perf_counter() - host
    torch.cuda.synchronize()
    return {
        "gpu_ms_per_batch": round(start.elapsed_time(end) / iters, 2),
        "host_ms_per_batch": round(1e3 * host / iters, 2),
        "images_per_s": round(batch_images.shape[0] * iters * 1e3 / start.elapsed_time(end), 1),
    }


def time_step(cfg, device, batch: dict, warmup: int, iters: int, out_dir: Path) -> dict:
    trainer = Trainer(
        cfg, out_dir, DistContext(rank=0, world_size=1, local_rank=0, device=device), dataset=[0]
    )
    trainer.enter_phase(trainer.sparsity.phase_at(0))
    ms = statistics.median(time_steps(trainer, batch, warmup, iters, step=cfg.total_steps // 2))
    return {
        "images_per_s": round(cfg.train.batch_size_per_gpu * 1e3 / ms, 1),
        "ms_per_step": round(ms, 2),
        "phase": trainer.sparsity.phase,
        **trainer.sparsity.auto_summary(),
    }


def main() -> None:
    ap = build_parser()
    args = parse_command_line(ap)  # options and overrides in any order
    device = torch.device("cuda")
    base = list(args.overrides)
    result = {
        "device_name": torch.cuda.get_device_name(),
        "config": str(args.config),
        "overrides": base,
        "cpu_count": len(__import__("os").sched_getaffinity(0)),
    }
    cfg_workers = load_config(
        args.config, base + ["data.in_memory=false", "data.augment_on=workers"]
    )
    on_device = ["data.in_memory=true", "data.augment_on=device"]
    cfg_device = load_config(args.config, base + on_device)
    rows = {}
    rows["loader-device"] = time_loader(
        cfg_device, device, args.batches, 5, cfg_device.train.num_workers
    )
    batch = rows["loader-device"].pop("batch")
    images = torch.randint(
        0, 256, (cfg_device.train.batch_size_per_gpu, 3, 32, 32), dtype=torch.uint8, device=device
    )
    rows["augmentation-device"] = time_augmentation(cfg_device, device, images, args.iters)
    # the same draws through one compiled graph (`data.augment_compile=true`): the first call
    # compiles, inside the warm-up
    rows["augmentation-device-compiled"] = time_augmentation(
        load_config(args.config, base + on_device + ["data.augment_compile=true"]),
        device,
        images,
        args.iters,
    )
    rows["augmentation-device-compiled"]["vs_eager_gpu_ms"] = round(
        rows["augmentation-device"]["gpu_ms_per_batch"]
        / rows["augmentation-device-compiled"]["gpu_ms_per_batch"],
        3,
    )
    # the workers' part alone (index the array, stack, draw the iBOT masks): no copy, no
    # augmentation
    rows["loader-device-no-aug"] = time_loader(
        cfg_device, device, args.batches, 5, cfg_device.train.num_workers, to_device=False
    )
    rows["loader-device-no-aug"].pop("batch")
    rows["loader-workers"] = time_loader(cfg_workers, device, args.batches, 3, args.workers)
    rows["loader-workers"].pop("batch")
    out_dir = Path("/tmp/bench_data_path")
    rows["step-dense"] = time_step(
        load_config(args.config, base + ["sparsity.sparse_fraction=0"]),
        device,
        batch,
        8,
        args.iters,
        out_dir,
    )
    rows["step-sparse"] = time_step(
        load_config(args.config, base + ["sparsity.sparse_fraction=1"]),
        device,
        batch,
        8,
        args.iters,
        out_dir,
    )
    step = rows["step-dense"]["images_per_s"]
    for name in (
        "loader-device",
        "augmentation-device",
        "augmentation-device-compiled",
        "loader-device-no-aug",
        "loader-workers",
        "step-sparse",
    ):
        rows[name]["vs_dense_step"] = round(rows[name]["images_per_s"] / step, 3)
    result["rows"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, row in rows.items():
        print(
            f"{name:15s} {row['images_per_s']:>9.0f} images/s  "
            f"{row.get('vs_dense_step', 1.0):.3f}x dense step"
        )


if __name__ == "__main__":
    main()
