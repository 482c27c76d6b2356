"""The error every config problem raises: one line naming the key or file, exit status 2."""

from rundir.errors import UsageError


class ConfigError(UsageError, ValueError):
    """A config that cannot be used as written (exit status 2)."""


def as_written(cfg, key: str, value) -> str:
    """`value` (the config's `key`) as shown in logs and messages: the interpolation as written
    where it was one (`${oc.env:DATA}`: an environment value may be a credential, and never reaches
    a file), else the value."""
    return str(getattr(cfg, "_interpolations", {}).get(key, value))
