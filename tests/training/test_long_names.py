"""Names too long for the file system are refused before any work, checked with the name that will
really be written (a temporary name beside the file, longer by `TMP_NAME_EXTRA`): a 4,286-character
--output-dir was a traceback, a 255-character output= failed only after the probe (its result
lost)."""

import subprocess
import sys

from rundir.atomic import TMP_NAME_EXTRA, name_problem
from rundir.errors import RunDirProblem
from rundir.guard import resolve_run_dir

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_the_name_is_checked_with_its_temporary_name(tmp_path):
    assert name_problem(tmp_path / ("a" * (255 - TMP_NAME_EXTRA))) == ""
    problem = name_problem(tmp_path / ("a" * (256 - TMP_NAME_EXTRA)))
    assert "with the temporary name it is written under is 256 bytes, over the 255" in problem
    assert "the folder name" in name_problem(tmp_path / ("b" * 256) / "x.json")
    deep = tmp_path.joinpath(*["c" * 200] * 21) / "x.json"
    assert "the path is" in name_problem(deep) and "over the 4096" in name_problem(deep)
    multibyte = tmp_path / ("é" * 100 + "a" * (56 - TMP_NAME_EXTRA))  # bytes count, not characters
    assert len("é".encode()) == 2 and "is 256 bytes" in name_problem(multibyte)


def test_a_run_directory_too_long_for_its_files_is_one_line(tmp_path):
    deep = tmp_path.joinpath(*["d" * 200] * 21)
    try:
        resolve_run_dir(deep)
        raise AssertionError("not refused")
    except RunDirProblem as e:
        assert "too long for the files a run writes inside it" in str(e) and len(str(e)) < 400
    result = subprocess.run(
        [sys.executable, "train.py", "--output-dir", str(deep), "train.max_steps=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "too long for the files a run writes inside it" in result.stderr
    assert not tmp_path.joinpath("d" * 200).exists()


def test_an_output_name_too_long_is_refused_before_the_probe(tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "evaluation"))
    from eval_test_helpers import FAST_EVAL, make_run_dir

    sys.path.insert(0, str(REPO))
    import eval_linear

    run = make_run_dir(tmp_path / "runs" / "tiny")
    out = tmp_path / (
        "r" * 250 + ".json"
    )  # 255 bytes: a legal name, whose temporary sibling is not
    assert (
        eval_linear.main(["--run", str(run), *FAST_EVAL, f"output={out}"]) == 1
    )  # as any bad output=
    assert not list(run.glob("eval_linear*.json")) and not (run / "eval").exists()
