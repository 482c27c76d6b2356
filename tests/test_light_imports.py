"""`train.py --help` and a config typo answer without importing torch (and the entry points set
OpenMP's passive waits before anything loads it): the schema's `sparsity` section extends the
library's own options (`sparsity.options`, which imports nothing; the `sparsity` package loads its
modules on first use), so their names, defaults and choices are never listed twice."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import ConfigError, load_config
from configs.fields import schema_ranges
from configs.schema import Config, SparsityConfig

REPO = Path(__file__).resolve().parents[1]

# In a fresh interpreter: the help of both entry points, then a misspelt key of each; torch must not
# be imported.
NO_TORCH = """
import contextlib, io, os, sys
assert "OMP_WAIT_POLICY" not in os.environ
import eval_linear, train
assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"  # set by the entry points, before anything loads torch
for main, argv in ((train.main, ["--help"]), (eval_linear.main, ["--help"])):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(argv)
        except SystemExit as e:
            assert e.code == 0, e.code
    assert "key=value" in out.getvalue()
assert train.main(["student.arhc=vit_tiny"]) == 2
assert train.main(["optim.base_lr=-1"]) == 2
assert eval_linear.main(["--run", "nowhere", "solvr=torch"]) == 2
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
print(sorted(m for m in sys.modules if m.startswith("sparsity")))
"""


def test_help_and_a_config_typo_do_not_import_torch():
    env = {
        k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"
    }  # (the test session sets it too)
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == ["[]", "['sparsity', 'sparsity.options']"], (
        result.stdout
    )
    assert (
        "unknown config key 'student.arhc'" in result.stderr
        and "valid keys in student: arch" in result.stderr
    )
    assert (
        "optim.base_lr=-1.0 is out of range" in result.stderr
        and "unknown config key 'solvr'" in result.stderr
    )


def test_the_schemas_sparsity_choices_are_the_librarys_own():
    from sparsity.backends import BACKENDS
    from sparsity.backends.settings import CSLT_PACK_MODES, CSLT_SEARCH_MODES, BackendSettings
    from sparsity.converter import KINDS
    from sparsity.mvue_grad import WEIGHT_GRADS
    from sparsity.pruned_entries import PRUNED_GRADS
    from sparsity.pruning import METHODS

    ranges = schema_ranges(SparsityConfig, "sparsity.")
    owned = {
        "sparsity.kind": KINDS,
        "sparsity.backend": BACKENDS,
        "sparsity.pruning": METHODS,
        "sparsity.weight_grad": WEIGHT_GRADS,
        "sparsity.pruned_grad": PRUNED_GRADS,
        "sparsity.cslt_search": CSLT_SEARCH_MODES,
        "sparsity.cslt_pack": CSLT_PACK_MODES,
    }
    for key, choices in owned.items():
        assert tuple(ranges[key].choices) == tuple(choices), key
    # the library's backends default to the converter's options, declared once
    defaults = SparsityConfig()
    assert (defaults.cslt_search, defaults.cslt_pack, defaults.fused_wgrad) == dataclasses.astuple(
        BackendSettings()
    )
    for key, rng in schema_ranges(Config).items():  # every default passes its own range
        if rng.choices is not None:
            assert default_of(key) in rng.choices, key


def default_of(key: str):
    section, name = key.split(".", 1)
    return getattr(getattr(Config(), section), name)


def test_a_value_outside_the_librarys_choices_is_refused_naming_them():
    with pytest.raises(
        ConfigError, match=r"sparsity.kind='dense' is not one of weight, activation, block"
    ):
        load_config(None, ["sparsity.kind=dense"])
    with pytest.raises(ConfigError, match=r"sparsity.pruning='greedy' is not one of tile_greedy, "):
        load_config(None, ["sparsity.pruning=greedy"])
    assert load_config(None, ["sparsity.kind=block"]).sparsity.kind == "block"


ENTRY_POINTS = [
    "slurm/launch.py",
    *(
        f"-m scripts.{p.stem}"
        for p in sorted((REPO / "scripts").glob("*.py"))
        if p.stem != "__init__"
    ),
]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_commands_help_answers_without_torch(entry):
    """`--help` of every command (the launcher and each `scripts/*.py`, benchmarks included) answers
    before torch is imported, as docs/training.md promises: the launcher reads runs through
    torch-free readers, and a benchmark builds its parser before its torch imports."""
    run = (
        f"runpy.run_module('{entry[3:]}', run_name='__main__')"
        if entry.startswith("-m ")
        else f"runpy.run_path('{entry}', run_name='__main__')"
    )
    code = (
        f"import runpy, sys\nsys.argv = ['{entry}', '--help']\ntry:\n    {run}\nexcept SystemExit "
        f"as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout and result.stdout.strip().splitlines()[-1] == "[]", (
        result.stdout[-500:]
    )


# The run readers (a result table, the launcher's status) read configs with non-default `sparsity`
# choices and check them against the library's rules, all without torch: on a login node they answer
# at once.
READERS_NO_TORCH = """
import shutil, sys, tempfile
from pathlib import Path
from configs import load_config
load_config(None, ["sparsity.backend=cusparselt", "sparsity.weight_grad=mvue24", "sparsity.pruning=tile_optimal"])
from reporting.table import make_table
tmp = Path(tempfile.mkdtemp())
run = Path("results/cifar10/recipe/mvue_wgrad/sparse70_decay0005_restart_mvue_s0")
assert load_config(run / "config.yaml").sparsity.backend == "cusparselt"
make_table([run], tmp / "table", plots=False)
shutil.copytree(run, tmp / "sweep" / "sparse_0.7")
from slurm.launch import main
assert main(["status", "--runs-dir", str(tmp / "sweep")]) == 0
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_tables_and_the_launchers_status_read_runs_without_torch():
    result = subprocess.run(
        [sys.executable, "-c", READERS_NO_TORCH],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout[-2000:]
