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


def table_rows(text: str) -> dict[str, list[str]]:
    """Markdown table rows of `text` keyed by their first cell: the schedule."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 3 and not set(cells[0]) <= set("-"):
            rows.setdefault(cells[0], cells)
    return rows


def test_quoted_digits_numbers_are_the_committed_tables_and_say_they_are_one_machines():
    """The README quotes the digits results in two places (the set-up's "what to expect" and the results section);
    both must be the committed results/default/table.md, and the first must say that another machine gives other
    numbers inside the interval it quotes (CPU runs are not bit-identical across machines)."""
    text = README.read_text()
    committed = (REPO / "results" / "default" / "table.md").read_text()
    table = table_rows(committed[:committed.index("## Runs")])  # the schedules' table, not the per-run one
    readme_table = table_rows(text[text.index("The committed `results/default/`"):])
    schedules = [name for name in table if "sparse" in name or name.startswith("*")]
    assert len(schedules) == 9, schedules
    for name in schedules:
        # table.md: schedule, seed, steps, linear, delta, k-NN; README: schedule, steps, linear, delta, k-NN.
        assert readme_table[name][1:5] == [table[name][2], *table[name][3:6]], name

    expect = re.search(r"linear-probe top-1 ([\d.]+)% and k-NN \(k=20\)\s+([\d.]+)% for the 70% schedule "
                       r"\(([\d.]+)% and ([\d.]+)% dense\), above the untrained network \(([\d.]+)% and ([\d.]+)%",
                       text)
    assert expect, "the set-up's expected numbers are not where this test looks for them"
    linear70, knn70, linear0, knn0, linear_random, knn_random = expect.groups()
    assert (linear70, knn70) == (table["70% sparse"][3], table["70% sparse"][5])
    assert (linear0, knn0) == (table["0% sparse (dense baseline)"][3], table["0% sparse (dense baseline)"][5])
    assert (linear_random, knn_random) == (table["*random-init network*"][3], table["*random-init network*"][5])
    paragraph = text[expect.start():text.index("\n\n", expect.start())]
    assert "not bit-identical across" in paragraph and "machines" in paragraph
    low, high = map(float, re.search(r"\(([\d.]+)-([\d.]+)% around the dense run", paragraph).groups())
    other = re.search(r"e\.g\. ([\d.]+)% / [\d.]+% for the 70% schedule on another", paragraph)
    assert other and low <= float(other.group(1)) <= high, "the other machine's number must lie inside the interval"
