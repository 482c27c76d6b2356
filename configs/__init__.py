"""Typed training configs: `load_config(path, overrides)` merges schema defaults, a YAML file and a
dotlist."""

from .errors import as_written
from .eval_schema import EvalConfig, load_eval_config
from .load import DEFAULT_CONFIG, ConfigError, load_config, load_structured, scaled_lr, to_yaml
from .schema import Config

__all__ = [
    "Config",
    "ConfigError",
    "as_written",
    "DEFAULT_CONFIG",
    "EvalConfig",
    "load_config",
    "load_eval_config",
    "load_structured",
    "scaled_lr",
    "to_yaml",
]
