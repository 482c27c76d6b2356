"""Typed schema of `eval_linear.py`'s settings (linear probe + k-NN on a finished run's teacher).

Defaults are the reference dinov2 protocol (`eval/log_regression.py`, `eval/knn.py`). Values come
from these defaults <- an optional YAML file <- `key=value` overrides; an unknown key or a wrong
type is an error (`load.py`). The run's own `config.yaml` supplies the model, the crop size and the
dataset; `data.dataset` / `data.root` can evaluate on another one.
"""

import hashlib
from dataclasses import dataclass, field

from .fields import check_fields, value
from .load import ConfigError, load_structured  # load.py imports only the training schema: no cycle

# the torch solver's arithmetic (evaluation/logreg.py): auto = float64 on CPU and for small
# problems, float32_3xtf32 (fp32 accuracy on TF32 tensor cores) for large GPU problems; float32 =
# IEEE fp32 GEMMs (~7x slower per GEMM on an H100); float64 = sklearn's
PRECISIONS = ("auto", "float64", "float32", "float32_3xtf32")
# Benchmarking only, inexact: one TF32 GEMM (weights rounded to 10 mantissa bits). The objective is
# then too noisy for the line search: warm-started fits stop after a few iterations from C ~ 18 up,
# ~5% above the optimum.
INEXACT_PRECISIONS = ("float32_tf32",)
PRUNE_MLP = ("auto", "true", "false")


@dataclass
class EvalDataConfig:
    # "" -> the run's data.dataset; imagenet_folder (any root/<split>/<class>/* tree, e.g. CIFAR as
    # PNGs) or digits
    dataset: str = value("", choices=("", "imagenet_folder", "digits"))
    # "" -> the run's data.root when the dataset is the run's (imagenet_folder:
    # root/<split>/<class>/*); an error for digits, which has no root
    root: str = ""
    train_split: str = "train"  # features the probe and the k-NN index are fitted on
    val_split: str = "val"  # the reported split


@dataclass
class FeaturesConfig:
    batch_size: int = value(256, ge=1)
    num_workers: int = value(8, ge=0)  # capped at the machine's CPU count
    crop_size: int = value(0, ge=0)  # 0 -> the run's crops.global_crops_size
    # Resize(round(crop_size * resize_ratio), bicubic) then CenterCrop(crop_size). 1.0 is the
    # reference log-regression transform (Resize 224 / CenterCrop 224); 256/224 is its k-NN / linear
    # transform.
    resize_ratio: float = value(1.0, ge=1)
    amp_dtype: str = value("bf16", choices=("bf16", "fp16", "fp32"))  # on GPU; CPU extracts in fp32
    # reuse <run>/eval/features_<split>.pt when its key (weights, transform, data, model) matches
    cache: bool = True


@dataclass
class LinearConfig:
    # C values 10**linspace(c_min_power, c_max_power, n_c): the reference's 45 values over 1e-6 ..
    # 1e5
    c_min_power: float = value(-6.0, ge=-30, le=30)
    c_max_power: float = value(5.0, ge=-30, le=30)
    n_c: int = value(45, ge=1)
    # random share of the train features that picks C (torch.manual_seed(seed))
    holdout_fraction: float = value(0.1, gt=0, lt=1)
    seed: int = value(0, ge=0)
    max_iter: int = value(1000, ge=1)  # L-BFGS iterations per fit (the reference's max_train_iters)
    # stop when max |gradient| of the mean-scaled objective falls below this (both solvers)
    tol: float = value(1.0e-6, gt=0)
    history_size: int = value(
        10, ge=1
    )  # torch L-BFGS memory (scipy's default maxcor, which sklearn's lbfgs uses)
    precision: str = value(
        "auto", choices=PRECISIONS
    )  # float32* need solver=torch (or auto, which then picks it)


@dataclass
class KnnConfig:
    ks: list[int] = value([10, 20, 100, 200], ge=1, nonempty=True)  # clipped to the train size
    temperature: float = value(0.07, gt=0)  # votes weighted by exp(cosine / temperature)
    batch_size: int = value(1024, ge=1)  # validation rows scored at a time


@dataclass
class EvalConfig:
    mode: str = value("both", choices=("linear", "knn", "both"))
    solver: str = value(
        "auto", choices=("sklearn", "torch", "auto")
    )  # auto: torch on a GPU, else sklearn
    device: str = value("auto", choices=("auto", "cpu", "cuda"))
    # "" -> <run>/teacher_backbone.pth (the final teacher); baselines: "random" (the untrained
    # backbone), "pixels" (the eval transform's normalised pixels, flattened: 3 * crop * crop
    # features, no model)
    checkpoint: str = ""
    # the teacher's MLP linears pruned 2:4 at every forward with the run's sparsity settings
    # (pattern, kind, pruning method), as its student computed them: auto = when the run's last
    # training step was sparse (e.g. sparsity.sparse_fraction=1.0) | true | false
    # (evaluation/mlp_pruning.py). The result records it as "mlp_weights"; a probe in the mode other
    # than the run's last step writes *_pruned_mlp.json / *_dense_mlp.json
    prune_mlp: str = value("auto", choices=PRUNE_MLP)
    # "" -> <run>/eval_linear.json for the final teacher's probe; other evaluations get names of
    # their own (eval_knn*.json for mode=knn, *_random_init.json, *_pixels.json,
    # *_step_XXXXXXXX.json, *_protocol_<hash>.json under another protocol than the default:
    # evaluate.default_output_name)
    output: str = ""
    # results index (one JSON line per evaluation); "" -> <run>/../eval_index.jsonl; "none" = off
    index: str = ""
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    linear: LinearConfig = field(default_factory=LinearConfig)
    knn: KnnConfig = field(default_factory=KnnConfig)


def validate_eval(cfg: EvalConfig) -> None:
    """Every field within its declared range, and the C grid the right way round."""
    # YAML and the command line read true/false as booleans, which a str field stores as
    # "True"/"False"
    cfg.prune_mlp = str(cfg.prune_mlp).lower()
    problem = check_fields(cfg)
    if problem:
        raise ConfigError(problem)
    if cfg.solver == "sklearn" and cfg.linear.precision not in ("auto", "float64"):
        raise ConfigError(
            f"linear.precision={cfg.linear.precision} needs solver=torch (or auto): sklearn solves "
            f"in "
            "float64"
        )
    if cfg.linear.c_min_power > cfg.linear.c_max_power:
        raise ConfigError(
            f"linear.c_min_power={cfg.linear.c_min_power} must be <= linear.c_max_power="
            f"{cfg.linear.c_max_power}"
        )


def load_eval_config(path=None, overrides=()) -> EvalConfig:
    """Schema defaults <- optional YAML `path` <- `key=value` overrides, validated (raises
    `ConfigError`)."""
    return load_structured(EvalConfig, path, overrides, validate_eval)


# The probe's protocol: the features.*, linear.* and knn.* settings its numbers depend on. Each
# result records its changes from the default, and the tables compare only probes under one protocol
# (reporting/table.py).
EXECUTION_ONLY = ("features.batch_size", "features.num_workers", "features.cache", "knn.batch_size")


def protocol(cfg: EvalConfig) -> dict:
    """{"knn.temperature": 0.07, ...}: the protocol settings of `cfg`."""
    settings = {}
    for section in ("features", "linear", "knn"):
        for key, setting in vars(getattr(cfg, section)).items():
            if f"{section}.{key}" not in EXECUTION_ONLY:
                settings[f"{section}.{key}"] = (
                    list(setting) if isinstance(setting, (list, tuple)) else setting
                )
    return settings


def protocol_changes(cfg: EvalConfig) -> list[str]:
    """["knn.temperature=0.1", ...]: where `cfg`'s protocol differs from the default one (the
    tables')."""
    default = protocol(EvalConfig())
    return [f"{key}={setting}" for key, setting in protocol(cfg).items() if setting != default[key]]


# a record name's protocol label starts so (after `_`, reporting/run_logs.py globs it)
PROTOCOL_PREFIX = "protocol_"


def protocol_label(cfg: EvalConfig) -> str:
    """ "" under the default protocol; else `protocol_<8 hex>`, a hash of `protocol_changes`: what a
    probe's record name carries (`eval_linear_protocol_1a2b3c4d.json`), so that a probe under
    another protocol never replaces the default one's record, which the tables read (the record
    lists the changes themselves)."""
    changes = protocol_changes(cfg)
    if not changes:
        return ""
    return PROTOCOL_PREFIX + hashlib.sha256("\n".join(sorted(changes)).encode()).hexdigest()[:8]


def protocol_suffix(cfg: EvalConfig) -> str:
    """`_<protocol_label>` for a record name, "" under the default protocol."""
    label = protocol_label(cfg)
    return f"_{label}" if label else ""
