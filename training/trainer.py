"""The DINOv2 training loop: schedules, AdamW with the reference's parameter groups, per-module
clipping, EMA teacher, sparse-then-dense phases, JSONL metrics, atomic resumable checkpoints, clean
stops on SIGTERM and NaN.

Resuming is bit-exact: a checkpoint holds the student, teacher and loss centers (all in the model's
state dict), the optimizer, the grad scaler, every rank's RNG states, the step (which fixes the
sparsity phase) and the data loader's sampler state (the position in the sample stream:
`SSLLoader.state_dict`).

Data parallel over processes (see `distributed.py`): the student is wrapped in DDP, whose bucketed
gradient all-reduce overlaps the backward pass; every rank then applies the same update, so the EMA
teacher and the loss centers (reduced across ranks in the losses) stay identical without any
broadcast (checked at each checkpoint). Rank 0 alone writes metrics, checkpoints and exports.
Checkpoints are full (unsharded) state dicts, so a run can resume on another number of processes
provided the global batch (processes x `train.batch_size_per_gpu`) is the same: the schedules are
indexed by step, and a step is one global batch.

Split by concern, so that this module is the loop: the rules for continuing from a checkpoint are in
`resume.py`, the run directory's files (names, metrics lines, status.json, checkpoints) in the
`rundir` package, what a run writes about itself (config, run info, status, metrics lines) in
`run_records.py`, AdamW, its per-group schedule values and per-module clipping in `optim.py`, the
DDP wrapping in `distributed.py`, SIGTERM in `step_checks.py`.
"""

import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from configs import Config, to_yaml
from data import SSLBatch, build_ssl_loader, build_training_dataset, dataset_summary
from models.ssl_meta_arch import SSLMetaArch
from rundir.checkpoints import CheckpointManager
from rundir.errors import CommandError
from rundir.layout import write_sparsity_decisions
from rundir.run_dir import RunDir
from rundir.status import FAILED, FINISHED, PREEMPTED, RUNNING, last_step
from rundir.torch_files import save_verified
from sparsity.converter import DENSE, SPARSE

from .compile import compile_model, compile_wanted, ddp_graph_splits
from .distributed import (
    DistContext,
    all_gather_objects,
    barrier,
    check_replicas_identical,
    data_parallel,
    mean_over_ranks,
)
from .gc_control import StepGc
from .numerics import apply_residual_dtype, autocast_dtype
from .optim import build_optimizer, clip_per_module, set_hyperparameters
from .progress import ProgressLog, run_info
from .resume import (
    ResumeMismatch,
    check_resumable,
    check_same_config,
    nothing_left,
    own_run_id,
    restore_rng,
    rng_state,
    sampler_state,
)
from .run_records import RunRecords, metrics_line
from .schedules import build_schedules
from .sparsity_monitor import SparsityMonitor
from .sparsity_setup import check_sparsity, sparsity_converter
from .step_checks import STOP_SIGNALS, StepChecks, on_stop_signals
from .step_graph import build_step_graph

logger = logging.getLogger(__name__)


class TrainingDiverged(CommandError, RuntimeError):
    """The loss or a gradient norm became NaN/inf; the last good checkpoint is kept."""


class Preempted(SystemExit):
    """SIGTERM or Ctrl-C received: a checkpoint was saved at a step boundary; rerunning the same
    command resumes. The exit code is 128 + the signal (143 SIGTERM, 130 SIGINT; 143 on a rank
    stopped by another rank's signal)."""

    def __init__(self, step: int, signum: int = signal.SIGTERM):
        super().__init__(STOP_SIGNALS[signum])
        self.step = step


class Trainer:
    def __init__(self, cfg: Config, output_dir: Path, ctx: DistContext, dataset=None):
        """`dataset`: the training images, if the caller built them already (train.py does, to
        report a wrong data.root before anything else happens); built here otherwise, before the
        model."""
        self.cfg, self.output_dir, self.ctx = cfg, Path(output_dir), ctx
        self.run_dir = RunDir(output_dir)
        self.dataset = build_training_dataset(cfg) if dataset is None else dataset
        self.device = ctx.device
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.model = SSLMetaArch(cfg).to(self.device)
        apply_residual_dtype(
            self.model, cfg.train.residual_dtype
        )  # before compilation, which traces its casts
        self.compiled = (
            compile_model(self.model, cfg.train.compile_backend, cfg.train.compile_mode)
            if compile_wanted(cfg.train.compile, self.device)
            else []
        )
        self.forward_model = data_parallel(self.model, ctx)
        if self.compiled and ctx.is_distributed and ctx.is_main:
            logger.info(
                "DDP: compiled graphs %s (train.ddp_split_compiled_graphs=%s)",
                "cut at the gradient buckets" if cfg.train.ddp_split_compiled_graphs else "whole",
                str(cfg.train.ddp_split_compiled_graphs).lower(),
            )
        torch.manual_seed(cfg.train.seed + ctx.rank)  # drop-path draws differ per rank
        self.global_batch = cfg.train.batch_size_per_gpu * ctx.world_size

        self.schedules = build_schedules(cfg, ctx.world_size)
        self.param_groups = self.model.get_params_groups()
        self.optimizer = build_optimizer(self.param_groups, cfg, self.device)
        self.amp_dtype = autocast_dtype(
            cfg.train.amp_dtype, self.device, warn=ctx.is_main
        )  # the dtype used
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.amp_dtype == torch.float16
        )
        # the sparse-then-dense switch of the student backbone, and of the teacher's with
        # sparsity.teacher=sparse (else the teacher, an EMA of the dense master weights, runs
        # dense), applied in one place: `enter_phase`
        self.sparsity = sparsity_converter(cfg)
        self.sparse_targets = [self.model.student.backbone] + (
            [self.model.teacher.backbone] if cfg.sparsity.teacher == "sparse" else []
        )
        check_sparsity(
            self.sparsity, self.sparse_targets
        )  # options the model cannot take fail now, naming the key
        # the student's masks and the switch's loss jump, with each metrics line (rank 0;
        # sparsity.mask_stats)
        self.monitor = SparsityMonitor(
            self.sparsity,
            self.model.student.backbone,
            self.output_dir,
            cfg.total_steps,
            cfg.train.log_period,
            self.amp_dtype,
            ctx.is_main and cfg.sparsity.mask_stats,
        )
        self._decisions_written = ""  # the text of sparsity_decisions.json as last written
        # a checkpoint without its digest file is refused unless train.allow_unverified_checkpoints
        # opts in
        self.checkpoints = CheckpointManager(
            self.run_dir.checkpoint_dir,
            cfg.train.max_to_keep,
            writer=ctx.is_main,
            allow_missing_digest=cfg.train.allow_unverified_checkpoints,
        )
        self.records = RunRecords(
            self.output_dir, ctx.is_main
        )  # metrics.jsonl, status.json, the run's id
        # the data stream; its position is the loader's sampler state, saved in checkpoints and
        # restored from them
        self.loader = build_ssl_loader(
            cfg, rank=ctx.rank, world_size=ctx.world_size, dataset=self.dataset
        )
        self.step = 0
        self.corrupt_skipped = 0  # over all ranks
        self._stop_requested = 0  # the stop signal this rank received (SIGTERM, SIGINT), 0 = none
        self._stop_agreed = False  # some rank got one (agreed on in the per-step flag all-reduce)
        self.checks = StepChecks(ctx)  # per-step flags, read one step late: no per-step host sync
        # train.cuda_graph: the step captured once per phase and replayed (step_graph.py); None =
        # launched eagerly
        self.step_graph = build_step_graph(
            cfg.train.cuda_graph, ctx, self.optimizer, self.graphed_compute
        )
        self._student_params = None  # per student module, for clipping (see _clip_gradients)

    # ----------------------------------------------------------------- state
    def state_dict(self, rng_per_rank: list[dict]) -> dict:
        """Everything to continue (all ranks hold the same model and optimizer; `rng_per_rank` is
        gathered)."""
        sampler = (
            self.loader.state_dict()
        )  # at the batches trained on (the workers' prefetch runs ahead)
        return {
            "step": self.step,
            "run_id": self.records.run_id,
            "phase": self.sparsity.phase,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rng_per_rank,
            "corrupt_skipped": self.corrupt_skipped,
            "world_size": self.ctx.world_size,
            "batch_size_per_gpu": self.cfg.train.batch_size_per_gpu,
            "sampler": sampler,
            "samples_consumed": sampler[
                "samples_consumed"
            ],  # global stream positions [0, this) are used
            "config": to_yaml(self.cfg),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's state (`resume.py` holds the rules for when that is
        possible)."""
        check_same_config(state, self.cfg, self.output_dir)
        check_resumable(state, self.cfg, self.ctx.world_size)
        try:  # older checkpoints: the sampler state their step implies
            self.loader.load_state_dict(sampler_state(state))
        except ValueError as e:  # another dataset size or seed
            raise ResumeMismatch(
                f"the checkpoint's sample stream cannot be continued: {e}"
            ) from None
        self.step = state["step"]
        # Enter the phase the checkpoint was written in (that of its last step) before loading:
        # sparse modules may carry state of their own (e.g. S-STE's scale). A switch due at `step`
        # then happens in the loop, as it did in the uninterrupted run.
        self.enter_phase(state["phase"])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.corrupt_skipped = state["corrupt_skipped"]
        restore_rng(
            state["rng"] if isinstance(state["rng"], list) else [state["rng"]],
            self.ctx,
            self.cfg.train.seed,
            self.step,
        )

    def resume_if_possible(self) -> bool:
        """Every rank loads the newest readable checkpoint of the (shared) run directory; they must
        agree."""
        if not self.cfg.train.resume:
            return False
        state = self.checkpoints.load_latest()
        found = all_gather_objects(None if state is None else state["step"], self.ctx)
        if len(set(found)) > 1:
            raise ResumeMismatch(
                f"ranks found different checkpoints in {self.checkpoints.directory} (step per "
                f"rank: {found}): is the run directory on a file system every node shares?"
            )
        if state is None:
            return False
        self.records.run_id = own_run_id(
            state, self.output_dir, self.checkpoints.path_for(state["step"])
        )
        self.load_state_dict(state)
        logger.info("resumed at step %d (%s phase)", self.step, self.sparsity.phase)
        return True

    def save_checkpoint(self) -> Path:
        """Collective: every rank calls it; rank 0 writes; returns once the file is complete (so no
        rank exits, e.g. on SIGTERM, while rank 0 is still writing and a launcher tears the job
        down)."""
        self.settle_checks()
        check_replicas_identical(
            list(self.model.parameters()) + list(self.model.buffers()),
            self.ctx,
            "student/teacher parameters or loss centers",
        )
        rng = all_gather_objects(rng_state(), self.ctx)
        path = self.checkpoints.path_for(self.step)
        if self.ctx.is_main:
            self.checkpoints.save(self.state_dict(rng), self.step)
        barrier(self.ctx)
        return path

    def export_teacher(self, path: Path, role: str = "teacher") -> None:
        """The teacher backbone alone (or the student's, `role`), for linear probes and fine-tuning
        (loaded with weights_only=True)."""
        if self.ctx.is_main:
            weights = (
                self.model.teacher_backbone_state_dict()
                if role == "teacher"
                else self.model.student_backbone_state_dict()
            )
            save_verified(
                {"backbone": weights, "step": self.step, "student_config": to_yaml(self.cfg)}, path
            )
            logger.info("exported %s backbone to %s", role, path)

    # ----------------------------------------------------------------- loop
    def _clip_gradients(self) -> dict:
        """Per student module, as the reference (not one global norm)."""
        # the Parameter objects never change (2:4 swaps share them): list them once
        if self._student_params is None:
            self._student_params = {
                name: list(m.parameters()) for name, m in self.model.student.items()
            }
        return clip_per_module(self._student_params, self.cfg.optim.clip_grad)

    def _apply_checks(self, flags) -> None:
        """Act on resolved step flags (`StepChecks`): count skipped images, note a stop, stop on
        divergence."""
        for f in flags:
            self.corrupt_skipped += f.corrupt_skipped
            self._stop_agreed |= f.stop
            diverged = f.nonfinite_loss or (f.nonfinite_grad_norm and not self.scaler.is_enabled())
            if not diverged:
                continue
            good = self.checkpoints.checkpoints()
            last = str(good[-1]) if good else "none written yet"
            what, values = ("loss", f.terms) if f.nonfinite_loss else ("gradient norm", f.norms)
            detail = ", ".join(f"{k}={v.item():.4g}" for k, v in values.items())
            raise TrainingDiverged(
                f"non-finite {what} at step {f.step} ({detail}). Stopped without saving; last good "
                f"checkpoint: "
                f"{last}. Lower optim.base_lr or raise the batch size (small batches are unstable "
                f"with "
                "centering), then rerun to resume from that checkpoint."
            )

    def settle_checks(self) -> None:
        """Wait for every queued step check (before anything is written, so no checkpoint holds a
        diverged step)."""
        self._apply_checks(self.checks.resolve())

    def enter_phase(self, phase: str) -> bool:
        """Put the student backbone (and the teacher's, with sparsity.teacher=sparse) in sparsity
        phase `phase` ("sparse" or "dense"): the one place the trainer applies its model converter
        (`self.sparsity`: convert at the first sparse step, revert at the switch, or the
        checkpoint's phase on resume). True if the phase changed."""
        changed = self.sparsity.set_phase(self.sparse_targets, phase, self.step)
        if changed and self.step_graph is not None:
            self.step_graph.reset()  # the graph holds the other phase's kernels and weights
        if changed and phase == DENSE:
            # a resumed dense phase has them pruned already
            if self.cfg.sparsity.switch_weights == "pruned":
                names = self.sparsity.prune_weights(
                    [self.model.student.backbone, self.model.teacher.backbone],
                    mask_dtype=self.amp_dtype,
                )
                logger.info(
                    "step %d: %d MLP weights of student and teacher pruned 2:4 for the dense phase",
                    self.step,
                    len(names),
                )
            self.write_sparsity_decisions()  # what the last sparse steps decided
        return changed

    def write_sparsity_decisions(self) -> None:
        """sparsity_decisions.json: what the sparse backends decided by timing so far
        (`sparsity.decisions()`: auto's choice per GEMM shape, cuSPARSELt plans and packing, the
        weight-gradient path); rank 0, atomically, only when it changed (decisions are made at the
        first steps of each shape)."""
        if self.ctx.is_main:
            self._decisions_written = write_sparsity_decisions(
                self.output_dir, self.sparsity.decisions(), unless=self._decisions_written
            )

    def train_step(self, batch: SSLBatch, values: dict) -> tuple[torch.Tensor, dict, dict]:
        """One optimizer step on this rank's `batch` (on the device) with the schedule `values` of
        the step (`self.schedules.at(step)`): forward under autocast, backward (gradients
        all-reduced under DDP), per-module clipping, AdamW, EMA teacher update. Returns (loss, loss
        terms, gradient norms), detached and still on the device: nothing here waits for the GPU
        (the step's NaN / stop checks are read one step later). The caller owns `self.step`, the
        sparsity phase (`enter_phase`) and the logging, as `train` does; benchmarks call this to
        time the real step."""
        if self.step_graph is not None:
            loss, terms, norms = self.step_graph.step(batch, values)
        else:
            set_hyperparameters(self.optimizer, values)
            loss, terms, norms = self._compute_step(
                batch,
                values["teacher_temp"],
                values["momentum"],
                pruned_decay_scale=values.get("pruned_decay_scale", 1.0),
            )
        # this step's flags start on their way; the previous step's are read now (the GPU is still
        # busy with this one)
        self.checks.queue(
            self.step, loss, terms, norms, bool(self._stop_requested), int(batch.corrupt_skipped)
        )
        self._apply_checks(self.checks.resolve_previous())
        return loss, terms, norms

    def graphed_compute(self, batch: SSLBatch, hyper) -> tuple:
        """The step `step_graph` captures: `_compute_step` reading every schedule value from the
        graph's device buffer (`hyper`, a `ScheduleTensors`); the decay's share only where it ramps
        or fades (else it is 1 throughout, and a multiply by it per layer and step would be work for
        nothing)."""
        sp = self.cfg.sparsity
        scale = hyper.pruned_decay_scale if sp.pruned_decay_ramp or sp.pruned_decay_fade else 1.0
        return self._compute_step(
            batch, hyper.teacher_temp, hyper.momentum, hyper.decay_weights, scale
        )

    def _compute_step(
        self, batch: SSLBatch, teacher_temp, momentum, decay_weights=None, pruned_decay_scale=1.0
    ):
        """The device work of a step (what `step_graph` captures): forward, backward, clipping,
        AdamW, EMA. With `decay_weights` (the graph's tensor schedule), AdamW's weight decay is
        applied by it before the step; `pruned_decay_scale`: the step's share of
        `sparsity.pruned_decay` (its ramp)."""
        autocast = torch.autocast(
            self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype != torch.float32
        )
        with autocast, ddp_graph_splits(self.cfg.train.ddp_split_compiled_graphs):
            loss, terms = self.forward_model(batch, teacher_temp=teacher_temp)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(
            loss
        ).backward()  # under DDP: gradients averaged over ranks as they become ready
        self.scaler.unscale_(self.optimizer)
        norms = self._clip_gradients()
        self.sparsity.decay_pruned(
            self.amp_dtype, pruned_decay_scale
        )  # pulls the pruned entries towards 0
        if decay_weights is not None:
            decay_weights()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.model.update_teacher(momentum)
        return loss.detach(), {k: v.detach() for k, v in terms.items()}, norms

    def batches(self) -> Iterator[SSLBatch]:
        """This rank's batches on the device, from the loader's position on (the start, or the
        checkpoint's); the loader stops its workers when this is closed."""
        loader = self.loader
        # creating workers draws a seed: keep the training RNG untouched
        with torch.random.fork_rng(devices=[]):
            iterator = iter(loader)
        try:
            for batch in iterator:
                yield loader.to_device(batch, self.device)
        finally:
            # however the loop ends: the data workers stop here, not at interpreter exit
            loader.close()

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop at the next step boundary with a checkpoint (what SIGTERM and Ctrl-C do during
        `train`)."""
        self._stop_requested = signum

    def train(self) -> Path:
        """Run (or resume) to the end; return the exported teacher backbone path. status.json
        records the run's state from its start on (a refusal to resume, raised before, leaves the
        directory as it was)."""
        last = last_step(self.cfg)
        final = self.run_dir.teacher
        if self.ctx.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.resume_if_possible()  # refuses another config before anything is written
        if resumed and nothing_left(
            self.cfg, self.output_dir, self.step, last, say=self.ctx.is_main
        ):
            return final
        self.records.start(
            self.cfg,
            self.step,
            resumed,
            self.checkpoints.directory,
            lambda: run_info(
                self.cfg,
                self.model,
                self.device,
                self.ctx.world_size,
                self.amp_dtype,
                bool(self.compiled),
                self.step,
                last,
                getattr(self.dataset, "fingerprint", ""),
                dataset_summary(self.dataset),
            ),
        )
        self.monitor.truncate_after(
            self.step
        )  # as metrics.jsonl: lines after the checkpoint are logged again
        try:
            self._run(resumed, last, final)
        except Preempted:
            self.records.status(PREEMPTED, self.step)
            raise
        except BaseException as e:  # recorded, then raised as it was
            self.records.status(FAILED, self.step, f"{type(e).__name__}: {e}")
            raise
        self.records.status(FINISHED, self.step)
        return final

    def _run(self, resumed: bool, last_step: int, final: Path) -> None:
        cfg = self.cfg
        total = cfg.total_steps
        start_step = self.step
        if resumed and self.step % cfg.train.teacher_export_period == 0 and 0 < self.step < total:
            # the checkpoint of an export step is written first: a kill during that export is redone
            # from it
            path = self.run_dir.teacher_export(self.step)
            if self.ctx.is_main and not path.exists():
                logger.warning(
                    "redoing the teacher export of step %d, which did not finish", self.step
                )
                self.export_teacher(path)
        self.enter_phase(self.sparsity.phase_at(self.step))
        self.model.train()
        progress = ProgressLog(self.output_dir, self.step, last_step, enabled=self.ctx.is_main)
        with (
            on_stop_signals(self.request_stop),
            contextlib.closing(self.batches()) as batches,
            progress,
            StepGc(cfg.train.gc_period) as step_gc,
        ):
            # batches: lazy (the loader starts at the first next(), after any resume), closed
            # however the loop ends; the bar (a terminal only) is closed before any error is
            # reported, so that the message is a line of its own
            window_start, window_steps = time.perf_counter(), 0
            while self.step < last_step:
                self.enter_phase(self.sparsity.phase_at(self.step))
                values = self.schedules.at(self.step)
                batch = next(batches)
                loss, terms, norms = self.train_step(batch, values)
                self.monitor.observe_step(self.step, loss)
                window_steps += 1
                self.step += 1
                step_gc.step(self.step)
                progress.update(1)
                log_now = self.step % cfg.train.log_period == 0 or self.step == last_step
                if (
                    log_now
                    or self.step % cfg.train.checkpoint_period == 0
                    or (self.step % cfg.train.teacher_export_period == 0)
                ):
                    self.settle_checks()
                if log_now:
                    loss, terms = mean_over_ranks(loss, terms, self.ctx)
                    elapsed = time.perf_counter() - window_start
                    record = metrics_line(
                        self.step,
                        self.sparsity.phase,
                        loss,
                        terms,
                        values,
                        norms,
                        self.sparsity.auto_summary(),
                        corrupt_skipped=self.corrupt_skipped,
                        images_per_s=self.global_batch * window_steps / max(elapsed, 1e-9),
                        device=self.device,
                    )
                    record.update(self.monitor.record(self.step, self.sparsity.phase, progress))
                    self.records.metrics.write(record)
                    progress.log(record)
                    if self.sparsity.phase == SPARSE:
                        self.write_sparsity_decisions()
                    window_start, window_steps = time.perf_counter(), 0
                if self.step % cfg.train.checkpoint_period == 0 and self.step < last_step:
                    self.save_checkpoint()
                    self.records.status(
                        RUNNING, self.step
                    )  # status.json's step follows the checkpoints
                if self.step % cfg.train.teacher_export_period == 0 and self.step < total:
                    self.export_teacher(self.run_dir.teacher_export(self.step))
                if self._stop_agreed:
                    self.save_checkpoint()
                    progress.close()
                    signum = self._stop_requested or signal.SIGTERM
                    logger.warning(
                        "%s: checkpoint saved at step %d; rerun the same command to resume",
                        "SIGINT (Ctrl-C)" if signum == signal.SIGINT else "SIGTERM",
                        self.step,
                    )
                    raise Preempted(self.step, signum)
        self.settle_checks()
        # resumed at the last step (killed during the final export): only export
        if self.step > start_step:
            self.save_checkpoint()
        if self.step >= total:
            # first: the teacher's file is what says the run is finished
            if cfg.train.export_student:
                self.export_teacher(self.run_dir.student, role="student")
            self.export_teacher(final)
