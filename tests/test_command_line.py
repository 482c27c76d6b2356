"""Command lines as people type them: options and key=value overrides in any order on every entry
point (configs/command_line.py), in-process."""

import argparse
import importlib.util
from pathlib import Path

import pytest

from configs.command_line import parse_command_line, split_overrides

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"script_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    p.add_argument("--output-dir")
    p.add_argument("--fractions", nargs="+", type=float, default=[])
    p.add_argument("--pair", nargs=2, default=[])
    p.add_argument("--flag", action="store_true")
    p.add_argument("--eval", nargs="*", default=[])
    p.add_argument("overrides", nargs="*")
    return p


def test_train_takes_options_after_overrides():
    import train

    args = train.parse_args(
        ["--config", "configs/cifar10.yaml", "train.seed=1", "--output-dir", "D", "optim.epochs=2"]
    )
    assert (args.config, args.output_dir) == (Path("configs/cifar10.yaml"), Path("D"))
    assert args.overrides == [
        "train.seed=1",
        "optim.epochs=2",
    ]  # in the order typed: the last one wins
    assert train.parse_args(["a.b=1", "--output-dir", "D"]).overrides == ["a.b=1"]
    with pytest.raises(SystemExit):  # a misspelt option is still refused
        train.parse_args(["a.b=1", "--outptu-dir", "D"])


def test_eval_linear_takes_options_after_overrides():
    import eval_linear

    args = eval_linear.parse_args(["solver=torch", "--run", "R", "mode=knn", "--config", "E.yaml"])
    assert (args.run, args.config, args.overrides) == (
        Path("R"),
        Path("E.yaml"),
        ["solver=torch", "mode=knn"],
    )


def test_an_option_keeps_its_own_values_and_lists_end_at_an_override():
    p = _parser()
    others, overrides = split_overrides(
        p,
        [
            "--config=x=y",
            "--output-dir",
            "a=b",
            "--fractions",
            "0",
            "0.5",
            "k=1",
            "--pair",
            "u=1",
            "v=2",
            "m=2",
            "--flag",
            "n=3",
        ],
    )
    assert overrides == ["k=1", "m=2", "n=3"]
    assert others == [
        "--config=x=y",
        "--output-dir",
        "a=b",
        "--fractions",
        "0",
        "0.5",
        "--pair",
        "u=1",
        "v=2",
        "--flag",
    ]
    args = parse_command_line(p, ["k=1", "--fractions", "0", "0.5", "m=2", "--output-dir", "a=b"])
    assert (args.fractions, args.output_dir, args.overrides) == ([0.0, 0.5], "a=b", ["k=1", "m=2"])
    assert (
        parse_command_line(p, ["--out", "O", "k=1"]).output_dir == "O"
    )  # an abbreviation argparse accepts
    assert parse_command_line(p, ["k=1", "--", "m=2", "x"]).overrides == ["k=1", "m=2", "x"]
    # a list option named as taking key=value collects them up to the next option (reproduce.py's
    # --eval)
    args = parse_command_line(
        p,
        ["k=1", "--eval", "solver=torch", "mode=knn", "--flag", "m=2"],
        key_value_options=["--eval"],
    )
    assert (args.eval, args.overrides, args.flag) == (
        ["solver=torch", "mode=knn"],
        ["k=1", "m=2"],
        True,
    )


def test_a_stray_word_is_still_an_override_that_the_config_refuses(tmp_path, capsys):
    import train

    assert train.parse_args(["--output-dir", "D", "typo", "a.b=1"]).overrides == ["a.b=1", "typo"]
    assert train.main(["--output-dir", str(tmp_path / "run"), "typo"]) == 2  # before any work
    assert "'typo' is not of the form key=value" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_reproduce_overrides_and_eval_overrides_in_any_order():
    reproduce = _script("reproduce")
    args = reproduce.parse_args(
        [
            "train.seed=1",
            "--dry-run",
            "optim.epochs=2",
            "--eval",
            "solver=torch",
            "mode=knn",
            "--parallel",
            "2",
            "data.root=/d",
        ]
    )
    assert args.overrides == ["train.seed=1", "optim.epochs=2", "data.root=/d"]
    assert (args.eval_overrides, args.jobs, args.dry_run) == (["solver=torch", "mode=knn"], 2, True)


def test_launcher_options_after_overrides():
    from slurm.launch import parse_args

    args = parse_args(
        [
            "data.root=/d",
            "--config",
            "configs/default.yaml",
            "--sparse-fractions",
            "0",
            "0.5",
            "train.seed=3",
            "--nodes",
            "2",
            "--slurm-arg",
            "account=abc",
        ]
    )
    assert (args.sparse_fractions, args.nodes, args.slurm_arg) == (
        [0.0, 0.5],
        2,
        [("account", "abc")],
    )
    assert args.overrides == ["data.root=/d", "train.seed=3"]


def test_make_table_takes_runs_after_options_and_writes_under_runs_by_default(
    tmp_path, monkeypatch
):
    make_table = _script("make_table")
    monkeypatch.chdir(
        tmp_path
    )  # the default output folder is relative: it must land under runs/, not results/
    assert make_table.main(["first", "--allow-missing", "--no-plots", "second"]) == 0
    table = (tmp_path / "runs" / "table" / "table.md").read_text()
    assert "first" in table and "second" in table
    assert not (tmp_path / "results").exists()
