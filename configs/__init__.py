"""Typed training configs: `load_config(path, overrides)` merges schema defaults, a YAML file and a dotlist."""

from .load import ConfigError, DEFAULT_CONFIG, load_config, scaled_lr, to_yaml
from .schema import Config

__all__ = ["Config", "ConfigError", "DEFAULT_CONFIG", "load_config", "scaled_lr", "to_yaml"]
