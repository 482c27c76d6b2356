"""What could fail after the whole extraction and probe fails before any work, in one line: an
`output=` name its file system cannot hold (refused by the target check); and a full disk while the
feature cache is written is one line (exit 1), like training's."""

import errno

from eval_test_helpers import FAST_EVAL, make_folder_run

import eval_linear
from evaluation import evaluate


def test_an_output_name_too_long_is_refused_before_any_feature(tmp_path, caplog):
    run = make_folder_run(tmp_path)
    assert (
        eval_linear.main(["--run", str(run), *FAST_EVAL, f"output={tmp_path / ('x' * 300)}.json"])
        == 1
    )
    assert (
        "with the temporary name it is written under is" in caplog.text
        and caplog.text.count("\n") == 1
    )
    assert not (run / "eval").exists()  # nothing extracted, nothing cached


def test_a_full_disk_under_the_feature_cache_is_one_line(tmp_path, caplog, monkeypatch, capsys):
    run = make_folder_run(tmp_path)

    def full(path, key, feats):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(evaluate, "save_cached", full)
    assert eval_linear.main(["--run", str(run), *FAST_EVAL]) == 1
    assert "no space left on the device of" in caplog.text and "features_train.pt" in caplog.text
    assert "Traceback" not in capsys.readouterr().err and not (run / "eval_linear.json").exists()
