"""Imports point down the house: each package imports only packages below it (or itself), so that a
package can be understood, tested and reused without what sits above it. `sparsity` (the library)
and `rundir` (the run directory's rules) import nothing of the repository; the entry points sit on
top."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# bottom first; a package may import those before it in this list (and itself)
HOUSE = [
    "sparsity",
    "rundir",
    "configs",
    "data",
    "models",
    "training",
    "evaluation",
    "reporting",
    "slurm",
    "scripts",
]
INDEPENDENT = {
    "sparsity": {"rundir"},
    "rundir": {"sparsity"},
}  # side by side at the bottom: neither imports the other


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import of a house package in `path`,
    function-local ones too."""
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
        bad += [
            f"{path.relative_to(REPO)}:{line} imports {name}"
            for line, name in project_imports(path)
            if name not in allowed
        ]
    return bad


@pytest.mark.parametrize("package", HOUSE)
def test_imports_point_down_the_house(package):
    assert violations(package) == []


def test_the_checker_sees_an_upward_import(tmp_path):
    upward = tmp_path / "upward.py"
    upward.write_text("def f():\n    from training.trainer import Trainer\n")
    assert project_imports(upward) == [(2, "training")]


# Within the house, modules import each other without cycles either (function-local imports
# included): a cycle makes two modules one, which neither can be read, tested or changed without.
def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, root: Path = REPO) -> set[str]:
    """The house modules `path` imports (absolute and relative, at any depth of the file), as dotted
    names; an import of a name from a package counts as the submodule where one of that name
    exists."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([base] if base else [])])
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for name in candidates:
            if name.split(".")[0] in HOUSE and _module_path(name, root) is not None:
                found.add(name)
                break
    return found - {me}


def _module_path(name: str, root: Path):
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def import_cycles(root: Path = REPO, packages=HOUSE) -> list[list[str]]:
    """Every cycle of module imports among the packages' modules (one list of modules per cycle
    found)."""
    graph = {
        module_name(p, root): module_imports(p, root)
        for pkg in packages
        for p in sorted((root / pkg).rglob("*.py"))
    }
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_modules_import_each_other_without_cycles():
    cycles = import_cycles()
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_cycle_through_a_function_local_import(tmp_path):
    (tmp_path / "reporting").mkdir()
    (tmp_path / "reporting" / "__init__.py").write_text("")
    (tmp_path / "reporting" / "a.py").write_text("from .b import B\nA = 1\n")
    (tmp_path / "reporting" / "b.py").write_text(
        "B = 2\n\n\ndef f():\n    from reporting.a import A\n    return A\n"
    )
    assert import_cycles(tmp_path, ["reporting"]) == [["reporting.a", "reporting.b", "reporting.a"]]
    (tmp_path / "reporting" / "b.py").write_text("B = 2\n")
    assert import_cycles(tmp_path, ["reporting"]) == []
