"""The README's code that users copy: its "use in your own model" snippet runs as written, in a fresh interpreter
(where nothing of ours has run before it), and `.ci/run --check-readme` accepts the set-up block only as the two lines
CI runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI_RUN = REPO / ".ci" / "run"


def marked_block(text: str, name: str) -> str:
    match = re.search(rf"^<!-- {name}:begin -->\n(.*?)^<!-- {name}:end -->$", text, re.S | re.M)
    assert match, f"README.md has no <!-- {name}:begin/end --> block"
    return match.group(1)


def test_own_model_snippet_runs_as_written(tmp_path):
    block = marked_block(README.read_text(), "own-model-snippet")
    code = re.fullmatch(r"```python\n(.*?)```\n", block, re.S)
    assert code, "the own-model-snippet block must be a single ```python fence"
    # A fresh interpreter outside the repository, so only the installed package is importable (as for a user), and
    # without the TRITON_INTERPRET this test session sets.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code.group(1)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def check_readme(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CI_RUN), "--check-readme", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_ci_accepts_the_readme_as_committed():
    result = check_readme(README)
    assert result.returncode == 0, result.stderr


SETUP = marked_block(README.read_text(), "setup-commands")
INSTALL, TESTS = [line for line in SETUP.splitlines() if line.startswith(("python3", ".venv"))]


@pytest.mark.parametrize("change", [
    ("an extra command", lambda s: s.replace(TESTS, TESTS + "\nrm -rf x && .venv/bin/python -m pytest")),
    ("a prefix", lambda s: s.replace(INSTALL, "rm -rf x && " + INSTALL)),
    ("a line of another kind", lambda s: s.replace(TESTS, "export CI=false\n" + TESTS)),
    ("a changed command", lambda s: s.replace(TESTS, TESTS + " -x")),
    ("a missing command", lambda s: s.replace(TESTS + "\n", "")),
    ("a second block", lambda s: s + "\n<!-- setup-commands:begin -->\n```bash\nrm -rf x\n```\n"
                                      "<!-- setup-commands:end -->\n"),
    ("no fence", lambda s: s.replace("```bash\n" + INSTALL, INSTALL)),
], ids=lambda change: change[0])
def test_ci_refuses_anything_but_the_two_lines(tmp_path, change):
    _, edit = change
    text = README.read_text()
    changed = text.replace(SETUP, edit(SETUP))
    assert changed != text
    copy = tmp_path / "README.md"
    copy.write_text(changed)
    result = check_readme(copy)
    assert result.returncode != 0, f"accepted a README with {change[0]}:\n{marked_block(changed, 'setup-commands')}"
    assert "setup-commands" in result.stderr
