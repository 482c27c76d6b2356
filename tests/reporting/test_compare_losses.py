"""scripts/compare_losses.py / reporting.compare on hand-written metrics, with the numbers worked
out by hand."""

import json
import lzma
import subprocess
import sys

import pytest
from reporting_runs import REPO

from configs import ConfigError, load_config, to_yaml
from reporting.compare import compare_runs, setting_changes, smoothed
from reporting.compare_plot import plot_comparison


def write_run(path, losses, steps=None, extra=None, overrides=("train.seed=0",)):
    """metrics.jsonl (format 2: `step` = steps done) with the total loss per logged step, and
    `extra` terms; the config.yaml train.py would write for `overrides`."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(to_yaml(load_config(overrides=list(overrides))))
    steps = steps or list(range(1, len(losses) + 1))
    lines = []
    for i, (step, loss) in enumerate(zip(steps, losses)):
        record = {"format": 2, "step": step, "loss": loss, "lr": 1e-3}
        record.update({k: v[i] for k, v in (extra or {}).items()})
        lines.append(json.dumps(record))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_trailing_moving_average_by_hand():
    assert smoothed([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert smoothed([1.0, 2.0, 3.0], 1) == [1.0, 2.0, 3.0]
    assert smoothed([2.0, 4.0], 5) == [2.0, 3.0]


def test_difference_spread_and_verdict_by_hand(tmp_path):
    base = write_run(
        tmp_path / "base", [4.0, 3.0, 2.0, 1.0], extra={"ibot_loss": [1.0, 1.0, 1.0, 1.0]}
    )
    cand = write_run(
        tmp_path / "cand", [4.1, 3.1, 1.9, 0.9], extra={"ibot_loss": [1.0, 1.0, 1.5, 1.5]}
    )
    seed = write_run(
        tmp_path / "seed", [4.3, 2.7, 2.3, 1.3], extra={"ibot_loss": [1.1, 0.9, 1.1, 0.9]}
    )
    total, ibot = compare_runs(cand, base, seed, window=1)  # the total first
    assert (total.term, total.steps) == ("loss", 4)
    assert total.difference == pytest.approx(0.1) and total.max_difference == pytest.approx(0.1)
    assert total.spread == pytest.approx(0.3) and total.within_spread is True
    assert (
        ibot.term == "ibot_loss"
        and ibot.difference == pytest.approx(0.25)
        and ibot.spread == pytest.approx(0.1)
    )
    assert ibot.within_spread is False
    # smoothed over 2 points, the seed's alternating +-0.1 on ibot cancels after the first point:
    # spread 0.1 -> 0.025
    ibot2 = compare_runs(cand, base, seed, window=2)[1]
    assert ibot2.spread == pytest.approx((0.1 + 0 + 0 + 0) / 4)
    assert ibot2.difference == pytest.approx((0 + 0 + 0.25 + 0.5) / 4)


def test_only_steps_every_run_logged_count_and_non_finite_values_are_left_out(tmp_path):
    base = write_run(tmp_path / "base", [5.0, 4.0, 3.0, 2.0])
    cand = write_run(tmp_path / "cand", [4.5, 2.5], steps=[2, 4])
    nan_run = write_run(tmp_path / "nan", [5.0, float("nan"), 3.0, 2.0])
    (c,) = compare_runs(cand, base, window=1)
    assert c.steps == 2 and c.difference == pytest.approx((0.5 + 0.5) / 2) and c.spread is None
    (n,) = compare_runs(nan_run, base, window=1)
    assert n.steps == 3 and n.difference == 0.0  # step 2's NaN is not a difference of 0 or of nan


def test_runs_that_share_no_step_are_refused(tmp_path):
    base = write_run(tmp_path / "base", [5.0, 4.0])
    cand = write_run(tmp_path / "cand", [4.5, 2.5], steps=[7, 9])
    with pytest.raises(ValueError, match="share no logged step"):
        compare_runs(cand, base)
    with pytest.raises(ValueError, match="window must be >= 1"):
        compare_runs(base, base, window=0)


def test_settings_compared_and_refused_from_the_configs(tmp_path):
    base = write_run(tmp_path / "base", [1.0], overrides=["train.seed=0", "train.log_period=5"])
    amp = write_run(tmp_path / "amp", [1.0], overrides=["train.seed=0", "train.residual_dtype=amp"])
    seed = write_run(tmp_path / "seed", [1.0], overrides=["train.seed=1", "train.num_workers=1"])
    amp_seed = write_run(
        tmp_path / "amp_seed", [1.0], overrides=["train.seed=1", "train.residual_dtype=amp"]
    )
    # log_period and num_workers say how a run executes: not a change of setting
    assert setting_changes(amp, base, seed) == (["train.residual_dtype: 'fp32' -> 'amp'"], [])
    assert setting_changes(base, base) == ([], [])
    _, problems = setting_changes(amp_seed, base, amp_seed)
    assert problems == [
        "the candidate does not start from the baseline's state: train.seed: 0 -> 1",
        "the spread run differs from the baseline in more than train.seed: "
        "train.residual_dtype: 'fp32' -> 'amp'",
    ]
    assert setting_changes(amp, base, amp)[1][-1] == (
        "the spread run has the baseline's train.seed: it measures no seed-to-seed spread"
    )
    (seed / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="config file not found"):
        setting_changes(amp, base, seed)


def test_cli_exit_codes_and_json(tmp_path):
    base = write_run(tmp_path / "base", [4.0, 3.0, 2.0, 1.0])
    near = write_run(
        tmp_path / "near",
        [4.05, 3.05, 2.05, 1.05],
        overrides=["train.seed=0", "train.residual_dtype=amp"],
    )
    far = write_run(tmp_path / "far", [5.0, 4.0, 3.0, 2.0])
    seed = write_run(tmp_path / "seed", [4.2, 3.2, 2.2, 1.2], overrides=["train.seed=1"])

    def cli(*args):
        return subprocess.run(
            [sys.executable, str(REPO / "scripts" / "compare_losses.py"), *map(str, args)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )

    ok = cli(near, base, "--spread", seed, "--window", "1", "--out", tmp_path / "c.json")
    assert ok.returncode == 0 and "within" in ok.stdout, ok.stderr
    assert ok.stdout.startswith("compared: train.residual_dtype: 'fp32' -> 'amp'\n")
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["changed"] == ["train.residual_dtype: 'fp32' -> 'amp'"]
    assert (
        saved["terms"][0]["difference"] == pytest.approx(0.05)
        and saved["terms"][0]["within_spread"] is True
    )
    outside = cli(far, base, "--spread", seed)
    assert outside.returncode == 1 and "OUTSIDE" in outside.stdout
    missing = cli(tmp_path / "nothing", base)
    assert missing.returncode == 2 and "no metrics.jsonl" in missing.stderr
    # a committed run keeps its metrics as .xz: compared as the plain file is
    packed = write_run(
        tmp_path / "packed",
        [4.05, 3.05, 2.05, 1.05],
        overrides=["train.seed=0", "train.residual_dtype=amp"],
    )
    plain = packed / "metrics.jsonl"
    (packed / "metrics.jsonl.xz").write_bytes(lzma.compress(plain.read_bytes()))
    plain.unlink()
    compared = [cli(run, base, "--spread", seed, "--window", "1") for run in (packed, near)]
    assert compared[0].returncode == 0 and compared[0].stdout == compared[1].stdout, compared[
        0
    ].stderr
    not_a_spread = cli(near, base, "--spread", far)
    assert not_a_spread.returncode == 2 and "measures no seed-to-seed spread" in not_a_spread.stderr
    (far / "config.yaml").write_text("train: [unclosed")
    unreadable = cli(far, base)
    assert unreadable.returncode == 2 and "cannot compare the runs' settings" in unreadable.stderr


def test_plot_draws_every_run_and_more_seeds_need_it(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import compare_losses
    finally:
        sys.path.remove(str(REPO / "scripts"))
    import matplotlib.image

    extra = {"koleo_loss": [0.1, 0.1, 0.1, 0.1]}
    base = write_run(tmp_path / "base", [4.0, 3.0, 2.0, 1.0], extra=extra)
    cand = write_run(tmp_path / "cand", [4.1, 3.1, 2.1, 1.1], extra=extra)
    seeds = [
        write_run(
            tmp_path / f"seed{s}", [4.2, 3.2, 2.2, 1.2], extra=extra, overrides=[f"train.seed={s}"]
        )
        for s in (1, 2)
    ]
    png = tmp_path / "cmp.png"
    assert (
        compare_losses.main(
            [
                str(cand),
                str(base),
                "--spread",
                str(seeds[0]),
                "--more-seeds",
                str(seeds[1]),
                "--window",
                "1",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    assert f"wrote {png}" in capsys.readouterr().out
    assert matplotlib.image.imread(png).ndim == 3
    # the terms every run logs, the total first; a term one run lacks is not drawn
    (seeds[1] / "metrics.jsonl").write_text(
        (base / "metrics.jsonl").read_text().replace('"koleo_loss"', '"other"')
    )
    assert plot_comparison(cand, base, seeds[:1], 1, png) == ["loss", "koleo_loss"]
    assert plot_comparison(cand, base, seeds, 1, png) == ["loss"]
    with pytest.raises(SystemExit):  # drawn only: without --plot it would be silently ignored
        compare_losses.main([str(cand), str(base), "--more-seeds", str(seeds[1])])
    assert "--more-seeds is only drawn" in capsys.readouterr().err
