"""checkpoint=pixels says what it probes before its long C sweep, then a line per fit and one for
the refit (a network's features keep a line per tenth of the sweep)."""

import json
import logging
import re
import sys

from eval_test_helpers import FAST_EVAL, REPO, fast, make_folder_run

sys.path.insert(0, str(REPO))
import eval_linear  # noqa: E402

N_C = 12  # a line per tenth would skip the first fit (the first tenth of 12 fits is 2 fits)


def _sweep_lines(text: str) -> list[int]:
    return [int(k) for k in re.findall(rf"C sweep \(\w+\): (\d+)/{N_C} fits", text)]


def test_pixel_probe_says_what_it_does_and_logs_every_fit(tmp_path, caplog):
    run = make_folder_run(tmp_path, checkpoint="none")  # no model is needed for pixels
    with caplog.at_level(logging.INFO):
        assert (
            eval_linear.main(
                [
                    "--run",
                    str(run),
                    *FAST_EVAL,
                    f"linear.n_c={N_C}",
                    "checkpoint=pixels",
                    "index=none",
                ]
            )
            == 0
        )
    record = json.loads(
        (run / fast("eval_linear_pixels.json", [*FAST_EVAL, f"linear.n_c={N_C}"])).read_text()
    )
    note = (
        f"probing raw pixels: {3 * 16 * 16} features per image (3 x crop x crop), "
        f"{record['n_train']} train and "
        f"{record['n_val']} val images, {N_C} values of C then one refit, each fit up to "
        f"linear.max_iter=50 "
        "iterations"
    )
    assert note in caplog.text
    assert caplog.text.index(note) < caplog.text.index(
        f"C sweep ({record['solver']}): 1/{N_C} fits"
    )
    assert _sweep_lines(caplog.text) == list(range(1, N_C + 1))
    assert (
        f"refitting the best C {record['best_C']:.3g} on all {record['n_train']} train features"
        in caplog.text
    )


def test_a_network_probe_keeps_a_line_per_tenth(tmp_path, caplog):
    run = make_folder_run(tmp_path, checkpoint="none")
    with caplog.at_level(logging.INFO):
        assert (
            eval_linear.main(
                [
                    "--run",
                    str(run),
                    *FAST_EVAL,
                    f"linear.n_c={N_C}",
                    "checkpoint=random",
                    "index=none",
                ]
            )
            == 0
        )
    assert "probing raw pixels" not in caplog.text
    assert _sweep_lines(caplog.text) == [
        2,
        3,
        4,
        5,
        6,
        8,
        9,
        10,
        11,
        12,
    ]  # ceil(k * 1.2) for k = 1..10
