"""Text the locale cannot encode: run files are UTF-8 whatever LC_ALL says, a path's undecodable
byte is written escaped instead of losing the line, and a config value holding such bytes is one
line, not a YAML traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs import ConfigError, load_config
from rundir.atomic import atomic_write_text
from rundir.metrics import open_append

REPO = Path(__file__).resolve().parents[2]
UNDECODABLE = os.fsdecode(
    b"/data/\xfeimages"
)  # as Python hands a non-UTF-8 argument over: a lone surrogate


def test_a_config_value_with_undecodable_bytes_is_a_config_error():
    with pytest.raises(
        ConfigError, match="the value of data.root holds bytes that are not UTF-8 text"
    ):
        load_config(None, [f"data.root={UNDECODABLE}"])


def test_run_files_are_utf8_and_escape_what_is_not_text(tmp_path):
    with open_append(tmp_path / "log.txt") as f:  # the log keeps a path's own bytes
        f.write(f"run rün at {UNDECODABLE}\n")
    assert (tmp_path / "log.txt").read_bytes() == "run rün at ".encode() + b"/data/\xfeimages\n"
    atomic_write_text(
        tmp_path / "table.md", f"| rün | {UNDECODABLE} |\n"
    )  # records stay UTF-8 text
    assert (tmp_path / "table.md").read_bytes().decode("utf-8") == "| rün | /data/\\udcfeimages |\n"


def test_a_non_ascii_run_directory_under_the_c_locale_logs_every_line(tmp_path):
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    run = tmp_path / "rün"
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--output-dir",
            str(run),
            "train.max_steps=1",
            "optim.epochs=1",
            "train.epoch_length=2",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert b"Logging error" not in result.stderr
    assert "rün".encode() in (run / "log.txt").read_bytes()
