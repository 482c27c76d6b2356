"""prune_mlp: the teacher probed with its MLP weights 2:4-pruned as the run's student ran them.

The pruned features are checked against a copy of the teacher whose fc1/fc2 weights were masked by
hand with the independent torchao-style reference (tests/sparsity/independent_reference.py: pure
torch, none of `sparsity`), and must differ from the dense features (a no-op would fail)."""

import copy
import hashlib
import json
import sys

import pytest
import torch
from eval_test_helpers import FAST_EVAL, REPO, TINY_RUN, fast, make_folder_run, make_run_dir

from configs import ConfigError, load_config, load_eval_config
from evaluation.evaluate import extract_run_features
from evaluation.features import EvalInputError, load_teacher
from evaluation.mlp_pruning import prune_teacher, resolve_mlp_pruning

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "sparsity"))
from independent_reference import tile_mask  # noqa: E402  (pure torch, nothing from this repository)

import eval_linear  # noqa: E402

pytestmark = (
    pytest.mark.slow
)  # trains for tens of seconds per test on 2 cores: outside the fast lane

MLP_SUFFIXES = (".mlp.fc1", ".mlp.fc2")
# LayerScale off: at its init (1e-5) the MLPs barely move the residual stream, and pruning them
# would change the features too little for a test to tell pruned from dense
LOUD_MLPS = ("student.layerscale=0",)
# the reference walk is slow on CPU; the same seeded weights come back in several tests
_MASKS: dict = {}


def reference_mask(w, dtype):
    key = (hashlib.sha256(w.detach().numpy().tobytes()).hexdigest(), dtype)
    if key not in _MASKS:
        _MASKS[key] = tile_mask(w.detach().to(dtype).float(), "largest_abs_values_greedy")
    return _MASKS[key]


def hand_masked(backbone, mask_dtype=torch.float32):
    """A copy of `backbone` whose MLP weights are multiplied by the reference's tile_greedy mask
    (largest |w| per 4x4 tile, transposable), computed on the weight as `mask_dtype` rounds it (the
    compute dtype of the forward)."""
    ref = copy.deepcopy(backbone)
    n = 0
    with torch.no_grad():
        for name, module in ref.named_modules():
            if name.endswith(MLP_SUFFIXES):
                w = module.weight
                mask = reference_mask(w, mask_dtype)
                # 2:4 along rows; the greedy walk keeps 2 per tile row and column where it can (not
                # always: <= half)
                assert mask.reshape(-1, 4).sum(1).max() == 2 and 0.45 < mask.float().mean() <= 0.5
                w.mul_(mask)
                n += 1
    assert n == 2 * len(backbone.blocks)
    return ref


def _run_cfg(*overrides):
    return load_config(None, [*TINY_RUN, *overrides])


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_pruned_forward_equals_a_hand_masked_copy_and_differs_from_dense(tmp_path, autocast):
    run = make_run_dir(tmp_path / "run", "sparsity.sparse_fraction=1.0", *LOUD_MLPS)
    run_cfg = load_config(run / "config.yaml")
    dense, _ = load_teacher(run_cfg, run / "teacher_backbone.pth")
    ref = hand_masked(dense, autocast or torch.float32)
    pruned = copy.deepcopy(dense)
    names = prune_teacher(pruned, run_cfg)
    assert len(names) == 2 * len(dense.blocks) and all(n.endswith(MLP_SUFFIXES) for n in names)
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None),
    ):
        got, want, plain = pruned.eval()(x).float(), ref.eval()(x).float(), dense.eval()(x).float()
    tol = {"atol": 1e-5, "rtol": 1e-5} if autocast is None else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(got, want, **tol)
    assert (
        got - plain
    ).abs().mean() > 0.2  # pruning half of every MLP weight shows (features ~ N(0, 1))


def test_eval_features_equal_those_of_a_hand_masked_checkpoint(tmp_path):
    run = make_folder_run(tmp_path, "sparsity.sparse_fraction=1.0", *LOUD_MLPS)
    run_cfg = load_config(run / "config.yaml")
    eval_cfg = load_eval_config(None, FAST_EVAL)
    ckpt = run / "teacher_backbone.pth"
    pruned = extract_run_features(
        run, run_cfg, eval_cfg, ckpt, torch.device("cpu"), mlp=resolve_mlp_pruning("auto", run_cfg)
    )
    dense = extract_run_features(
        run, run_cfg, eval_cfg, ckpt, torch.device("cpu"), mlp=resolve_mlp_pruning("false", run_cfg)
    )
    masked_ckpt = tmp_path / "masked.pth"
    torch.save(
        {"backbone": hand_masked(load_teacher(run_cfg, ckpt)[0]).state_dict(), "step": 16},
        masked_ckpt,
    )
    reference = extract_run_features(
        run,
        run_cfg,
        eval_cfg,
        masked_ckpt,
        torch.device("cpu"),
        mlp=resolve_mlp_pruning("false", run_cfg),
    )
    assert (
        not pruned["train"].from_cache and not dense["train"].from_cache
    )  # the two caches are separate
    torch.testing.assert_close(pruned["train"].x, reference["train"].x, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pruned["val"].x, reference["val"].x, atol=1e-5, rtol=1e-5)
    assert (pruned["train"].x - dense["train"].x).abs().mean() > 0.2
    assert (run / "eval" / "features_train_pruned_mlp.pt").is_file() and (
        run / "eval" / "features_train.pt"
    ).is_file()


@pytest.mark.parametrize(
    "overrides,prunes",
    [
        (["sparsity.sparse_fraction=1.0"], True),
        (["sparsity.sparse_fraction=0.0"], False),
        (["sparsity.sparse_fraction=0.7"], False),
        (
            ["sparsity.sparse_fraction=0.7", "train.max_steps=100"],
            True,
        ),  # stopped at step 100 of 300, before the switch
        (["sparsity.sparse_fraction=1.0", "sparsity.kind=activation"], True),
        (
            ["sparsity.sparse_fraction=1.0", "sparsity.kind=block", "sparsity.block_size=4"],
            False,
        ),  # no 2:4 to redo
    ],
)
def test_auto_prunes_exactly_when_the_last_step_was_2_4_sparse(overrides, prunes):
    cfg = _run_cfg(*overrides)
    auto = resolve_mlp_pruning("auto", cfg)
    assert auto.prune is prunes and auto.as_trained and auto.output_suffix == ""
    assert auto.weights != "dense" if prunes else auto.weights == "dense"
    assert not resolve_mlp_pruning("false", cfg).prune
    if "sparsity.kind=block" not in overrides:
        forced = resolve_mlp_pruning("true", cfg)
        assert forced.prune and forced.output_suffix == ("" if prunes else "_pruned_mlp")
    assert resolve_mlp_pruning("false", cfg).output_suffix == ("_dense_mlp" if prunes else "")


def test_what_is_recorded_names_the_pruning():
    assert resolve_mlp_pruning("true", _run_cfg()).weights == "2:4-pruned (tile_greedy)"
    assert (
        resolve_mlp_pruning("true", _run_cfg("sparsity.pruning=tile_optimal")).weights
        == "2:4-pruned (tile_optimal)"
    )
    assert (
        resolve_mlp_pruning("true", _run_cfg("sparsity.kind=activation")).weights
        == "dense, inputs 2:4-pruned (tile_greedy)"
    )


def test_true_is_refused_where_there_is_nothing_2_4_to_prune():
    with pytest.raises(EvalInputError, match="sparsity.kind=block"):
        resolve_mlp_pruning("true", _run_cfg("sparsity.kind=block", "sparsity.block_size=4"))
    with pytest.raises(EvalInputError, match="checkpoint=pixels"):
        resolve_mlp_pruning("true", _run_cfg(), has_model=False)
    assert (
        resolve_mlp_pruning("auto", _run_cfg("sparsity.sparse_fraction=1.0"), has_model=False).prune
        is False
    )


@pytest.mark.parametrize(
    "given,stored", [("auto", "auto"), ("true", "true"), ("false", "false"), ("True", "true")]
)
def test_prune_mlp_values(given, stored):
    assert load_eval_config(None, [f"prune_mlp={given}"]).prune_mlp == stored


@pytest.mark.parametrize("bad", ["maybe", "1", "sparse"])
def test_a_bad_value_is_a_config_error_naming_the_key_and_the_choices(bad, tmp_path, capsys):
    with pytest.raises(ConfigError, match="prune_mlp=.*is not one of auto, true, false"):
        load_eval_config(None, [f"prune_mlp={bad}"])
    assert eval_linear.main(["--run", str(tmp_path), f"prune_mlp={bad}"]) == 2
    err = capsys.readouterr().err
    assert "prune_mlp" in err and "auto, true, false" in err


def test_the_result_records_the_mode_and_both_probes_keep_their_files(tmp_path):
    run = make_folder_run(tmp_path, "sparsity.sparse_fraction=1.0", *LOUD_MLPS)
    index = tmp_path / "index.jsonl"
    assert eval_linear.main(["--run", str(run), *FAST_EVAL, f"index={index}"]) == 0
    as_trained = json.loads((run / fast("eval_linear.json")).read_text())
    assert as_trained["mlp_weights"] == "2:4-pruned (tile_greedy)"
    assert (
        eval_linear.main(["--run", str(run), *FAST_EVAL, f"index={index}", "prune_mlp=false"]) == 0
    )
    dense = json.loads((run / fast("eval_linear_dense_mlp.json")).read_text())
    assert dense["mlp_weights"] == "dense"
    assert json.loads((run / fast("eval_linear.json")).read_text()) == as_trained  # not overwritten
    assert dense["C_curve"] != as_trained["C_curve"]  # other features, other fits
    assert {p.name for p in (run / "eval").glob("features_train*.pt")} == {
        "features_train.pt",
        "features_train_pruned_mlp.pt",
    }
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    assert [line["mlp_weights"] for line in lines] == ["2:4-pruned (tile_greedy)", "dense"]


def test_a_dense_run_probed_pruned_writes_its_own_file_and_says_so_first(tmp_path, caplog):
    run = make_folder_run(tmp_path, "sparsity.sparse_fraction=0.0")
    caplog.set_level("INFO")
    assert (
        eval_linear.main(
            ["--run", str(run), *FAST_EVAL, "index=none", "prune_mlp=true", "mode=knn"]
        )
        == 0
    )
    record = json.loads((run / fast("eval_knn_pruned_mlp.json")).read_text())
    assert (
        record["mlp_weights"] == "2:4-pruned (tile_greedy)"
        and not (run / fast("eval_knn.json")).exists()
    )
    first = next(r.getMessage() for r in caplog.records if r.name == "evaluation.evaluate")
    assert first.startswith(f"evaluating checkpoint {run / 'teacher_backbone.pth'} of run {run}")
    assert (
        "MLP weights 2:4-pruned (tile_greedy) (prune_mlp=true: the run's last step was dense)"
        in first
    )
