"""Fake run directories with the layout train.py writes (config.yaml, metrics.jsonl, log.txt,
checkpoints, teacher_backbone.pth, eval_linear.json), built in milliseconds for the table and
reproduce tests."""

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from configs import DEFAULT_CONFIG, load_config, to_yaml

REPO = Path(__file__).resolve().parents[2]
VITL_CONFIG = REPO / "configs" / "vitl16_imagenet.yaml"
LOG_TIME = "2026-11-22 12:00:00,000"


def eval_result(top1: float, knn20: float | None = None) -> dict:
    knn20 = top1 - 2.0 if knn20 is None else knn20
    return {
        "top1": top1,
        "top5": min(top1 + 5.0, 100.0),
        "best_C": 0.1,
        "C_curve": [{"C": 0.1, "holdout_top1": top1}],
        "feature_dim": 192,
        "solver": "sklearn",
        "seconds": 12.5,
        "n_train": 1437,
        "n_val": 360,
        "knn": {
            str(k): {"top1": knn20 + d, "top5": 99.0}
            for k, d in ((10, 0.5), (20, 0.0), (100, -1.0), (200, -2.0))
        },
        "extra_key": [1, 2],
    }


def make_run(
    root: Path,
    name: str,
    fraction: float,
    *,
    steps_done: int | None = None,
    finished: bool = True,
    result="default",
    log_tail: str | None = None,
    vitl: bool = False,
    log_period: int = 5,
    sparse_images_per_s: float = 64.0,
    dense_images_per_s: float = 32.0,
    world_size: int | None = None,
    top1: float = 90.0,
    knn20: float | None = None,
    seed: int = 0,
    baselines: dict | None = None,
    overrides: Sequence[str] = (),
    device: str = "cuda:0",
    gpu: str = "NVIDIA H200",
    gpu_mem_outside_mb: float | None = 900.0,
    data_fingerprint: str = "",
) -> Path:
    """A run of the embedded default (300 steps, batch 32) or of the ViT-L recipe (125k steps, batch
    64).

    Throughput is constant per phase, so a phase's time is exact: steps * batch / images_per_s.
    `result`: "default" -> an eval_linear.json with `top1` (and `knn20`); None -> no eval; a str
    other than "default" -> written as the file's raw text; a dict -> written as JSON. `log_tail`: a
    last log line (e.g. an ERROR). `baselines`: {file name: result dict}, e.g.
    {"eval_linear_pixels.json": eval_result(40.0)}. `overrides`: more config key=value, e.g.
    ["student.arch=vit_small"]. `device`, `gpu`: run_info.json's device and device name;
    `gpu_mem_outside_mb`: logged at every metrics line (None: not logged, as by older runs); the
    defaults are a run alone on one H200. `data_fingerprint`: run_info.json's ("" as older runs: not
    recorded)."""
    run = Path(root) / name
    run.mkdir(parents=True)
    overrides = [f"sparsity.sparse_fraction={fraction}", f"train.seed={seed}", *overrides]
    if vitl:
        cfg = load_config(VITL_CONFIG, ["data.root=/datasets/imagenet", *overrides])
    else:
        cfg = load_config(DEFAULT_CONFIG, overrides)
    (run / "config.yaml").write_text(to_yaml(cfg))
    total, sparse = cfg.total_steps, cfg.sparse_steps
    steps_done = total if steps_done is None else steps_done
    lines = []
    for end in range(log_period, steps_done + 1, log_period):
        phase = "sparse" if cfg.dense_warmup_steps <= end - 1 < sparse else "dense"
        rate = sparse_images_per_s if phase == "sparse" else dense_images_per_s
        loss = 11.0 - 3.0 * end / total
        lines.append(
            json.dumps(
                {
                    "step": end - 1,
                    "phase": phase,
                    "loss": loss,
                    "dino_local_crops_loss": 0.6 * loss,
                    "dino_global_crops_loss": 0.2 * loss,
                    "koleo_loss": -0.01 * end / total,
                    "ibot_loss": 0.2 * loss,
                    "lr": 1e-3,
                    "images_per_s": rate,
                    **(
                        {"gpu_mem_outside_mb": gpu_mem_outside_mb}
                        if gpu_mem_outside_mb is not None
                        else {}
                    ),
                }
            )
        )
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    (run / "run_info.json").write_text(
        json.dumps(
            {
                "device": device,
                "device_name": gpu if device != "cpu" else "",
                "data_fingerprint": data_fingerprint,
            }
        )
    )
    log = [f"{LOG_TIME} INFO sparsity.converter: step 0: 24 linears now 2:4-sparse"]
    if log_tail:
        log.append(f"{LOG_TIME} {log_tail}")
    (run / "log.txt").write_text("\n".join(log) + "\n")
    if world_size is not None:
        (run / "checkpoints").mkdir()
        state = {
            "step": steps_done,
            "world_size": world_size,
            "batch_size_per_gpu": cfg.train.batch_size_per_gpu,
        }
        torch.save(state, run / "checkpoints" / f"step_{max(steps_done - 1, 0):08d}.pt")
    if finished and steps_done >= total:
        (run / "teacher_backbone.pth").write_bytes(b"weights")
    for file_name, record in (baselines or {}).items():
        (run / file_name).write_text(json.dumps(record))
    if result == "default":
        result = eval_result(top1, knn20)
    if isinstance(result, dict):
        (run / "eval_linear.json").write_text(json.dumps(result))
    elif isinstance(result, str):
        (run / "eval_linear.json").write_text(result)
    return run
