"""Hostile configs: interpolations that cannot resolve, integers no int64 holds, files that are not
YAML mappings, dotlists that are not key=value. Each is `train.py`'s exit 2 with one line naming the
key or the file, and the output directory is never created. Also what config.yaml stores for
interpolations and how a resume compares them (the end-to-end run is
tests/training/test_resume_interpolations.py)."""

import pytest

import train
from configs import ConfigError, load_config, to_yaml
from configs.fields import INT_MAX
from configs.load import RESUMABLE_CHANGES, config_difference


def refused(tmp_path, capsys, *args) -> str:
    """train.py's one-line config error for `args`; the output directory must not exist
    afterwards."""
    out = tmp_path / "run"
    assert train.main(["--output-dir", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and err.count("\n") == 0 and "Traceback" not in err, err
    assert len(err) < 1000, f"not a readable line ({len(err)} characters)"
    assert not out.exists(), "a refused config touched the output directory"
    return err


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["optim.base_lr=${optim.base_lr}"],
            "optim.base_lr=${optim.base_lr} cannot be resolved: Recursive interpolation",
        ),
        (
            ["optim.base_lr=${optim.min_lr}", "optim.min_lr=${optim.base_lr}"],
            "cannot be resolved: Recursive",
        ),
        (
            ["optim.base_lr=${no.such_key}"],
            "optim.base_lr=${no.such_key} cannot be resolved: Interpolation key 'no.",
        ),
        (
            ["optim.base_lr=${oc.env:HOSTILE_UNSET_VAR}"],
            "optim.base_lr=${oc.env:HOSTILE_UNSET_VAR} cannot be resolved",
        ),
        (
            ["optim.base_lr=${oc.env:HOSTILE_TEXT}"],
            "optim.base_lr=${oc.env:HOSTILE_TEXT} cannot be resolved",
        ),
        (
            ["optim.base_lr=${oc.no_such_resolver:1}"],
            "optim.base_lr=${oc.no_such_resolver:1} cannot be resolved",
        ),
        (["optim.base_lr=${"], "command line: 'optim.base_lr=${' cannot be parsed"),
        (
            ["crops.global_crops_scale=[${optim.nope},1.0]"],
            "'crops.global_crops_scale=[${optim.nope},1.0]' cannot be",
        ),
        (
            ["crops.global_crops_scale=" + "[" * 5000 + "]" * 5000],
            "crops.global_crops_scale=[[[[[[[[[[[[[[[[[[[[[[[[",
        ),
        (
            ["crops.global_crops_scale=['${optim.nope}',1.0]"],
            "crops.global_crops_scale=['${optim.nope}', 1.0] cannot be",
        ),
    ],
)
def test_unresolvable_interpolations_on_the_command_line(
    overrides, expected, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("HOSTILE_UNSET_VAR", raising=False)
    monkeypatch.setenv("HOSTILE_TEXT", "not a number")
    assert expected in refused(tmp_path, capsys, *overrides)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["train.max_steps=99999999999999999999"],
            f"train.max_steps=99999999999999999999 is out of range: must be >= 0 and at most "
            f"{INT_MAX}",
        ),
        (
            [f"train.seed={2**70}"],
            f"train.seed={2**70} is out of range: must be >= 0 and at most {INT_MAX}",
        ),
        ([f"train.seed={INT_MAX + 1}"], f"train.seed={INT_MAX + 1} is out of range"),
        (
            [f"dino.head_n_prototypes=-{2**64}"],
            f"dino.head_n_prototypes=-{2**64} is out of range: must be >= 1 and",
        ),
        (
            [f"optim.epochs={INT_MAX}", f"train.epoch_length={INT_MAX}"],
            "steps: must be at most 10000000",
        ),
        (["optim.base_lr=1e400"], "optim.base_lr=inf is out of range"),  # YAML reads it as inf
        (["optim.base_lr=-nan"], "optim.base_lr=nan is out of range"),
        (
            ["train.batch_size_per_gpu=0"],
            "train.batch_size_per_gpu=0 is out of range: must be >= 2",
        ),
    ],
)
def test_integers_too_large_and_meaningless_numbers(overrides, expected, tmp_path, capsys):
    assert expected in refused(tmp_path, capsys, *overrides)


def test_an_integer_at_the_limit_is_accepted():
    assert load_config(None, [f"train.seed={INT_MAX}"]).train.seed == INT_MAX


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["train.seed"], "command-line override 'train.seed' is not of the form key=value"),
        (["=1"], "command-line override '=1' names no key"),
        (["train.seed.deeper=1"], "wrong type for 'train.seed'"),  # a key path through a number
        (["student=1"], "wrong type for 'student'"),  # a value for a whole section
        (["train.sed=1"], "unknown config key 'train.sed'"),
    ],
)
def test_dotlists_that_are_not_key_value(overrides, expected, tmp_path, capsys):
    assert expected in refused(tmp_path, capsys, *overrides)


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh")
)


@pytest.mark.parametrize(
    "content,expected",
    [
        (
            "optim:\n  base_lr: ${optim.base_lr}\n",
            "optim.base_lr=${optim.base_lr} cannot be resolved",
        ),
        (
            "train:\n  seed: ${oc.env:HOSTILE_UNSET_VAR}\n",
            "train.seed=${oc.env:HOSTILE_UNSET_VAR} cannot be resolved",
        ),
        (
            "train:\n  max_steps: 99999999999999999999\n",
            "train.max_steps=99999999999999999999 is out of range",
        ),
        ("42\n", "a config is a mapping of sections"),  # a scalar
        ("just some text\n", "unknown config key 'just some text'"),  # YAML: a key without a value
        ("- train\n- optim\n", "a config is a mapping of sections"),  # a list
        (b"train:\n  seed: \xff\xfe\n", "not a text (UTF-8) file (byte 15 is 0xff)"),
        (BOMB, "YAML node expansion exceeds the configured limit"),  # "billion laughs"
        ("optim: {base_lr: 1, base_lr: 2}\n", "found duplicate key base_lr"),
        (
            "optim:\n  base_lr: !!python/object/apply:os.system [touch /tmp/pwned]\n",
            "could not determine a constructor",
        ),
        ("? [a, b]\n: 1\n", "found unhashable key"),
        ("train:\n  seed: " + "[" * 5000 + "]" * 5000 + "\n", "exceeded maximum nesting depth"),
    ],
)
def test_hostile_yaml_files(content, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HOSTILE_UNSET_VAR", raising=False)
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    err = refused(tmp_path, capsys, "--config", str(path))
    assert expected in err and (str(path) in err or "optim." in err or "train." in err), err


def test_a_directory_given_as_the_config_file(tmp_path, capsys):
    (tmp_path / "cfg.yaml").mkdir()
    path = tmp_path / "cfg.yaml"
    assert f"{path}: is a directory" in refused(tmp_path, capsys, "--config", str(path))


@pytest.mark.parametrize(
    "content,expected",
    [
        (
            "optim:\n  base_lr: ${optim.base_lr}\n",
            "optim.base_lr=${optim.base_lr} cannot be resolved",
        ),
        ("train:\n  seed: ${missing.key}\n", "train.seed=${missing.key} cannot be resolved"),
        (b"\x80\x81binary", "not a text (UTF-8) file"),
    ],
)
def test_a_runs_config_yaml_that_cannot_be_resolved_is_a_config_error(content, expected, tmp_path):
    """config.yaml is read by evaluation, reports and the Slurm tools through load_config: one
    ConfigError."""
    path = tmp_path / "config.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert expected in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


# --- what config.yaml stores, and the resume comparison ---------------------------------------------------------


def test_config_yaml_stores_resolved_numbers_and_free_text_interpolations_as_written(monkeypatch):
    monkeypatch.setenv("LR", "0.25")
    monkeypatch.setenv("DATA", "/secret/token-d41d8")
    cfg = load_config(
        None,
        [
            "optim.base_lr=${oc.env:LR}",
            "optim.min_lr=${optim.base_lr}",
            "data.root=${oc.env:DATA}",
            "data.dataset=image_folder",
        ],
    )
    text = to_yaml(cfg)
    assert (
        "base_lr: 0.25" in text and "min_lr: 0.25" in text
    )  # what the run computes with, not the environment
    assert (
        "root: ${oc.env:DATA}" in text and "token-d41d8" not in text
    )  # a path may carry a credential
    assert "# resolved sha256 data.root " in text
    monkeypatch.setenv(
        "LR", "9.0"
    )  # a later reader (resume, eval, reports) does not depend on the environment
    assert load_config_text(text, monkeypatch).optim.base_lr == 0.25


def load_config_text(text, monkeypatch):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.yaml").write_text(text)
        return load_config(Path(d) / "config.yaml")


def test_resume_comparison_names_the_key_and_both_resolved_values(monkeypatch):
    monkeypatch.setenv("LR", "0.004")
    saved = to_yaml(load_config(None, ["optim.base_lr=${oc.env:LR}"]))
    assert (
        config_difference(
            saved, to_yaml(load_config(None, ["optim.base_lr=${oc.env:LR}"])), RESUMABLE_CHANGES
        )
        == []
    )
    monkeypatch.setenv("LR", "0.4")
    assert config_difference(
        saved, to_yaml(load_config(None, ["optim.base_lr=${oc.env:LR}"])), RESUMABLE_CHANGES
    ) == ["optim.base_lr: 0.004 -> 0.4"]


def test_a_changed_free_text_interpolation_is_caught_by_its_fingerprint(monkeypatch):
    monkeypatch.setenv("MODS", r"blocks\.\d+\.mlp\.fc1")
    saved = to_yaml(load_config(None, ["sparsity.modules=${oc.env:MODS}"]))
    monkeypatch.setenv("MODS", r"blocks\.\d+\.mlp\.fc2")
    (change,) = config_difference(
        saved, to_yaml(load_config(None, ["sparsity.modules=${oc.env:MODS}"])), RESUMABLE_CHANGES
    )
    assert (
        change.startswith("sparsity.modules: ${oc.env:MODS} resolves to another value")
        and "sha256" in change
    )
    assert "fc2" not in change and "fc1" not in change


def test_an_older_config_with_interpolations_is_resolved_against_this_environment(monkeypatch):
    """Configs of earlier versions stored every interpolation as written; they are resolved now to
    compare."""
    monkeypatch.setenv("LR", "0.004")
    new = to_yaml(load_config(None, ["optim.base_lr=0.004"]))
    old = new.replace("base_lr: 0.004", "base_lr: ${oc.env:LR}")
    assert config_difference(old, new) == []
    monkeypatch.setenv("LR", "0.5")
    assert config_difference(old, new) == ["optim.base_lr: '0.5' -> 0.004"]
    monkeypatch.delenv("LR")
    assert config_difference(old, new) == ["optim.base_lr: '${oc.env:LR}' -> 0.004"]


@pytest.mark.parametrize(
    "saved", ["- a list\n", "train: [unclosed\n", "train:\n  seed: ${train.seed}\n", "42"]
)
def test_a_saved_config_that_cannot_be_read_is_a_config_error(saved):
    new = to_yaml(load_config(None, []))
    # self-referencing: never equal to a number, named as written (the keys it lacks
    if "${train.seed}" in saved:
        # count as their schema defaults, so the embedded default's own values are changes too)
        assert "train.seed: '${train.seed}' -> 0" in config_difference(saved, new)
        return
    with pytest.raises(ConfigError, match="the saved config"):
        config_difference(saved, new)


@pytest.mark.parametrize(
    "saved", ["- a list\n", "train: [unclosed\n", b"\xff\xfe".decode("latin-1")]
)
def test_a_checkpoint_whose_config_cannot_be_read_is_refused_naming_the_run(saved, tmp_path):
    from training.resume import ResumeMismatch, check_same_config

    with pytest.raises(ResumeMismatch) as e:
        check_same_config({"config": saved}, load_config(None, []), tmp_path)
    message = str(e.value)
    assert (
        str(tmp_path) in message
        and "cannot be compared" in message
        and "the saved config" in message
    )
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "override,expected",
    [
        (
            "linear.seed=${linear.seed}",
            "linear.seed=${linear.seed} cannot be resolved: Recursive interpolation",
        ),
        (
            "data.root=${oc.env:HOSTILE_UNSET_VAR}",
            "data.root=${oc.env:HOSTILE_UNSET_VAR} cannot be resolved",
        ),
        ("knn.ks=[10,99999999999999999999]", "knn.ks=[10, 99999999999999999999] is out of range"),
        ("features.batch_size=-99999999999999999999", f"at most {INT_MAX} in absolute value"),
    ],
)
def test_eval_gets_the_same_config_errors(override, expected, tmp_path, capsys, monkeypatch):
    import eval_linear

    monkeypatch.delenv("HOSTILE_UNSET_VAR", raising=False)
    assert eval_linear.main(["--run", str(tmp_path), override]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and err.count("\n") == 0 and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def _without_line(yaml_text: str, line: str) -> str:
    assert yaml_text.count(line + "\n") == 1
    return yaml_text.replace(line + "\n", "")


def test_a_key_one_config_lacks_counts_as_its_schema_default():
    """A run saved before a key existed ran with that key's default: setting the key on resume, or
    comparing with a run that sets it, is a change; the default is not; a key the schema no longer
    has is still ignored."""
    restart = "  momentum_restart_fraction: 0.0"
    older = _without_line(to_yaml(load_config(None, [])), restart)
    newer = to_yaml(load_config(None, ["teacher.momentum_restart_fraction=0.4"]))
    assert config_difference(older, newer) == ["teacher.momentum_restart_fraction: 0.0 -> 0.4"]
    assert config_difference(newer, older) == ["teacher.momentum_restart_fraction: 0.4 -> 0.0"]
    assert config_difference(older, to_yaml(load_config(None, []))) == []
    removed = older.replace("train:\n", "train:\n  a_key_since_removed: 3\n", 1)
    assert config_difference(removed, to_yaml(load_config(None, []))) == []
