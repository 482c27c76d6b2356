"""Load a config: schema defaults <- YAML file <- command-line dotlist, then validate.

One path for every entry point. Unknown keys, wrong types and out-of-range values raise `ConfigError`, whose
message names the offending key and the valid keys of its section.
"""

import dataclasses
import math
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Type, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from .schema import Config

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"

ARCHS = ("vit_tiny", "vit_small", "vit_base", "vit_large")
CHOICES = {
    "student.arch": ARCHS,
    "student.ffn_layer": ("mlp",),
    "train.centering": ("centering", "sinkhorn_knopp"),
    "train.amp_dtype": ("bf16", "fp16", "fp32"),
    "train.compile": ("auto", "true", "false"),
    "train.compile_backend": ("inductor", "aot_eager", "eager"),
    "train.compile_mode": ("default", "reduce-overhead"),
    "optim.scaling_rule": ("sqrt_wrt_1024", "linear_wrt_1024", "none"),
    "data.dataset": ("imagenet_folder", "digits"),
    "data.on_corrupt": ("skip", "raise"),
    "sparsity.kind": ("weight", "activation"),
    "sparsity.backend": ("auto", "cusparselt", "cutlass", "dense"),
    "sparsity.pruning": ("tile_greedy", "tile_optimal", "rowwise", "soft_threshold"),
}


class ConfigError(ValueError):
    """A config that cannot be used as written."""


def _section_keys(full_key: str, schema: type = Config) -> str:
    """The valid keys next to `full_key` (e.g. 'train.batchsize' -> the fields of TrainConfig)."""
    node: object = schema
    parts = full_key.split(".")[:-1]
    for part in parts:
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            break
        node = fields[part].default_factory  # every section is a dataclass default_factory
    names = [f.name for f in dataclasses.fields(node)]
    where = ".".join(parts) or "top level"
    return f"valid keys in {where}: {', '.join(names)}"


def _merge(base: DictConfig, other: DictConfig, source: str, schema: type = Config) -> DictConfig:
    try:
        return OmegaConf.merge(base, other)
    except ConfigKeyError as e:
        key = getattr(e, "full_key", "") or ""
        raise ConfigError(f"{source}: unknown config key '{key}'. {_section_keys(key, schema)}") from None
    except ValidationError as e:
        key = getattr(e, "full_key", "") or ""
        raise ConfigError(f"{source}: wrong type for '{key}': {e.msg.splitlines()[0]}") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{source}: {e}") from None


def _parse_dotlist(overrides: Sequence[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"command-line override '{item}' is not of the form key=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"command line: {e}") from None


def validate(cfg: Config) -> None:
    """Range and choice checks the type system cannot express."""
    # YAML reads true/false/on/off as booleans, which a str field stores as "True"/"False"
    cfg.train.compile = str(cfg.train.compile).lower()
    for key, allowed in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    checks = [
        (0.0 <= cfg.sparsity.sparse_fraction <= 1.0, "sparsity.sparse_fraction must be in [0, 1]"),
        (cfg.train.batch_size_per_gpu >= 2, "train.batch_size_per_gpu must be >= 2 (KoLeo needs a neighbour)"),
        (cfg.optim.epochs > 0 and cfg.train.epoch_length > 0, "optim.epochs and train.epoch_length must be > 0"),
        (cfg.train.log_period > 0 and cfg.train.checkpoint_period > 0, "log and checkpoint periods must be > 0"),
        (cfg.crops.local_crops_number >= 0, "crops.local_crops_number must be >= 0"),
        (len(cfg.ibot.mask_ratio_min_max) == 2 and 0 <= cfg.ibot.mask_ratio_min_max[0]
         <= cfg.ibot.mask_ratio_min_max[1] <= 1, "ibot.mask_ratio_min_max must be [min, max] with 0 <= min <= max <= 1"),
        (0.0 <= cfg.ibot.mask_sample_probability <= 1.0, "ibot.mask_sample_probability must be in [0, 1]"),
        (len(cfg.crops.global_crops_scale) == 2, "crops.global_crops_scale must be [min, max]"),
        (len(cfg.crops.local_crops_scale) == 2, "crops.local_crops_scale must be [min, max]"),
        (cfg.crops.global_crops_size % cfg.student.patch_size == 0, "crops.global_crops_size must be a multiple of "
         "student.patch_size"),
        (cfg.crops.local_crops_size % cfg.student.patch_size == 0, "crops.local_crops_size must be a multiple of "
         "student.patch_size"),
        (cfg.data.dataset != "imagenet_folder" or bool(cfg.data.root), "data.root is required for imagenet_folder"),
        (cfg.train.compile_mode == "default" or cfg.train.compile_backend == "inductor",
         "train.compile_mode=reduce-overhead needs train.compile_backend=inductor (CUDA graphs are inductor's)"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def load_config(path: Optional[Path | str] = None, overrides: Iterable[str] = ()) -> Config:
    """Schema defaults, then the YAML at `path` (default: the embedded default), then `overrides`."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    merged = OmegaConf.structured(Config)
    merged = _merge(merged, OmegaConf.load(path), str(path))
    merged = _merge(merged, _parse_dotlist(list(overrides)), "command line")
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise ConfigError(f"required config values not set: {', '.join(missing)} (set them as key=value)")
    interpolations = _interpolated_values(merged)
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:  # e.g. ${oc.env:VAR} with VAR unset
        raise ConfigError(f"{path}: {str(e).splitlines()[0]}") from None
    assert isinstance(cfg, Config)
    validate(cfg)
    cfg._interpolations = interpolations  # to_yaml writes these back instead of their (possibly secret) values
    return cfg


def _flatten(node, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        out.update(_flatten(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def _interpolated_values(merged: DictConfig) -> dict:
    """{key: '${...}'} for every value given as an interpolation (e.g. `${oc.env:TOKEN}`)."""
    raw = _flatten(OmegaConf.to_container(merged, resolve=False))
    return {k: v for k, v in raw.items() if isinstance(v, str) and "${" in v}


T = TypeVar("T")


def load_structured(schema: Type[T], path: Optional[Path | str] = None, overrides: Iterable[str] = (),
                    validator: Optional[Callable[[T], None]] = None) -> T:
    """The same merge and checks as `load_config` for any dataclass schema (e.g. `EvalConfig`): its defaults, then
    the YAML at `path` if given, then `overrides`; `validator` adds range checks."""
    merged = OmegaConf.structured(schema)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        merged = _merge(merged, OmegaConf.load(path), str(path), schema)
    merged = _merge(merged, _parse_dotlist(list(overrides)), "command line", schema)
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise ConfigError(f"required config values not set: {', '.join(missing)} (set them as key=value)")
    cfg = OmegaConf.to_object(merged)
    if validator is not None:
        validator(cfg)
    return cfg


# What may differ between a run's saved config and the config it is resumed with: how the run is executed and
# observed, never what it computes (the global batch has its own check, see Trainer._check_resumable).
RESUMABLE_CHANGES = (
    "train.max_steps", "train.num_workers", "train.log_period", "train.checkpoint_period", "train.max_to_keep",
    "train.teacher_export_period", "train.resume", "train.batch_size_per_gpu", "train.compile",
    "train.compile_backend", "train.compile_mode", "data.root", "data.on_corrupt", "sparsity.backend",
)


def config_difference(old_yaml: str, new_yaml: str, allowed: Sequence[str] = ()) -> list[str]:
    """'key: old -> new' for every value of `new_yaml` that differs from `old_yaml`, except the `allowed` keys.
    Keys only the old config has are ignored (a config written by an older version with a key since removed)."""

    old = _flatten(OmegaConf.to_container(OmegaConf.create(old_yaml)))
    new = _flatten(OmegaConf.to_container(OmegaConf.create(new_yaml)))
    return [f"{k}: {old.get(k)!r} -> {v!r}" for k, v in sorted(new.items())
            if k not in allowed and k in old and old[k] != v]


def to_yaml(cfg: Config) -> str:
    """The config as YAML for config.yaml and checkpoints. Values that came from interpolations are written as the
    interpolation (`${oc.env:TOKEN}`), never resolved: an environment variable's value does not end up in files."""
    node = OmegaConf.structured(cfg)
    for key, text in getattr(cfg, "_interpolations", {}).items():
        OmegaConf.update(node, key, text, force_add=False)
    return OmegaConf.to_yaml(node)


def scaled_lr(cfg: Config, world_size: int) -> float:
    """The peak learning rate for this global batch, by `optim.scaling_rule` (the reference's only rule is sqrt)."""
    ratio = cfg.train.batch_size_per_gpu * world_size / 1024.0
    rule = cfg.optim.scaling_rule
    if rule == "sqrt_wrt_1024":
        return cfg.optim.base_lr * math.sqrt(ratio)
    if rule == "linear_wrt_1024":
        return cfg.optim.base_lr * ratio
    return cfg.optim.base_lr
