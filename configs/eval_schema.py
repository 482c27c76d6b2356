"""Typed schema of `eval_linear.py`'s settings (linear probe + k-NN on a finished run's teacher).

Defaults are the reference dinov2 protocol (`eval/log_regression.py`, `eval/knn.py`). Values come from these
defaults <- an optional YAML file <- `key=value` overrides; an unknown key or a wrong type is an error (`load.py`).
The run's own `config.yaml` supplies the model, the crop size and the dataset; `data.root` can redirect the dataset.
"""

from dataclasses import dataclass, field
from typing import List


@dataclass
class EvalDataConfig:
    root: str = ""  # "" -> the run's data.root (imagenet_folder: root/<split>/<class>/*); ignored for digits
    train_split: str = "train"  # features the probe and the k-NN index are fitted on
    val_split: str = "val"  # the reported split


@dataclass
class FeaturesConfig:
    batch_size: int = 256
    num_workers: int = 8  # capped at the machine's CPU count
    crop_size: int = 0  # 0 -> the run's crops.global_crops_size
    # Resize(round(crop_size * resize_ratio), bicubic) then CenterCrop(crop_size). 1.0 is the reference log-regression
    # transform (Resize 224 / CenterCrop 224); 256/224 is its k-NN / linear transform.
    resize_ratio: float = 1.0
    amp_dtype: str = "bf16"  # autocast dtype on GPU (bf16 | fp16 | fp32); CPU extracts in fp32
    cache: bool = True  # reuse <run>/eval/features_<split>.pt when its key (weights, transform, data, model) matches


@dataclass
class LinearConfig:
    # C values 10**linspace(c_min_power, c_max_power, n_c): the reference's 45 values over 1e-6 .. 1e5
    c_min_power: float = -6.0
    c_max_power: float = 5.0
    n_c: int = 45
    holdout_fraction: float = 0.1  # random share of the train features that picks C (torch.manual_seed(seed))
    seed: int = 0
    max_iter: int = 1000  # L-BFGS iterations per fit (the reference's max_train_iters)
    tol: float = 1.0e-6  # stop when max |gradient| of the mean-scaled objective falls below this (both solvers)
    history_size: int = 10  # torch L-BFGS memory (scipy's default maxcor, which sklearn's lbfgs uses)


@dataclass
class KnnConfig:
    ks: List[int] = field(default_factory=lambda: [10, 20, 100, 200])  # clipped to the train size
    temperature: float = 0.07  # votes weighted by exp(cosine / temperature)
    batch_size: int = 1024  # validation rows scored at a time


@dataclass
class EvalConfig:
    mode: str = "both"  # linear | knn | both
    solver: str = "auto"  # sklearn | torch | auto (torch on a GPU, else sklearn)
    device: str = "auto"  # auto | cpu | cuda
    checkpoint: str = ""  # "" -> <run>/teacher_backbone.pth (the final teacher); "random": untrained baseline
    output: str = ""  # "" -> <run>/eval_linear.json (<run>/eval_linear_random_init.json for checkpoint=random)
    index: str = ""  # results index (one JSON line per evaluation); "" -> <run>/../eval_index.jsonl; "none" = off
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    linear: LinearConfig = field(default_factory=LinearConfig)
    knn: KnnConfig = field(default_factory=KnnConfig)


EVAL_CHOICES = {
    "mode": ("linear", "knn", "both"),
    "solver": ("sklearn", "torch", "auto"),
    "device": ("auto", "cpu", "cuda"),
    "features.amp_dtype": ("bf16", "fp16", "fp32"),
}


def validate_eval(cfg: EvalConfig) -> None:
    """Choice and range checks the type system cannot express."""
    from .load import ConfigError  # load.py imports the training schema only; keep that one-way

    for key, allowed in EVAL_CHOICES.items():
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    lin, knn, feats = cfg.linear, cfg.knn, cfg.features
    checks = [
        (lin.n_c >= 1 and lin.c_min_power <= lin.c_max_power, "linear.n_c must be >= 1 and c_min_power <= c_max_power"),
        (0.0 < lin.holdout_fraction < 1.0, "linear.holdout_fraction must be in (0, 1)"),
        (lin.max_iter >= 1 and lin.tol > 0 and lin.history_size >= 1,
         "linear.max_iter and linear.history_size must be >= 1, linear.tol > 0"),
        (len(knn.ks) > 0 and all(k >= 1 for k in knn.ks), "knn.ks must be a non-empty list of k >= 1"),
        (knn.temperature > 0 and knn.batch_size >= 1, "knn.temperature must be > 0 and knn.batch_size >= 1"),
        (feats.batch_size >= 1 and feats.num_workers >= 0, "features.batch_size >= 1, features.num_workers >= 0"),
        (feats.crop_size >= 0 and feats.resize_ratio >= 1.0, "features.crop_size >= 0, features.resize_ratio >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def load_eval_config(path=None, overrides=()) -> EvalConfig:
    """Schema defaults <- optional YAML `path` <- `key=value` overrides, validated (raises `ConfigError`)."""
    from .load import load_structured

    return load_structured(EvalConfig, path, overrides, validate_eval)
