"""The error every config problem raises: one line naming the key or file, exit status 2."""

from rundir.errors import UsageError


class ConfigError(UsageError, ValueError):
    """A config that cannot be used as written (exit status 2)."""
