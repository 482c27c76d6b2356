"""The README's set-up block: `.ci/run --check-readme` accepts it only as the two lines CI runs.
(The docs' links, example and quoted numbers are checked in test_docs.py.)"""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI_RUN = REPO / ".ci" / "run"


def marked_block(text: str, name: str) -> str:
    match = re.search(
        rf"^<!-- {name}:begin -->\n(.*?)^<!-- {name}:end -->$", text, re.DOTALL | re.MULTILINE
    )
    assert match, f"README.md has no <!-- {name}:begin/end --> block"
    return match.group(1)


def check_readme(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CI_RUN), "--check-readme", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ci_accepts_the_readme_as_committed():
    result = check_readme(README)
    assert result.returncode == 0, result.stderr


SETUP = marked_block(README.read_text(), "setup-commands")
INSTALL, TESTS = [line for line in SETUP.splitlines() if line.startswith(("python3", ".venv"))]


@pytest.mark.parametrize(
    "change",
    [
        (
            "an extra command",
            lambda s: s.replace(TESTS, TESTS + "\nrm -rf x && .venv/bin/python -m pytest"),
        ),
        ("a prefix", lambda s: s.replace(INSTALL, "rm -rf x && " + INSTALL)),
        ("a line of another kind", lambda s: s.replace(TESTS, "export CI=false\n" + TESTS)),
        ("a changed command", lambda s: s.replace(TESTS, TESTS + " -x")),
        ("a missing command", lambda s: s.replace(TESTS + "\n", "")),
        (
            "a second block",
            lambda s: (
                s + "\n<!-- setup-commands:begin -->\n```bash\nrm -rf x\n```\n"
                "<!-- setup-commands:end -->\n"
            ),
        ),
        ("no fence", lambda s: s.replace("```bash\n" + INSTALL, INSTALL)),
    ],
    ids=lambda change: change[0],
)
def test_ci_refuses_anything_but_the_two_lines(tmp_path, change):
    _, edit = change
    text = README.read_text()
    changed = text.replace(SETUP, edit(SETUP))
    assert changed != text
    copy = tmp_path / "README.md"
    copy.write_text(changed)
    result = check_readme(copy)
    assert result.returncode != 0, (
        f"accepted a README with {change[0]}:\n{marked_block(changed, 'setup-commands')}"
    )
    assert "setup-commands" in result.stderr
