"""The repository passes `ruff check` with the rules of pyproject.toml ([tool.ruff.lint]: unused or
undefined names, pycodestyle's errors and warnings, lines within the project's length, today's type
hints, import order) and `ruff format --check`, and both fail where they should."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ruff", reason="ruff comes with the test extras: pip install -e '.[test]'")

REPO = Path(__file__).resolve().parents[1]


def ruff(*arguments: str, paths: tuple[Path, ...]) -> subprocess.CompletedProcess:
    """`ruff <arguments> <paths>` with the repository's pyproject.toml, no cache."""
    command = [sys.executable, "-m", "ruff", *arguments, "--no-cache"]
    command += ["--config", str(REPO / "pyproject.toml"), *map(str, paths)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True)


def ruff_check(*paths: Path) -> subprocess.CompletedProcess:
    return ruff("check", paths=paths)


def ruff_format_check(*paths: Path) -> subprocess.CompletedProcess:
    return ruff("format", "--check", paths=paths)


def test_the_repository_passes_ruff_check():
    done = ruff_check(REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_repository_is_formatted():
    done = ruff_format_check(REPO)
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout + done.stderr


def test_the_format_check_finds_an_unformatted_file(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("x = [1,2]\n")
    done = ruff_format_check(planted)
    assert done.returncode == 1 and "planted.py" in done.stdout


def test_the_check_finds_an_unused_import_and_an_overlong_line(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import os\nfrom typing import Optional\n\nx: Optional[int] = None\ny = '"
        + "a" * 130
        + "'\n"
    )
    done = ruff_check(planted)
    assert done.returncode == 1
    assert "F401" in done.stdout and "E501" in done.stdout and "UP045" in done.stdout


def test_the_check_finds_imports_out_of_order(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import sys\nimport os\n\nprint(os, sys)\n")
    done = ruff_check(planted)
    assert done.returncode == 1 and "I001" in done.stdout
