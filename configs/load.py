"""Load a config: schema defaults <- YAML file <- command-line dotlist, then validate.

One path for every entry point. Unknown keys, wrong types and out-of-range values raise `ConfigError`, whose
message names the offending key and the valid keys of its section.
"""

import dataclasses
import math
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Type, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from .fields import check_fields
from .schema import Config

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"

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
        detail = (e.msg or str(e) or type(e).__name__).splitlines()[0]
        raise ConfigError(f"{source}: wrong type for '{key or '(top level)'}': {detail}") from None
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
    """Every field within its declared range (`schema.py`, `fields.py`), then what relates fields to each other."""
    # YAML reads true/false/on/off as booleans, which a str field stores as "True"/"False"
    cfg.train.compile = str(cfg.train.compile).lower()
    problem = check_fields(cfg)
    if problem:
        raise ConfigError(problem)
    checks = [
        (cfg.crops.global_crops_size % cfg.student.patch_size == 0,
         f"crops.global_crops_size={cfg.crops.global_crops_size} must be a multiple of student.patch_size="
         f"{cfg.student.patch_size}"),
        (cfg.crops.local_crops_size % cfg.student.patch_size == 0,
         f"crops.local_crops_size={cfg.crops.local_crops_size} must be a multiple of student.patch_size="
         f"{cfg.student.patch_size}"),
        (cfg.optim.warmup_epochs <= cfg.optim.epochs,
         f"optim.warmup_epochs={cfg.optim.warmup_epochs} must be <= optim.epochs={cfg.optim.epochs}"),
        (cfg.dino.loss_weight > 0 or cfg.ibot.loss_weight > 0,
         "dino.loss_weight and ibot.loss_weight are both 0: nothing to train"),
        (cfg.data.dataset != "imagenet_folder" or bool(cfg.data.root), "data.root is required for imagenet_folder"),
        (cfg.train.compile_mode == "default" or cfg.train.compile_backend == "inductor",
         "train.compile_mode=reduce-overhead needs train.compile_backend=inductor (CUDA graphs are inductor's)"),
        (cfg.sparsity.weight_grad == "dense" or cfg.sparsity.kind == "weight",
         f"sparsity.weight_grad={cfg.sparsity.weight_grad} applies to sparsity.kind=weight only, not "
         f"{cfg.sparsity.kind}"),
        (cfg.sparsity.weight_grad == "dense" or cfg.train.compile == "false",
         f"sparsity.weight_grad={cfg.sparsity.weight_grad} runs in eager mode only: set train.compile=false"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def _load_yaml(path: Path, schema: type = Config) -> DictConfig:
    """A YAML file as a mapping of sections; syntax errors, duplicate keys and a non-mapping top level are
    ConfigErrors naming the file."""
    try:
        node = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        detail = " ".join(str(e).split())
        raise ConfigError(f"{path}: not a valid YAML config ({detail[:300]})") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: a config is a mapping of sections ({_section_keys('x', schema)}), "
                          f"not a {type(node).__name__}")
    sections = {f.name for f in dataclasses.fields(schema) if dataclasses.is_dataclass(f.default_factory)}
    for key in node.keys():
        if key in sections and not isinstance(node._get_node(key), DictConfig):
            raise ConfigError(f"{path}: '{key}' is a section ({_section_keys(f'{key}.x', schema)}), "
                              f"not the value {node._get_node(key)._value()!r}")
    return node


def load_config(path: Optional[Path | str] = None, overrides: Iterable[str] = ()) -> Config:
    """Schema defaults, then the YAML at `path` (default: the embedded default), then `overrides`."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    merged = OmegaConf.structured(Config)
    merged = _merge(merged, _load_yaml(path), str(path))
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
        merged = _merge(merged, _load_yaml(path, schema), str(path), schema)
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
    "sparsity.cslt_search", "sparsity.cslt_pack", "sparsity.fused_wgrad",
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
