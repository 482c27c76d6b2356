"""Every field of the training and the evaluation schema, given a value outside its declared range
(and every float NaN and inf), and the malformed configs and output directories of a hostile user:
each is exit 2 with one line that names the key or the file, never a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

import eval_linear
import train
from configs.eval_schema import EvalConfig
from configs.fields import Range, schema_ranges
from configs.schema import Config

REPO = Path(__file__).resolve().parents[1]


def bad_values(rng: Range, is_int: bool) -> list:
    """Values just outside `rng` (as dotlist text)."""
    step = 1 if is_int else 0.5
    if rng.choices is not None:
        return ["not_a_choice"]
    if rng.pair:
        lo = rng.gt if rng.gt is not None else (rng.ge if rng.ge is not None else 0)
        hi = rng.le if rng.le is not None else (rng.lt if rng.lt is not None else lo + 2)
        return [
            f"[{hi},{lo + (hi - lo) / 4}]",
            f"[{lo - step},{hi}]",
            "[0.5]",
        ]  # reversed, below, one number
    if rng.nonempty:
        return ["[]", f"[{(rng.ge or 1) - 1}]"]
    out = []
    if rng.gt is not None:
        out.append(rng.gt)
    if rng.ge is not None:
        out.append(rng.ge - step)
    if rng.lt is not None:
        out.append(rng.lt)
    if rng.le is not None:
        out.append(rng.le + step)
    if not is_int:
        out += ["nan", "inf", "-inf"]
    return [str(int(v)) if is_int and not isinstance(v, str) else str(v) for v in out]


def cases(schema) -> list:
    import dataclasses
    import typing

    def field_type(key):
        node = schema
        for part in key.split("."):
            f = {f.name: f for f in dataclasses.fields(node)}[part]
            node = f.default_factory if dataclasses.is_dataclass(f.default_factory) else f.type
        return node

    out = []
    for key, rng in schema_ranges(schema).items():
        typ = field_type(key)
        is_int = typ in (int, "int") or typing.get_args(typ) == (int,) or str(typ) == "List[int]"
        out += [(key, v) for v in bad_values(rng, is_int)]
    return out


TRAIN_CASES = cases(Config)
EVAL_CASES = cases(EvalConfig)


def test_every_field_has_a_range_or_is_free_text_or_a_flag():
    import dataclasses

    def leaves(schema, prefix=""):
        for f in dataclasses.fields(schema):
            if dataclasses.is_dataclass(f.default_factory):
                yield from leaves(f.default_factory, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}", f.type

    for schema in (Config, EvalConfig):
        ranged = schema_ranges(schema)
        unranged = [
            k for k, t in leaves(schema) if k not in ranged and t not in (bool, "bool", str, "str")
        ]
        assert unranged == [], unranged
    assert len(TRAIN_CASES) > 100 and len(EVAL_CASES) > 25


@pytest.mark.parametrize("key,value", TRAIN_CASES, ids=[f"{k}={v}" for k, v in TRAIN_CASES])
def test_train_refuses_an_out_of_range_value_naming_the_key(key, value, capsys):
    assert train.main([f"{key}={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and key in err and "Traceback" not in err, err


@pytest.mark.parametrize("key,value", EVAL_CASES, ids=[f"{k}={v}" for k, v in EVAL_CASES])
def test_eval_refuses_an_out_of_range_value_naming_the_key(key, value, capsys, tmp_path):
    assert eval_linear.main(["--run", str(tmp_path), f"{key}={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and key in err, err


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["optim.warmup_epochs=200"], "optim.warmup_epochs=200 must be <= optim.epochs"),
        (["dino.loss_weight=0", "ibot.loss_weight=0"], "nothing to train"),
        (["crops.global_crops_scale=[1.0,0.2]"], "crops.global_crops_scale"),
        (["dino.head_n_prototypes=0"], "dino.head_n_prototypes=0 is out of range"),
        (["optim.clip_grad=0"], "optim.clip_grad=0"),
        (["train.max_to_keep=0"], "train.max_to_keep=0"),
        (["teacher.momentum_teacher=1.5"], "teacher.momentum_teacher=1.5"),
        (["optim.base_lr=nan"], "optim.base_lr=nan"),
        (["student.patch_size=0"], "student.patch_size=0"),
        (
            ["crops.local_crops_size=10", "student.patch_size=8"],
            "must be a multiple of student.patch_size",
        ),
    ],
)
def test_meaningless_combinations(overrides, message, capsys):
    assert train.main(overrides) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0, err


@pytest.mark.parametrize(
    "text,message",
    [
        ("train:\n  seed: [1\n", "not a valid YAML config"),
        ("train:\n  seed: 1\n  seed: 2\n", "duplicate key seed"),
        ("train: 5\n", "'train' is a section"),
        ("- a\n- b\n", "a config is a mapping of sections"),
        ("trian:\n  seed: 1\n", "unknown config key 'trian'"),
    ],
)
def test_malformed_config_files(text, message, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert train.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and str(path) in err and err.count("\n") == 0, err


def test_an_output_dir_that_is_a_file_or_read_only(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert train.main(["--output-dir", str(blocker)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    readonly = tmp_path / "ro"
    readonly.mkdir()
    # a read-only bind of a real directory is what a read-only file system looks like, for root too
    mounted = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(readonly), str(readonly)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here: {mounted.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(readonly)], capture_output=True)
        assert train.main(["--output-dir", str(readonly / "run")]) == 2
        assert "cannot write there" in capsys.readouterr().err
    finally:
        subprocess.run(["umount", str(readonly)], capture_output=True)


def test_the_cli_exit_code_is_2_with_no_traceback():
    result = subprocess.run(
        [sys.executable, "train.py", "optim.base_lr=-1"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stderr.strip() == (
        "config error: optim.base_lr=-1.0 is out of range: must be > 0"
    )
