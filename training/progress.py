"""What a person watching a run reads (rank 0 only): a start-up summary, a plain line every
`train.log_period` steps (step, each loss term, lr, images/s, memory, ETA, as dinov2's MetricLogger
prints them) through the `logging` handlers (so into `log.txt` and the console), a tqdm bar only
when stderr is a terminal (in a Slurm `.err` file a bar redrawn with carriage returns is one endless
line), and TensorBoard event files beside `metrics.jsonl` when the optional `tensorboard` package is
installed (`pip install -e '.[tensorboard]'`; without it this is said once).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

try:
    import resource  # POSIX: the process's peak resident memory, for CPU runs
except ImportError:  # pragma: no cover - Windows
    resource = None

from configs import Config, scaled_lr

from .terminal import on_terminal

logger = logging.getLogger("train")

_NOT_SCALARS = ("step", "format", "phase")


def max_memory_mb(device: torch.device) -> float | None:
    """Peak memory so far: allocated on the GPU, or the process's peak resident set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if resource is None:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _millions(n: int) -> str:
    return f"{n / 1e6:.2f}M"


def run_info(
    cfg: Config,
    model: torch.nn.Module,
    device: torch.device,
    world_size: int,
    amp_dtype: torch.dtype,
    compiled: bool,
    start_step: int,
    last_step: int,
    data_fingerprint: str = "",
    data: dict | None = None,
) -> dict:
    """The settings a run actually uses, including those resolved at start-up (device, dtypes,
    compilation, scaled lr, the training images: their fingerprint and `data`,
    `data.dataset_summary`'s kind, image and class counts): logged at start, written to
    `run_info.json`."""
    student_params = list(model.student.parameters())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    s = cfg.sparsity
    return {
        "device": str(device),
        "device_name": device_name,
        "world_size": world_size,
        "batch_size_per_gpu": cfg.train.batch_size_per_gpu,
        "global_batch": cfg.train.batch_size_per_gpu * world_size,
        "peak_lr": scaled_lr(cfg, world_size),
        "base_lr": cfg.optim.base_lr,
        "scaling_rule": cfg.optim.scaling_rule,
        "student_params": sum(p.numel() for p in student_params),
        "trainable_params": sum(p.numel() for p in student_params if p.requires_grad),
        "backbone_params": sum(p.numel() for p in model.student.backbone.parameters()),
        "teacher_params": sum(p.numel() for p in model.teacher.parameters()),
        "param_dtype": ",".join(sorted({_dtype(p.dtype) for p in model.parameters()})),
        "amp_dtype": _dtype(amp_dtype),
        "amp_dtype_configured": cfg.train.amp_dtype,
        "grad_scaler": amp_dtype == torch.float16,
        # the dtype the backbone's residual stream computes in (training/numerics.py): amp_dtype
        # only with autocast on
        "residual_dtype": _dtype(amp_dtype if cfg.train.residual_dtype == "amp" else torch.float32),
        "residual_dtype_configured": cfg.train.residual_dtype,
        "compile": f"on ({cfg.train.compile_backend}, {cfg.train.compile_mode})"
        if compiled
        else "off",
        "total_steps": cfg.total_steps,
        "last_step": last_step,
        "sparse_steps": cfg.sparse_steps,
        "dense_warmup_steps": cfg.dense_warmup_steps,
        "sparse_fraction": s.sparse_fraction,
        "sparsity_kind": s.kind,
        "sparsity_backend": s.backend,
        "pruning": s.pruning,
        "sparse_teacher": s.teacher == "sparse",
        "augment_on": cfg.data.augment_on,
        "augment_compile": cfg.data.augment_compile,
        "start_step": start_step,
        "data_fingerprint": data_fingerprint,
        **(data or {}),
        "torch": torch.__version__,
    }


def data_line(info: dict, root: str = "") -> str:
    """`image_folder at /data/mine: 1,234 images, unlabelled`; '' where run_info has no data
    summary."""
    if "images" not in info:
        return ""
    where = f" at {root}" if root and info.get("dataset") != "digits" else ""
    classes = f"{info['classes']:,} classes" if info.get("classes") else "unlabelled"
    return f"{info.get('dataset') or 'images'}{where}: {info['images']:,} images, {classes}"


def log_run_info(info: dict, run_dir=None, data_root: str = "") -> None:
    """The start-up summary, a few plain lines; the first names the run directory and the data's
    root (as given: run_info.json, which may be published, holds no path)."""
    sparse = (
        "dense throughout"
        if info["sparse_steps"] == 0
        else f"2:4 {info['sparsity_kind']} sparse "
        f"({'student and teacher' if info.get('sparse_teacher') else 'student; teacher dense'}) "
        f"for steps {info.get('dense_warmup_steps', 0) + 1}-{info['sparse_steps']} of "
        f"{info['total_steps']} "
        f"(sparse_fraction {info['sparse_fraction']:g}), then dense; backend "
        f"{info['sparsity_backend']}, "
        f"pruning {info['pruning']}"
    )
    stop = (
        ""
        if info["last_step"] == info["total_steps"]
        else f", stopping at step {info['last_step']} (max_steps)"
    )
    start = f"resuming at step {info['start_step']}" if info["start_step"] else "starting at step 0"
    lines = [f"run directory {run_dir}"] if run_dir is not None else []
    lines += [f"data: {line}" for line in [data_line(info, data_root)] if line]
    lines += [
        f"device {info['device']} ({info['device_name']}), {info['world_size']} process(es), torch "
        f"{info['torch']}",
        f"global batch {info['global_batch']} ({info['world_size']} x "
        f"{info['batch_size_per_gpu']}), peak lr "
        f"{info['peak_lr']:.4g} (base_lr {info['base_lr']:g}, {info['scaling_rule']})",
        f"parameters: student {_millions(info['student_params'])} (backbone "
        f"{_millions(info['backbone_params'])}), "
        f"trainable {_millions(info['trainable_params'])}, teacher "
        f"{_millions(info['teacher_params'])}",
        f"dtypes: parameters {info['param_dtype']}, autocast {info['amp_dtype']} (train.amp_dtype="
        f"{info['amp_dtype_configured']}), residual stream {info['residual_dtype']} "
        f"(train.residual_dtype="
        f"{info['residual_dtype_configured']}), grad scaler "
        f"{'on' if info['grad_scaler'] else 'off'}; torch.compile "
        f"{info['compile']}; augmentation on {info['augment_on']}"
        f"{' (compiled)' if info.get('augment_compile') else ''}",
        f"schedule: {info['total_steps']} steps, {sparse}; {start}{stop}",
    ]
    for line in lines:
        logger.info("start-up: %s", line)


def _eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds))) if math.isfinite(seconds) else "?"


def _number(value) -> float | None:
    if hasattr(value, "item"):
        value = value.item()
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def format_line(record: dict, last_step: int, eta_s: float) -> str:
    """One periodic line: `step  40/1000  phase sparse  loss 9.1234  dino_local_crops_loss 5.4321
    ...  lr 1.234e-04 wd 0.0400  images/s 812.3  max mem 5120 MB  eta 0:13:02`."""
    width = len(str(last_step))
    parts = [f"step {record['step']:>{width}}/{last_step}", f"phase {record.get('phase', '?')}"]
    for key, value in record.items():
        if key == "loss" or key.endswith("_loss"):
            number = _number(value)
            parts.append(f"{key} {number:.4f}" if number is not None else f"{key} {value}")
    for key, label, fmt in (
        ("lr", "lr", ".3e"),
        ("wd", "wd", ".4f"),
        ("images_per_s", "images/s", ".1f"),
        ("max_mem_mb", "max mem", ".0f"),
    ):
        number = _number(record.get(key))
        if number is not None:
            parts.append(f"{label} {number:{fmt}}{' MB' if key == 'max_mem_mb' else ''}")
    parts.append(f"eta {_eta(eta_s)}")
    return "  ".join(parts)


def _open_tensorboard(log_dir: Path, purge_step: int):
    try:
        from torch.utils.tensorboard import (
            SummaryWriter,
        )  # optional dependency: imported only when it is there
    except ImportError:
        logger.info(
            "TensorBoard event files are off: the optional `tensorboard` package is not installed "
            "(pip install -e '.[tensorboard]'); metrics.jsonl holds the same values"
        )
        return None
    # purge_step: a resumed run's events replace those an earlier attempt logged after its last
    # checkpoint
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


SPARSITY_FIELDS = (
    "mask_flip_rate",
    "pruned_share",
    "pruned_grad_to_weight",
    "switch_loss_before",
    "switch_loss_after",
    "switch_loss_jump",
    "soft_threshold_scale_ratio",
)  # sparsity_monitor.py


def _tag(key: str) -> str:
    if key in SPARSITY_FIELDS:
        return f"sparsity/{key}"
    if key == "loss" or key.endswith("_loss"):
        return f"loss/{key}"
    if key.startswith("grad_norm_"):
        return f"grad_norm/{key[len('grad_norm_') :]}"
    return f"train/{key}"


class ProgressLog:
    """The periodic lines, the terminal bar and the TensorBoard events of one training process
    (silent off rank 0). Use as a context manager around the loop."""

    def __init__(self, output_dir: Path, start_step: int, last_step: int, enabled: bool):
        self.enabled, self.last_step = enabled, last_step
        self.bar = tqdm(
            total=last_step,
            initial=start_step,
            desc="train",
            dynamic_ncols=True,
            disable=not (enabled and on_terminal()),
        )
        self.writer = _open_tensorboard(Path(output_dir), start_step + 1) if enabled else None
        self._start_step, self._start_time = start_step, time.perf_counter()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ProgressLog:
        if not self.bar.disable:  # log lines printed above the bar instead of through it
            self._stack.enter_context(logging_redirect_tqdm())
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.bar.close()
        self._stack.close()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def update(self, steps: int = 1) -> None:
        self.bar.update(steps)

    def eta_s(self, step: int) -> float:
        """Seconds left at this process's mean step time so far."""
        done, elapsed = step - self._start_step, time.perf_counter() - self._start_time
        return (self.last_step - step) * elapsed / done if done > 0 else float("nan")

    def log(self, record: dict) -> None:
        """A metrics record (as written to metrics.jsonl): one log line, the bar's postfix,
        TensorBoard scalars."""
        if not self.enabled:
            return
        step = record["step"]
        logger.info("%s", format_line(record, self.last_step, self.eta_s(step)))
        loss = _number(record.get("loss"))
        self.bar.set_postfix(
            loss=f"{loss:.4f}" if loss is not None else "?",
            phase=record.get("phase"),
            refresh=False,
        )
        if self.writer is not None:
            for key, value in record.items():
                number = _number(value)
                if key not in _NOT_SCALARS and number is not None:
                    self.writer.add_scalar(_tag(key), number, step)
            if "phase" in record:
                self.writer.add_scalar(
                    "train/sparse_phase", float(record["phase"] == "sparse"), step
                )

    def scalars(self, prefix: str, step: int, groups: dict) -> None:
        """TensorBoard scalars `prefix/<group>/<name>` from {group: {name: number or None}} (e.g.
        per layer)."""
        if self.writer is None:
            return
        for group, values in groups.items():
            for name, value in values.items():
                number = _number(value)
                if number is not None:
                    self.writer.add_scalar(f"{prefix}/{group}/{name}", number, step)
