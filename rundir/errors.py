"""The one exception base of every refusal a command reports in a line: `CommandError`, which
carries its exit code.

Whatever raises it (a run directory's entry, a checkpoint's digest, a config key, a dataset, a
diverged run), the entry points (`train.py`, `eval_linear.py`, `scripts/make_table.py`,
`slurm/launch.py`) catch this one type, print its message and exit with `exit_code`: 1 for the run,
its files or its data; 2 for the command line or the config. Anything else is a bug and keeps its
traceback.
"""


class CommandError(Exception):
    """A refusal or failure that ends a command with one line (the message) and `exit_code`."""

    exit_code = 1


class UsageError(CommandError):
    """The command line or config asks for something that cannot be done: exit status 2."""

    exit_code = 2


class RunDirProblem(CommandError, RuntimeError):
    """An entry of the run directory is not what the run needs (`checkpoints` not a usable
    directory, `.lock` not a regular file, a link where the run writes a file of its own): refused,
    naming the path, instead of being read as absent."""


class RunDirInUse(CommandError, RuntimeError):
    """Another process writes this run directory: a trainer (two would overwrite each other's
    checkpoints) or an evaluation (its results and feature cache)."""
