"""The committed results speak of the project, not of the machine they were made on: no absolute
path of a machine (a run directory under /tmp, a home folder, a checkout) in any text file under
results/."""

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
TEXT_SUFFIXES = {".md", ".csv", ".json", ".jsonl", ".yaml", ".txt", ".log"}
# a path starting at a machine's root folder: /tmp/..., /home/..., /root/..., /work/..., /Users/...,
# ...
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])/(?:tmp|home|root|work|Users|mnt|scratch|private|var|opt)/[\w.-]"
)


def machine_paths(text: str) -> list[str]:
    return [text[max(m.start() - 20, 0) : m.end() + 30] for m in MACHINE_PATH.finditer(text)]


def test_the_pattern_finds_machine_paths_and_leaves_others():
    assert machine_paths('"path": "/work/runs_default2/sparse_0.00"') and machine_paths(
        "saved /tmp/runs/a.pt"
    )
    assert machine_paths("data.root: /home/me/cifar10") and machine_paths("(/root/out/r/x.json)")
    for fine in (
        "runs/ablation_1/dense_s0",
        "data.root=/datasets/imagenet",
        "a/tmp/b",
        "0.5/tmp",
        "see ~/tmp/x",
    ):
        assert not machine_paths(fine), fine


def test_no_committed_result_holds_a_machine_path():
    found = {}
    for path in sorted(RESULTS.rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            hits = machine_paths(path.read_text(errors="replace"))
            if hits:
                found[str(path.relative_to(RESULTS))] = hits[:2]
    assert not found, f"absolute paths of a machine in results/: {found}"


# words of the tools a result was made with, or of the project's tracker, which a user cannot follow
TOOL_WORDS = re.compile(
    r"nvidia-h[12]00(-x\d)?|budget_left|device (budget|call)|\bissue \d+|\bissues? #\d+", re.I
)


def test_the_pattern_finds_tool_words_and_leaves_others():
    for bad in (
        "`nvidia-h100-x1`",
        "661 s of device budget",
        "budget_left_s 1800",
        "quoted from issue 10",
        "Device calls this session",
        "see issue #12",
    ):
        assert TOOL_WORDS.search(bad), bad
    for fine in (
        "one NVIDIA H100 80GB HBM3",
        "a GPU issue",
        "ten minutes of GPU time",
        "one cuBLASLt call",
    ):
        assert not TOOL_WORDS.search(fine), fine


def test_readme_docs_and_notes_speak_to_users():
    docs = [
        RESULTS.parent / "README.md",
        *sorted((RESULTS.parent / "docs").glob("*.md")),
        *sorted(RESULTS.rglob("*.md")),
    ]
    found = {
        str(p.relative_to(RESULTS.parent)): [m.group(0) for m in TOOL_WORDS.finditer(p.read_text())]
        for p in docs
    }
    assert not {k: v for k, v in found.items() if v}, found


def test_readme_and_docs_hold_no_machine_path():
    pages = [RESULTS.parent / "README.md", *sorted((RESULTS.parent / "docs").glob("*.md"))]
    found = {p.name: machine_paths(p.read_text()) for p in pages}
    assert not {k: v for k, v in found.items() if v}, f"absolute paths of a machine: {found}"
