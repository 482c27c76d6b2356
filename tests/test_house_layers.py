"""Imports point down the house: each package imports only packages below it (or itself), so that a package can be
understood, tested and reused without what sits above it. `sparsity` (the library) and `rundir` (the run
directory's rules) import nothing of the repository; the entry points sit on top."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# bottom first; a package may import those before it in this list (and itself)
HOUSE = ["sparsity", "rundir", "configs", "data", "models", "training", "evaluation", "reporting", "slurm", "scripts"]
INDEPENDENT = {"sparsity": {"rundir"}, "rundir": {"sparsity"}}  # side by side at the bottom: neither imports the other


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import of a house package in `path`, function-local ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, n.split(".")[0]) for n in names if n.split(".")[0] in HOUSE]
    return found


def violations(package: str) -> list[str]:
    allowed = set(HOUSE[: HOUSE.index(package) + 1]) - INDEPENDENT.get(package, set())
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        bad += [f"{path.relative_to(REPO)}:{line} imports {name}" for line, name in project_imports(path)
                if name not in allowed]
    return bad


@pytest.mark.parametrize("package", HOUSE)
def test_imports_point_down_the_house(package):
    assert violations(package) == []


def test_the_checker_sees_an_upward_import(tmp_path):
    upward = tmp_path / "upward.py"
    upward.write_text("def f():\n    from training.trainer import Trainer\n")
    assert project_imports(upward) == [(2, "training")]
