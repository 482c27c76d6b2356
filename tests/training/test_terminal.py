"""Progress of long work: tqdm only on a terminal; elsewhere plain lines at each tenth (or the
chosen share), one line for a jump over several shares, a closing line when the last one was not
told, nothing when disabled."""

import pytest

import training.terminal as terminal
from training.terminal import Progress, track


def test_off_a_terminal_a_plain_line_per_tenth_and_no_bar(capsys):
    lines = []
    with Progress(100, "features", "batches", say=lines.append) as progress:
        for _ in range(100):
            progress.update()
    assert len(lines) == 10
    assert lines[0].startswith("features: 10/100 batches (10%), ") and lines[0].endswith(" s")
    assert lines[-1].startswith("features: 100/100 batches (100%)")
    err = capsys.readouterr().err
    assert err == ""  # told through `say` only: no bar, no carriage return


def test_a_jump_over_several_tenths_is_one_line_and_the_end_is_told_once():
    lines = []
    progress = Progress(100, "x", say=lines.append)
    progress.update(55)  # past 10..50%: one line
    assert lines == [lines[0]] and lines[0].startswith("x: 55/100 it (55%)")
    progress.update(3)  # 58%: the next line is due at 60%
    assert len(lines) == 1
    progress.update(2)
    assert len(lines) == 2 and lines[1].startswith("x: 60/100 it (60%)")
    progress.update(7)
    progress.close()  # 67 was not told yet
    assert len(lines) == 3 and lines[2].startswith("x: 67/100 it (67%)")


def test_odd_totals_and_a_share_per_item():
    lines = []
    for _ in track(range(7), "runs", "runs done", every=1 / 7, say=lines.append):
        pass
    expected = [f"runs: {i}/7 runs done ({100 * i / 7:.0f}%)" for i in range(1, 8)]
    assert [line.split(",")[0] for line in lines] == expected
    lines.clear()
    for _ in track(range(3), "three", say=lines.append):  # fewer items than tenths: a line per item
        pass
    assert [line.split(" (")[0] for line in lines] == [
        "three: 1/3 it",
        "three: 2/3 it",
        "three: 3/3 it",
    ]


def test_unknown_total_says_the_count_at_the_end():
    lines = []
    assert list(track((i for i in range(5)), "gen", "images", say=lines.append)) == [0, 1, 2, 3, 4]
    assert len(lines) == 1 and lines[0].startswith("gen: 5 images, ")


def test_disabled_and_empty_say_nothing():
    lines = []
    assert list(track([1, 2], "off", enabled=False, say=lines.append)) == [1, 2]
    assert list(track([], "empty", say=lines.append)) == []
    assert lines == []


def test_on_a_terminal_a_tqdm_bar_and_no_lines(monkeypatch, capsys):
    monkeypatch.setattr(terminal, "on_terminal", lambda: True)
    lines = []
    assert list(track(range(20), "bar", "img", say=lines.append)) == list(range(20))
    assert lines == []
    err = capsys.readouterr().err
    assert "bar: 100%" in err and "20/20" in err and "\r" in err  # tqdm's redrawn bar


@pytest.mark.parametrize("every", [0, -0.1, 1.5])
def test_a_share_outside_0_1_is_refused(every):
    with pytest.raises(ValueError, match="every must be in"):
        Progress(10, "x", every=every)
