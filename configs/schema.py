"""Typed schema of every training config.

Defaults are the reference DINOv2 values (`ssl_default_config.yaml`); YAML files in this folder and
command-line dotlists only override them. Every key is declared in this schema (the sparsity
converter's options in the library, below), so a typo or a wrong type is an error, and every number
and choice declares its valid range (`value(default, ...)`, `fields.py`), so a meaningless value is
an error naming the key and the range (see `load.py`). A field also says what it is to the rest of
the code (`fields.FLAGS`): `execution=True` (how a run executes, which may change on resume),
`at_switch=True` (acts at the sparse-to-dense switch); the lists the other modules use are read from
these flags. The `sparsity` section extends the library's own options
(`sparsity.options.ConverterOptions`, which imports no torch: their names, defaults, choices and
flags are declared there once) with the keys the trainer acts on itself.
"""

import dataclasses
from dataclasses import dataclass, field

from sparsity.options import ConverterOptions

from .fields import value

ARCHS = ("vit_tiny", "vit_small", "vit_base", "vit_large")
COMPILE_MODES = (
    "default",
    "reduce-overhead",
    "max-autotune-no-cudagraphs",
)  # inductor's modes (train.compile_mode)


@dataclass
class StudentConfig:
    arch: str = value("vit_large", choices=ARCHS)  # vit_tiny | vit_small | vit_base | vit_large
    patch_size: int = value(16, ge=1)
    drop_path_rate: float = value(0.3, ge=0, lt=1)
    layerscale: float = value(1.0e-5, ge=0)  # LayerScale init; 0 disables LayerScale
    ffn_layer: str = value(
        "mlp", choices=("mlp",)
    )  # only "mlp": its fc1/fc2 are what 2:4 sparsity targets
    qkv_bias: bool = True
    proj_bias: bool = True
    ffn_bias: bool = True
    num_register_tokens: int = value(0, ge=0)
    interpolate_antialias: bool = False
    interpolate_offset: float = value(0.1, ge=0, lt=1)
    pretrained_weights: str = (
        ""  # ours, timm or dinov2 format; loaded into student and teacher before training
    )


@dataclass
class TeacherConfig:
    momentum_teacher: float = value(0.992, ge=0, le=1)
    final_momentum_teacher: float = value(1.0, ge=0, le=1)
    warmup_teacher_temp: float = value(0.04, gt=0)
    teacher_temp: float = value(0.07, gt=0)
    warmup_teacher_temp_epochs: int = value(30, ge=0)
    # > 0: the EMA's horizon 1/(1 - momentum) kept the same fraction of this run as in a run of this
    # many steps with the schedule above (1 - momentum times momentum_reference_steps / total steps;
    # e.g. 125000, the published ViT-L/16 run, for a short proxy of it) | 0: the schedule as
    # configured (dinov2)
    momentum_reference_steps: int = value(0, ge=0)
    # true: the momentum's cosine restarts at the sparse -> dense switch and runs over the dense
    # steps alone, so that the final teacher averages the dense phase (with the whole-run cosine,
    # 27% of a 7,760-step run's final teacher is still the switch-time teacher at 70% sparse, 95% at
    # 90%; at 125k steps, 0% and 44%) | false: dinov2's schedule
    momentum_restart_at_switch: bool = value(False, at_switch=True)
    # > 0: the same restart at this fraction of the steps (round(fraction x steps), where a run of
    # that sparsity.sparse_fraction switches), in any run: the dense control of
    # momentum_restart_at_switch | 0: no restart
    momentum_restart_fraction: float = value(0.0, ge=0, lt=1)

    def problem(self) -> str | None:
        """What this section's own fields violate together, or None (rules spanning sections:
        `checks.py`)."""
        if self.momentum_restart_fraction > 0 and self.momentum_restart_at_switch:
            return (
                f"teacher.momentum_restart_fraction={self.momentum_restart_fraction:g} and "
                "teacher.momentum_restart_at_switch=true both place the teacher momentum's "
                "restart: set one of "
                "them"
            )
        return None


@dataclass
class DinoConfig:
    loss_weight: float = value(1.0, ge=0)
    head_n_prototypes: int = value(65536, ge=1)
    head_bottleneck_dim: int = value(256, ge=1)
    head_nlayers: int = value(3, ge=1)
    head_hidden_dim: int = value(2048, ge=1)
    koleo_loss_weight: float = value(0.1, ge=0)


@dataclass
class IbotConfig:
    loss_weight: float = value(1.0, ge=0)
    mask_sample_probability: float = value(0.5, ge=0, le=1)
    mask_ratio_min_max: list[float] = value([0.1, 0.5], ge=0, le=1, pair=True)
    separate_head: bool = False
    head_n_prototypes: int = value(65536, ge=1)
    head_bottleneck_dim: int = value(256, ge=1)
    head_nlayers: int = value(3, ge=1)
    head_hidden_dim: int = value(2048, ge=1)


@dataclass
class OptimConfig:
    epochs: int = value(100, ge=1)
    weight_decay: float = value(0.04, ge=0)
    weight_decay_end: float = value(0.4, ge=0)
    base_lr: float = value(0.004, gt=0)  # for a global batch of 1024; scaled by `scaling_rule`
    warmup_epochs: int = value(10, ge=0)
    min_lr: float = value(1.0e-6, ge=0)
    clip_grad: float = value(
        3.0, gt=0
    )  # per student module (backbone, dino_head, ibot_head), not one global norm
    freeze_last_layer_epochs: int = value(1, ge=0)
    scaling_rule: str = value("sqrt_wrt_1024", choices=("sqrt_wrt_1024", "linear_wrt_1024", "none"))
    patch_embed_lr_mult: float = value(0.2, ge=0)
    layerwise_decay: float = value(0.9, gt=0, le=1)
    adamw_beta1: float = value(0.9, ge=0, lt=1)
    adamw_beta2: float = value(0.999, ge=0, lt=1)
    # true: the learning rate's cosine starts again at the sparse -> dense switch, from
    # lr_restart_peak x the schedule's peak, and runs to min_lr over the dense steps (SGDR's warm
    # restart: the dense phase trains at a higher rate than the end of one cosine leaves it) |
    # false: one cosine over the run (dinov2)
    lr_restart_at_switch: bool = value(False, at_switch=True)
    # > 0: the same restart at this fraction of the steps (round(fraction x steps)), in any run: the
    # dense control of lr_restart_at_switch | 0: no restart
    lr_restart_fraction: float = value(0.0, ge=0, lt=1)
    # where a restarted cosine starts, as a fraction of the schedule's peak learning rate
    lr_restart_peak: float = value(0.5, gt=0, le=1)

    def problem(self) -> str | None:
        """What this section's own fields violate together, or None (rules spanning sections:
        `checks.py`)."""
        if self.warmup_epochs > self.epochs:
            return f"optim.warmup_epochs={self.warmup_epochs} must be <= optim.epochs={self.epochs}"
        if self.lr_restart_fraction > 0 and self.lr_restart_at_switch:
            return (
                f"optim.lr_restart_fraction={self.lr_restart_fraction:g} and "
                "optim.lr_restart_at_switch=true both place the learning rate's restart: set one "
                "of them"
            )
        return None


@dataclass
class CropsConfig:
    global_crops_scale: list[float] = value([0.32, 1.0], gt=0, le=1, pair=True)
    local_crops_number: int = value(8, ge=0)
    local_crops_scale: list[float] = value([0.05, 0.32], gt=0, le=1, pair=True)
    global_crops_size: int = value(224, ge=1)
    local_crops_size: int = value(96, ge=1)
    # The reference passes 1 - p to RandomApply, so its blur probabilities are 0.0 / 0.9 / 0.5
    # instead of the intended 1.0 / 0.1 / 0.5 (dinov2 PR #411). Its released checkpoints were
    # trained that way.
    reference_blur_inversion: bool = False
    # intended Gaussian-blur probabilities of (global crop 1, global crop 2, local crops): the
    # reference's 1.0/0.1/0.5; small images lose most of their content to a kernel-9 blur
    # (configs/cifar10.yaml lowers them)
    blur_probabilities: list[float] = value([1.0, 0.1, 0.5], ge=0, le=1, length=3)
    solarize_probability: float = value(
        0.2, ge=0, le=1
    )  # second global crop only, as the reference


DATASETS = ("imagenet_folder", "image_folder", "digits")


@dataclass
class DataConfig:
    # imagenet_folder (root/<split>/<class>/*) | image_folder (every image under root, flat or
    # nested; folder names are not labels: pre-training on one's own images) | digits (bundled with
    # scikit-learn; no root)
    dataset: str = value("imagenet_folder", choices=DATASETS)
    root: str = value("", execution=True)
    # imagenet_folder: the sub-folder of root; digits: train (1437) | val (360) | all (1797);
    # image_folder: unused
    split: str = "train"
    # skip: log, count and use the next image | raise: stop with the file's path
    on_corrupt: str = value("skip", choices=("skip", "raise"), execution=True)
    digits_image_size: int = value(
        64, ge=8
    )  # digits are 8x8; upscaled to this size before cropping
    # decode the split once into memory (uint8) instead of reading files every step: small datasets
    # (CIFAR-size); needs images of one size
    in_memory: bool = False
    # where the multi-crop augmentation runs: workers (per image, PIL, the reference) | device (per
    # batch on the training device, data/batched_augment.py: same transforms; small images are
    # otherwise CPU-bound)
    augment_on: str = value("workers", choices=("workers", "device"))
    # with augment_on=device: the crops made by one compiled graph (torch.compile, fused kernels)
    # instead of ~1,400 small kernels a 512-image batch, whose launches bound a small model's step;
    # the same draws, values equal to float rounding; its first batch compiles (about a minute)
    augment_compile: bool = value(False, execution=True)


@dataclass
class SparsityConfig(ConverterOptions):
    """The library converter's options (`ConverterOptions`: modules, kind, backend, pruning,
    weight_grad, weight_grad_modules, pruned_grad, pruned_decay, cslt_search, cslt_pack,
    fused_wgrad, block_density, block_size; each documented there), then the keys the trainer acts
    on itself (`TRAINER_FIELDS`)."""

    # first `sparse_fraction * total_steps` steps 2:4-sparse, then dense
    sparse_fraction: float = value(0.0, ge=0, le=1)
    # the first `dense_warmup_fraction * total_steps` of those steps dense (a warm-up before the
    # sparse phase, the switch staying at sparse_fraction); 0 = sparse from the first step (the
    # published recipe); a dense run ignores it
    dense_warmup_fraction: float = value(0.0, ge=0, lt=1)
    # the EMA teacher's backbone in the sparse phase: dense (its MLPs use the whole EMA weights,
    # which the student never uses whole) | sparse (its MLP linears are pruned 2:4 like the
    # student's: a swap by name over the whole meta-architecture). The exported teacher is always
    # the dense EMA weights.
    teacher: str = value("dense", choices=("dense", "sparse"))
    # the weights the dense phase starts from: dense (the published recipe: the master weights as
    # trained, with the entries the sparse phase pruned) | pruned (those entries zeroed at the
    # switch, in the student and in the EMA teacher, each by its own 2:4 mask: the dense phase
    # starts from the network the sparse phase computed)
    switch_weights: str = value("dense", choices=("dense", "pruned"))
    # the share of the sparse phase over which the masked decay's strength ramps linearly from 0 to
    # pruned_decay (constant after it): the masks settle early in the phase, and a full decay then
    # shrinks entries that would have re-entered; 0 = the full strength from the phase's first step
    pruned_decay_ramp: float = value(0.0, ge=0, le=1)
    # the share of the sparse phase, at its end, over which the masked decay's strength falls
    # linearly to 0 (none at the phase's last step): the pruned entries then regrow under their
    # straight-through gradients before the switch, where a full decay leaves them near zero for
    # the dense phase to regrow; 0 = the full strength to the switch
    pruned_decay_fade: float = value(0.0, ge=0, le=1)
    # per logged step, the student's mask flip rate, pruned share of |W| and the switch's loss jump
    # (metrics.jsonl, sparsity_masks.jsonl, TensorBoard; training/sparsity_monitor.py): a few prunes
    # per logged step, none per step
    mask_stats: bool = value(True, execution=True)

    def problem(self) -> str | None:
        """The trainer's rules on this section, or None; the converter's own are the library's
        (`ConverterOptions.converter_problem`, which `checks.py` calls), those spanning sections
        `checks.py`'s."""
        if self.pruned_decay_ramp and not self.pruned_decay:
            return (
                f"sparsity.pruned_decay_ramp={self.pruned_decay_ramp:g} ramps the masked decay, "
                f"which "
                "sparsity.pruned_decay=0 turns off: set both, or neither"
            )
        if self.pruned_decay_fade and not self.pruned_decay:
            return (
                f"sparsity.pruned_decay_fade={self.pruned_decay_fade:g} fades the masked decay, "
                "which sparsity.pruned_decay=0 turns off: set both, or neither"
            )
        if self.pruned_decay_ramp + self.pruned_decay_fade > 1:
            return (
                f"sparsity.pruned_decay_ramp={self.pruned_decay_ramp:g} and "
                f"sparsity.pruned_decay_fade={self.pruned_decay_fade:g} overlap: the ramp's share "
                "at the sparse phase's start and the fade's at its end must sum to 1 or less"
            )
        if self.switch_weights != "dense" and (
            self.kind != "weight" or self.pruning == "soft_threshold"
        ):
            return (
                f"sparsity.switch_weights=pruned needs sparsity.kind=weight and a masking "
                f"sparsity.pruning, not "
                f"kind={self.kind}, pruning={self.pruning}"
            )
        return None


CONVERTER_FIELDS = tuple(
    f.name for f in dataclasses.fields(ConverterOptions)
)  # the library converter's keys
# the `sparsity` keys the trainer acts on itself, not the library's converter: those this section
# adds
TRAINER_FIELDS = tuple(
    f.name for f in dataclasses.fields(SparsityConfig) if f.name not in CONVERTER_FIELDS
)


@dataclass
class TrainConfig:
    batch_size_per_gpu: int = value(64, ge=2, execution=True)
    epoch_length: int = value(
        1250, ge=1
    )  # iterations per "epoch" (the reference's OFFICIAL_EPOCH_LENGTH)
    seed: int = value(0, ge=0)
    num_workers: int = value(10, ge=0, execution=True)
    # centering (softmax, EMA center) | sinkhorn_knopp
    centering: str = value("centering", choices=("centering", "sinkhorn_knopp"))
    # autocast dtype on GPU; CPU always runs fp32
    amp_dtype: str = value("bf16", choices=("bf16", "fp16", "fp32"))
    # under autocast, the backbone's residual stream, LayerNorm and LayerScale in fp32, or in
    # amp_dtype as the reference's FSDP param_dtype computes them ("amp"; masters, optimizer and
    # losses stay fp32): training/numerics.py
    residual_dtype: str = value("fp32", choices=("fp32", "amp"))
    log_period: int = value(10, ge=1, execution=True)  # iterations between metrics.jsonl lines
    checkpoint_period: int = value(
        3750, ge=1, execution=True
    )  # iterations between resumable checkpoints
    max_to_keep: int = value(3, ge=1, execution=True)
    # iterations between teacher backbone exports for evaluation
    teacher_export_period: int = value(12500, ge=1, execution=True)
    # at the end, the student backbone too (student_backbone.pth, the teacher's format): after a
    # late switch the EMA teacher has barely moved, and the student is the network the dense steps
    # trained
    export_student: bool = value(False, execution=True)
    resume: bool = value(True, execution=True)
    # resume from a checkpoint that has no .sha256 beside it (written by an older version); logged
    # when used
    allow_unverified_checkpoints: bool = value(False, execution=True)
    # > 0: stop after this many steps (schedules still span epochs * epoch_length)
    max_steps: int = value(0, ge=0, execution=True)
    # torch.compile of the blocks, heads and losses (training/compile.py): auto = on for CUDA, off
    # on CPU
    compile: str = value("auto", choices=("auto", "true", "false"), execution=True)
    # torch.compile backend (aot_eager and eager to debug)
    compile_backend: str = value(
        "inductor", choices=("inductor", "aot_eager", "eager"), execution=True
    )
    # the blocks' torch.compile mode (training/compile.py): reduce-overhead replays the student's
    # blocks as CUDA graphs; max-autotune-no-cudagraphs times inductor's GEMM templates, whose
    # epilogues can take the bias and GELU, against cuBLAS for every block's GEMMs (minutes of
    # compiling per phase)
    compile_mode: str = value("default", choices=COMPILE_MODES, execution=True)
    # true: under DDP, dynamo cuts a compiled graph whose gradients span several of DDP's 25 MB
    # buckets (a ViT-L block's are 50 MB) at the bucket boundaries, so that a bucket's all-reduce
    # can start inside the graph's backward; each cut also ends the kernel fusions across it
    # (training/compile.py). false (default): whole graphs, all-reduces start between them; on two
    # H200s 1.4% (dense) and 6.6% (sparse phase) faster a step
    ddp_split_compiled_graphs: bool = value(False, execution=True)
    # steps between collections of Python's young generations, automatic collection off in the
    # training loop (a full collection mid-step stalls the host: training/gc_control.py); 0 =
    # Python's automatic collection
    gc_period: int = value(50, ge=0, execution=True)
    # seconds each process of a data-parallel launch waits for all of them to join (torchrun or
    # Slurm variables left in a shell, a peer that never started) before it stops with one line and
    # exit status 1
    dist_start_timeout_s: float = value(600.0, gt=0, execution=True)
    # the whole step (forward, backward, clipping, AdamW, EMA) captured as one CUDA graph per
    # sparsity phase and replayed (training/step_graph.py): one launch per step instead of
    # thousands; CUDA, bf16 or fp32, one process
    cuda_graph: bool = value(False, execution=True)

    def problem(self) -> str | None:
        """What this section's own fields violate together, or None (rules spanning sections:
        `checks.py`)."""
        if self.compile_mode != "default" and self.compile_backend != "inductor":
            return (
                f"train.compile_mode={self.compile_mode} needs train.compile_backend=inductor "
                f"(CUDA graphs and "
                "autotuned GEMM templates are inductor's)"
            )
        if self.cuda_graph and self.amp_dtype == "fp16":
            return (
                "train.cuda_graph=true needs train.amp_dtype=bf16 (or fp32 compute): fp16's grad "
                "scaler reads its "
                "inf check on the host, which a replayed graph cannot"
            )
        if self.cuda_graph and self.compile_mode == "reduce-overhead":
            return (
                "train.cuda_graph=true captures the whole step already: use "
                "train.compile_mode=default or "
                "max-autotune-no-cudagraphs, not reduce-overhead (graphs of blocks inside it)"
            )
        return None


@dataclass
class Config:
    student: StudentConfig = field(default_factory=StudentConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    dino: DinoConfig = field(default_factory=DinoConfig)
    ibot: IbotConfig = field(default_factory=IbotConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    crops: CropsConfig = field(default_factory=CropsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sparsity: SparsityConfig = field(default_factory=SparsityConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @property
    def total_steps(self) -> int:
        return self.optim.epochs * self.train.epoch_length

    @property
    def momentum_scale(self) -> float:
        """What 1 - teacher momentum is multiplied by (`teacher.momentum_reference_steps`; 1 when it
        is 0)."""
        reference = self.teacher.momentum_reference_steps
        return reference / self.total_steps if reference else 1.0

    @property
    def momentum_restart_step(self) -> int | None:
        """The step where the teacher momentum's cosine starts again
        (`teacher.momentum_restart_at_switch`: the first dense step;
        `teacher.momentum_restart_fraction`: that fraction of the steps), None for no restart."""
        t = self.teacher
        return self._restart_step(t.momentum_restart_at_switch, t.momentum_restart_fraction)

    @property
    def lr_restart_step(self) -> int | None:
        """The step where the learning rate's cosine starts again (`optim.lr_restart_at_switch`:
        the first dense step; `optim.lr_restart_fraction`: that fraction of the steps), None for no
        restart."""
        return self._restart_step(self.optim.lr_restart_at_switch, self.optim.lr_restart_fraction)

    def _restart_step(self, at_switch: bool, fraction: float) -> int | None:
        """The first dense step where a restart is at the switch, round(fraction x steps) where it
        is at a fraction, None for none."""
        if at_switch:
            return self.sparse_steps
        if fraction > 0:
            return round(fraction * self.total_steps)
        return None

    @property
    def sparse_steps(self) -> int:
        """The step of the switch to dense: the steps before it are sparse (after any dense
        warm-up)."""
        return round(self.sparsity.sparse_fraction * self.total_steps)

    @property
    def dense_warmup_steps(self) -> int:
        """The dense steps before the sparse phase (`sparsity.dense_warmup_fraction`); 0 in a run
        without one."""
        return (
            round(self.sparsity.dense_warmup_fraction * self.total_steps)
            if self.sparse_steps
            else 0
        )

    @property
    def switches(self) -> bool:
        """Whether the run has both phases: some steps sparse, then some dense."""
        return has_switch(self.sparse_steps, self.total_steps)


def has_switch(sparse_steps: int, total_steps: int) -> bool:
    """Whether a schedule of `sparse_steps` sparse steps out of `total_steps` has both phases."""
    return 0 < sparse_steps < total_steps
