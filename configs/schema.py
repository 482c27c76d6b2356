"""Typed schema of every training config.

Defaults are the reference DINOv2 values (`ssl_default_config.yaml`); YAML files in this folder and command-line
dotlists only override them. Every key is declared here, so a typo or a wrong type is an error (see `load.py`).
"""

from dataclasses import dataclass, field
from typing import List


@dataclass
class StudentConfig:
    arch: str = "vit_large"  # vit_tiny | vit_small | vit_base | vit_large
    patch_size: int = 16
    drop_path_rate: float = 0.3
    layerscale: float = 1.0e-5  # LayerScale init; 0 disables LayerScale
    ffn_layer: str = "mlp"  # only "mlp": its fc1/fc2 are what 2:4 sparsity targets
    qkv_bias: bool = True
    proj_bias: bool = True
    ffn_bias: bool = True
    num_register_tokens: int = 0
    interpolate_antialias: bool = False
    interpolate_offset: float = 0.1
    pretrained_weights: str = ""  # ours, timm or dinov2 format; loaded into student and teacher before training


@dataclass
class TeacherConfig:
    momentum_teacher: float = 0.992
    final_momentum_teacher: float = 1.0
    warmup_teacher_temp: float = 0.04
    teacher_temp: float = 0.07
    warmup_teacher_temp_epochs: int = 30


@dataclass
class DinoConfig:
    loss_weight: float = 1.0
    head_n_prototypes: int = 65536
    head_bottleneck_dim: int = 256
    head_nlayers: int = 3
    head_hidden_dim: int = 2048
    koleo_loss_weight: float = 0.1


@dataclass
class IbotConfig:
    loss_weight: float = 1.0
    mask_sample_probability: float = 0.5
    mask_ratio_min_max: List[float] = field(default_factory=lambda: [0.1, 0.5])
    separate_head: bool = False
    head_n_prototypes: int = 65536
    head_bottleneck_dim: int = 256
    head_nlayers: int = 3
    head_hidden_dim: int = 2048


@dataclass
class OptimConfig:
    epochs: int = 100
    weight_decay: float = 0.04
    weight_decay_end: float = 0.4
    base_lr: float = 0.004  # for a global batch of 1024; scaled by `scaling_rule`
    warmup_epochs: int = 10
    min_lr: float = 1.0e-6
    clip_grad: float = 3.0  # per student module (backbone, dino_head, ibot_head), not one global norm
    freeze_last_layer_epochs: int = 1
    scaling_rule: str = "sqrt_wrt_1024"  # sqrt_wrt_1024 | linear_wrt_1024 | none
    patch_embed_lr_mult: float = 0.2
    layerwise_decay: float = 0.9
    adamw_beta1: float = 0.9
    adamw_beta2: float = 0.999


@dataclass
class CropsConfig:
    global_crops_scale: List[float] = field(default_factory=lambda: [0.32, 1.0])
    local_crops_number: int = 8
    local_crops_scale: List[float] = field(default_factory=lambda: [0.05, 0.32])
    global_crops_size: int = 224
    local_crops_size: int = 96
    # The reference passes 1 - p to RandomApply, so its blur probabilities are 0.0 / 0.9 / 0.5 instead of the
    # intended 1.0 / 0.1 / 0.5 (dinov2 PR #411). Its released checkpoints were trained that way.
    reference_blur_inversion: bool = False


@dataclass
class DataConfig:
    dataset: str = "imagenet_folder"  # imagenet_folder (root/<split>/<class>/*) | digits (bundled with scikit-learn)
    root: str = ""
    split: str = "train"  # imagenet_folder: the sub-folder of root; digits: train (1437) | val (360) | all (1797)
    on_corrupt: str = "skip"  # skip: log, count and use the next image | raise: stop with the file's path
    digits_image_size: int = 64  # digits are 8x8; upscaled to this size before cropping


@dataclass
class SparsityConfig:
    sparse_fraction: float = 0.0  # first `sparse_fraction * total_steps` steps 2:4-sparse, then dense
    modules: str = r"blocks\.\d+\.mlp\.fc[12]"  # regex over module names (full match); glob if it starts with glob:
    kind: str = "weight"  # weight (SemiSparseLinear) | activation (SemiSparseActivationLinear)
    backend: str = "auto"  # auto | cusparselt | cutlass | dense
    pruning: str = "tile_greedy"  # tile_greedy | tile_optimal (transposable) | rowwise | soft_threshold


@dataclass
class TrainConfig:
    batch_size_per_gpu: int = 64
    epoch_length: int = 1250  # iterations per "epoch" (the reference's OFFICIAL_EPOCH_LENGTH)
    seed: int = 0
    num_workers: int = 10
    centering: str = "centering"  # centering (softmax, EMA center) | sinkhorn_knopp
    amp_dtype: str = "bf16"  # autocast dtype on GPU (bf16 | fp16 | fp32); CPU always runs fp32
    log_period: int = 10  # iterations between metrics.jsonl lines
    checkpoint_period: int = 3750  # iterations between resumable checkpoints
    max_to_keep: int = 3
    teacher_export_period: int = 12500  # iterations between teacher backbone exports for evaluation
    resume: bool = True
    max_steps: int = 0  # > 0: stop after this many steps (schedules still span epochs * epoch_length)
    # torch.compile of the blocks, heads and losses (models/training/compile.py): auto = on for CUDA, off on CPU
    compile: str = "auto"  # auto | true | false
    compile_backend: str = "inductor"  # torch.compile backend: inductor | aot_eager | eager (the last two to debug)
    compile_mode: str = "default"  # student blocks' torch.compile mode: default | reduce-overhead (CUDA graphs)


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
    def sparse_steps(self) -> int:
        return round(self.sparsity.sparse_fraction * self.total_steps)
