"""The DINOv2 training loop: schedules, AdamW with the reference's parameter groups, per-module clipping, EMA
teacher, sparse-then-dense phases, JSONL metrics, atomic resumable checkpoints, clean stops on SIGTERM and NaN.

Resuming is bit-exact: a checkpoint holds the student, teacher and loss centers (all in the model's state dict),
the optimizer, the grad scaler, the RNG states, the step (which fixes the sampler position and the sparsity phase).
"""

import contextlib
import logging
import math
import signal
import time
from pathlib import Path
from typing import Iterator

import torch
from tqdm import tqdm

from configs import Config, to_yaml
from data import build_ssl_loader
from models.ssl_meta_arch import SSLMetaArch

from .checkpoint import CheckpointManager, atomic_save, rng_state, set_rng_state
from .distributed import DistContext, all_reduce_mean_
from .metrics import MetricsLog
from .schedules import build_schedules
from .sparse_schedule import SparseSchedule

logger = logging.getLogger(__name__)

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class TrainingDiverged(RuntimeError):
    """The loss or a gradient norm became NaN/inf; the last good checkpoint is kept."""


class Preempted(SystemExit):
    """SIGTERM received: a checkpoint was saved at a step boundary; rerunning the same command resumes."""

    def __init__(self, step: int):
        super().__init__(143)
        self.step = step


class Trainer:
    def __init__(self, cfg: Config, output_dir: Path, ctx: DistContext):
        self.cfg, self.output_dir, self.ctx = cfg, Path(output_dir), ctx
        self.device = ctx.device
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.model = SSLMetaArch(cfg).to(self.device)
        torch.manual_seed(cfg.train.seed + ctx.rank)  # drop-path draws differ per rank

        self.schedules = build_schedules(cfg, ctx.world_size)
        self.param_groups = self.model.get_params_groups()
        self.optimizer = torch.optim.AdamW(
            [{k: v for k, v in g.items() if k != "names"} for g in self.param_groups],
            betas=(cfg.optim.adamw_beta1, cfg.optim.adamw_beta2),
        )
        amp = AMP_DTYPES[cfg.train.amp_dtype] if self.device.type == "cuda" else torch.float32
        self.amp_dtype = amp
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=amp == torch.float16)
        self.sparse_schedule = SparseSchedule(cfg.sparsity, cfg.sparse_steps)
        self.checkpoints = CheckpointManager(self.output_dir / "checkpoints", cfg.train.max_to_keep)
        self.metrics = MetricsLog(self.output_dir / "metrics.jsonl", enabled=ctx.is_main)
        self.step = 0
        self.corrupt_skipped = 0
        self._stop_requested = False

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "phase": self.sparse_schedule.current,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "corrupt_skipped": self.corrupt_skipped,
            "world_size": self.ctx.world_size,
            "config": to_yaml(self.cfg),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["world_size"] != self.ctx.world_size:
            raise RuntimeError(
                f"checkpoint was written by {state['world_size']} processes, this run has {self.ctx.world_size}: "
                "the data order and the per-rank RNG streams would not match; resume with the same world size"
            )
        self.step = state["step"]
        # Enter the phase the checkpoint was written in (that of its last step) before loading: sparse modules may
        # carry state of their own (e.g. S-STE's scale). A switch due at `step` then happens in the loop, as it
        # did in the uninterrupted run.
        self.sparse_schedule.set_phase(self.model.student.backbone, state["phase"], self.step)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.corrupt_skipped = state["corrupt_skipped"]
        set_rng_state(state["rng"])

    def resume_if_possible(self) -> bool:
        if not self.cfg.train.resume:
            return False
        state = self.checkpoints.load_latest()
        if state is None:
            return False
        self.load_state_dict(state)
        self.metrics.truncate_after(self.step)
        logger.info("resumed at step %d (%s phase)", self.step, self.sparse_schedule.current)
        return True

    def save_checkpoint(self) -> Path:
        path = self.checkpoints.path_for(self.step)
        if self.ctx.is_main:
            self.checkpoints.save(self.state_dict(), self.step)
        return path

    def export_teacher(self, path: Path) -> None:
        """The teacher backbone alone, for linear probes and fine-tuning (loaded with weights_only=True)."""
        if self.ctx.is_main:
            state = {"backbone": self.model.teacher_backbone_state_dict(), "step": self.step,
                     "student_config": to_yaml(self.cfg)}
            atomic_save(state, path)
            logger.info("exported teacher backbone to %s", path)

    # ----------------------------------------------------------------- loop
    def _set_hyperparameters(self, values: dict) -> None:
        for group in self.optimizer.param_groups:
            lr = values["last_layer_lr"] if group["is_last_layer"] else values["lr"]
            group["lr"] = lr * group["lr_multiplier"]
            group["weight_decay"] = values["wd"] * group["wd_multiplier"]

    def _clip_gradients(self) -> dict:
        """Per student module, as the reference (not one global norm)."""
        norms = {}
        for name, module in self.model.student.items():
            params = [p for p in module.parameters() if p.grad is not None]
            if params:
                norms[f"grad_norm_{name}"] = torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.clip_grad)
        return norms

    def _check_finite(self, loss: torch.Tensor, terms: dict) -> None:
        bad = torch.logical_not(torch.isfinite(loss.detach())).float()
        if self.ctx.is_distributed:
            torch.distributed.all_reduce(bad)
        if bad.item() > 0:
            good = self.checkpoints.checkpoints()
            last = str(good[-1]) if good else "none written yet"
            detail = ", ".join(f"{k}={v.item():.4g}" for k, v in terms.items())
            raise TrainingDiverged(
                f"non-finite loss at step {self.step} ({detail}). Stopped without saving; last good checkpoint: "
                f"{last}. Lower optim.base_lr or raise the batch size (small batches are unstable with "
                "centering), then rerun to resume from that checkpoint."
            )

    def _train_step(self, batch: dict, values: dict) -> tuple[torch.Tensor, dict, dict]:
        self._set_hyperparameters(values)
        autocast = torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype != torch.float32)
        with autocast:
            loss, terms = self.model(batch, teacher_temp=values["teacher_temp"])
        self._check_finite(loss, terms)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        all_reduce_mean_([p.grad for p in self.model.student.parameters() if p.grad is not None], self.ctx)
        self.scaler.unscale_(self.optimizer)
        norms = self._clip_gradients()
        if not self.scaler.is_enabled() and not all(math.isfinite(n.item()) for n in norms.values()):
            raise TrainingDiverged(f"non-finite gradient norm at step {self.step}: "
                                   + ", ".join(f"{k}={v.item():.4g}" for k, v in norms.items()))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.model.update_teacher(values["momentum"])
        return loss.detach(), {k: v.detach() for k, v in terms.items()}, norms

    def _batches(self) -> Iterator[dict]:
        loader = build_ssl_loader(self.cfg, rank=self.ctx.rank, world_size=self.ctx.world_size,
                                  start_step=self.step)
        with torch.random.fork_rng(devices=[]):  # creating workers draws a seed: keep the training RNG untouched
            iterator = iter(loader)
        for batch in iterator:
            yield {k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}

    def _stop_now(self) -> bool:
        flag = torch.tensor(float(self._stop_requested))
        if self.ctx.is_distributed:
            flag = flag.to(self.device)
            torch.distributed.all_reduce(flag)
        return flag.item() > 0

    @contextlib.contextmanager
    def _sigterm_stops_cleanly(self):
        def handler(signum, frame):
            self._stop_requested = True

        try:
            previous = signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not the main thread: leave signals alone
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def train(self) -> Path:
        """Run (or resume) to the end; return the exported teacher backbone path."""
        cfg = self.cfg
        total = cfg.total_steps
        last_step = min(total, cfg.train.max_steps) if cfg.train.max_steps > 0 else total
        if self.ctx.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "config.yaml").write_text(to_yaml(cfg))
        self.resume_if_possible()
        self.sparse_schedule.apply(self.model.student.backbone, self.step)
        self.model.train()
        batch_size = cfg.train.batch_size_per_gpu * self.ctx.world_size
        progress = tqdm(total=last_step, initial=self.step, disable=not self.ctx.is_main, desc="train",
                        dynamic_ncols=True)
        with self._sigterm_stops_cleanly():
            batches = self._batches()  # lazy: the loader starts at the first next(), after any resume
            window_start, window_steps = time.perf_counter(), 0
            while self.step < last_step:
                self.sparse_schedule.apply(self.model.student.backbone, self.step)
                values = self.schedules.at(self.step)
                batch = next(batches)
                self.corrupt_skipped += int(batch["corrupt_skipped"])
                loss, terms, norms = self._train_step(batch, values)
                window_steps += 1
                self.step += 1
                progress.update(1)
                if self.step % cfg.train.log_period == 0 or self.step == last_step:
                    elapsed = time.perf_counter() - window_start
                    record = {"step": self.step - 1, "phase": self.sparse_schedule.current, "loss": loss,
                              **terms, **values, **norms, "corrupt_skipped": self.corrupt_skipped,
                              "images_per_s": batch_size * window_steps / max(elapsed, 1e-9)}
                    self.metrics.write(record)
                    progress.set_postfix(loss=f"{loss.item():.4f}", phase=self.sparse_schedule.current)
                    window_start, window_steps = time.perf_counter(), 0
                if self.step % cfg.train.checkpoint_period == 0 and self.step < last_step:
                    self.save_checkpoint()
                if self.step % cfg.train.teacher_export_period == 0 and self.step < total:
                    self.export_teacher(self.output_dir / "eval" / f"step_{self.step:08d}" / "teacher_backbone.pth")
                if self._stop_now():
                    self.save_checkpoint()
                    progress.close()
                    logger.warning("SIGTERM: checkpoint saved at step %d; rerun the same command to resume", self.step)
                    raise Preempted(self.step)
        progress.close()
        self.save_checkpoint()
        final = self.output_dir / "teacher_backbone.pth"
        if self.step >= total:
            self.export_teacher(final)
        return final
