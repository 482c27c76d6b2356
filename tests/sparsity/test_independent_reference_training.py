"""Correctness of the sparse training step against an independent reference, over whole runs of the
trainer. a. 50 steps of the real trainer (`training.trainer.Trainer`: the embedded digits config
made tiny, fp32 on CPU),
   30 sparse then 20 dense, once with the repository's converter and once with the converter off
   (sparse_fraction=0) and the student's MLP linears swapped to the reference (`independent_reference.py`, pure
   torch) for the same 30 steps: the per-step losses, gradient norms and the weights, teacher and AdamW state agree
   (free-running, and in lockstep: one reference step from the repository's exact state at 13 of the steps; the
   tolerances are explained in `reference_runs.py`); and around the layer: AdamW state and weight decay reach the
   pruned entries, the EMA teacher is the lerp of the dense master weights, nothing is reset at the switch, clipping
   sees the straight-through gradients, drop-path / LayerScale / attention untouched;
b. (gpu) the same comparison on the CIFAR recipe's shape in bf16 autocast on synthetic images. It
prints per-step
   tables: run it with `python -m pytest -m gpu -s tests/sparsity/test_independent_reference_training.py`.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest
import torch
from independent_reference import MLP_PATTERN  # tests/sparsity/independent_reference.py: pure torch
from reference_runs import (  # tests/sparsity/reference_runs.py: the two runs and their records
    FREE_NORMS_RTOL,
    FREE_RTOL,
    FREE_STATE_RTOL,
    LOCKSTEP_RTOL,
    LOCKSTEP_STEPS,
    MUTATION_STEPS,
    SPARSE_STEPS,
    STEPS,
    TIGHT_RTOL,
    Lockstep,
    Record,
    drive,
    norms_difference,
    relative_differences,
    relative_frobenius,
    run_pair,
    swap_reference_at,
)
from torch import nn

from configs import load_config
from sparsity import SemiSparseLinear
from training.distributed import DistContext
from training.trainer import Trainer

pytestmark = (
    pytest.mark.slow
)  # trains for tens of seconds per test on 2 cores: outside the fast lane


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_pair(tmp_path_factory.mktemp("independent_reference"))


def test_free_running_losses_agree(runs):
    a, b = runs["repo_record"].loss, runs["ref_record"].loss
    assert len(a) == len(b) == STEPS
    rel = [abs(x - y) / abs(y) for x, y in zip(a, b)]
    print(
        f"\nfree-running per-step loss, repository vs reference: max relative difference "
        f"{max(rel):.3g} (step "
        f"{rel.index(max(rel))}), max absolute {max(abs(x - y) for x, y in zip(a, b)):.3g}; "
        f"losses {a[0]:.4f} ... {a[-1]:.4f}"
    )
    assert max(rel[:3]) <= TIGHT_RTOL, rel[:3]
    assert max(rel) <= FREE_RTOL, [
        f"{i}: {x} vs {y}" for i, (x, y, r) in enumerate(zip(a, b, rel)) if r > FREE_RTOL
    ]


def test_free_running_gradient_norms_agree(runs):
    """The clipping norms (pre-clip, per student module) equal the reference run's: its
    straight-through gradients."""
    rel = [
        norms_difference(na, nb)
        for na, nb in zip(runs["repo_record"].norms, runs["ref_record"].norms)
    ]
    print(f"\nfree-running gradient norms: max relative difference {max(rel):.3g}")
    assert max(rel[:3]) <= TIGHT_RTOL and max(rel) <= FREE_NORMS_RTOL, rel


@pytest.mark.parametrize("at", [SPARSE_STEPS, STEPS], ids=["after-sparse-phase", "end"])
def test_free_running_weights_teacher_and_adam_state_agree(runs, at):
    a, b = runs["repo_record"].snapshots[at], runs["ref_record"].snapshots[at]
    frob = relative_frobenius(a, b)
    print(
        f"\nfree-running, after {at} steps: relative Frobenius difference per group {frob}; "
        f"largest relative "
        f"difference of one tensor {max(relative_differences(a, b).values())}"
    )
    assert frob.keys() == FREE_STATE_RTOL.keys()
    assert all(frob[g] <= FREE_STATE_RTOL[g] for g in frob), frob


def test_lockstep_one_step_from_the_same_state_agrees(runs):
    lock = runs["repo_record"].lockstep
    assert sorted(lock) == list(LOCKSTEP_STEPS)
    worst = {}
    for step, variants in lock.items():
        d = variants["reference"]
        assert d["loss"] <= TIGHT_RTOL and d["norms"] <= TIGHT_RTOL, (step, d)
        for group in ("student", "teacher", "buffers", "adam"):
            assert d[group][0] <= LOCKSTEP_RTOL, (step, group, d[group])
            worst[group] = max(worst.get(group, 0.0), d[group][0])
        worst["loss"], worst["norms"] = (
            max(worst.get("loss", 0.0), d["loss"]),
            max(worst.get("norms", 0.0), d["norms"]),
        )
    print(f"\nlockstep at steps {LOCKSTEP_STEPS}: largest relative differences {worst}")


def test_lockstep_comparison_can_fail(runs):
    """Two wrong references in lockstep: torch's default (signed) algorithm changes the loss; a
    masked weight gradient changes the AdamW moments already at step 0 (lr 0: the weights do not
    move yet) and the weights from the first step with lr > 0. Both far beyond the tolerances."""
    lock = runs["repo_record"].lockstep
    for step in MUTATION_STEPS:
        signed, masked = lock[step]["signed greedy"], lock[step]["masked dW"]
        print(
            f"\nstep {step}: signed greedy loss off by {signed['loss']:.3g}; masked dW: Adam "
            f"moments off by "
            f"{masked['adam'][0]:.3g}, student weights by {masked['student'][0]:.3g}"
        )
        assert signed["loss"] > 1000 * TIGHT_RTOL  # measured 5.5e-3 (step 0), 8.5e-3 (step 15)
        assert masked["adam"][0] > 100 * LOCKSTEP_RTOL  # measured 1.6 (step 0), 0.45 (step 15)
        if step > 0:  # the weights have moved (lr > 0): measured 3.8e-3 at step 15
            assert masked["student"][0] > 2 * LOCKSTEP_RTOL and masked["norms"] > 10 * TIGHT_RTOL


def _sparse_rows(runs):
    return runs["repo_record"].per_step[:SPARSE_STEPS]


def test_i_adamw_state_of_pruned_entries_is_fed_by_the_straight_through_gradient(runs):
    """Fails if dW were masked (gradient and moments of pruned entries 0 or stale) or the optimizer
    skipped them."""
    for step, row in enumerate(_sparse_rows(runs)):
        for name, t in row["tracked"].items():
            assert 0.45 < t["pruned_frac"] < 0.55, (
                step,
                name,
                t["pruned_frac"],
            )  # a 2:4 mask was in force
            assert t["grad_nonzero_on_pruned"] > 0.99, (step, name, t)
            assert t["pruned_grad_share"] > 0.05, (
                step,
                name,
                t,
            )  # pruned entries carry real gradient
            assert t["m_changed_on_pruned"] > 0.99, (
                step,
                name,
                t,
            )  # the first moment evolves every step
            assert t["m_residual"] < 1e-5 and t["v_residual"] < 1e-5, (
                step,
                name,
                t,
            )  # AdamW used that gradient


def test_ii_weight_decay_acts_on_pruned_entries(runs):
    """On pruned entries the part of each update that is not Adam's is -lr*wd*w (slope 1; 0 if the
    decay skipped them, 2 if it were applied twice); and the master weights are never zeroed where
    pruned."""
    slopes = []
    for step, row in enumerate(_sparse_rows(runs)):
        for name, t in row["tracked"].items():
            assert t["pruned_nonzero"] == 1.0, (step, name)
            assert t["wd_multiplier"] == 1.0 and t["wd"] > 0, (step, name)
            # the decay is visible above fp32 rounding of ~0.02-size weights
            if t["lr"] * t["wd"] * 0.02 > 1e-8:
                slopes.append(t["decay_slope"])
                assert t["decay_slope"] == pytest.approx(1.0, abs=0.05), (
                    step,
                    name,
                    t["decay_slope"],
                )
    assert len(slopes) >= 2 * (SPARSE_STEPS - 10)
    print(
        f"\nweight decay slope on pruned entries: {min(slopes):.4f} .. {max(slopes):.4f} over "
        f"{len(slopes)} checks"
    )


def test_iii_ema_teacher_is_the_lerp_of_the_dense_master_weights(runs):
    """teacher_after = m * teacher_before + (1 - m) * student_after, with the dense student weights
    (not the pruned ones: that lerp is off by (1-m)*|w| on pruned entries, far above the tolerance);
    the teacher's MLPs stay plain nn.Linear during the sparse phase."""
    for step, row in enumerate(runs["repo_record"].per_step):
        for name, t in row["tracked"].items():
            assert t["ema_residual"] < 1e-8, (step, name, t["ema_residual"])
            if step < SPARSE_STEPS:
                assert t["ema_vs_pruned_student"] > 1e-6, (step, name)
    teacher_types = runs["repo_record"].modules[0]["teacher"]
    assert all(cls is nn.Linear for n, cls in teacher_types.items() if re.fullmatch(MLP_PATTERN, n))


def test_iv_nothing_is_reset_at_the_switch_and_the_schedules_are_continuous(runs):
    rows = runs["repo_record"].per_step
    first = rows[0]
    for step, row in enumerate(rows):
        assert (
            row["optimizer_params"] == first["optimizer_params"]
            and row["n_states"] == first["n_states"]
        ), step
        for name, t in row["tracked"].items():
            assert t["state_ids"] == first["tracked"][name]["state_ids"], (
                step,
                name,
            )  # the same state objects
            assert t["step"] == step + 1, (
                step,
                name,
                t["step"],
            )  # AdamW's step count runs on across the switch
            v = row["values"]
            assert t["lr"] == pytest.approx(v["lr"] * t["lr_multiplier"]), step
            assert t["wd"] == pytest.approx(v["wd"] * t["wd_multiplier"]), step
    for key in ("lr", "wd", "momentum", "teacher_temp"):
        s = [row["values"][key] for row in rows]
        around = [
            abs(s[i + 1] - s[i])
            for i in (SPARSE_STEPS - 3, SPARSE_STEPS - 2, SPARSE_STEPS, SPARSE_STEPS + 1)
        ]
        jump = abs(s[SPARSE_STEPS] - s[SPARSE_STEPS - 1])
        assert jump <= 2 * max(around) + 1e-12, (key, jump, around)
    names = runs["repo"].sparsity.converted
    assert len(names) == 24 and all(re.fullmatch(MLP_PATTERN, n) for n in names)


def test_v_clipping_norms_are_computed_on_the_straight_through_gradients(runs):
    """The reported pre-clip backbone norm is the norm of the (un-clipped) gradients AdamW received,
    which include the pruned entries' straight-through gradients (their share is checked in test_i;
    the norms equal the reference's in test_gradient_norms_agree); clipping was active in part of
    the run."""
    rows = runs["repo_record"].per_step
    clipped = 0
    for step, row in enumerate(rows):
        assert row["recomputed_norm"] == pytest.approx(row["reported_norm"], rel=1e-4), step
        clipped += row["reported_norm"] > runs["repo"].cfg.optim.clip_grad
    print(f"\nbackbone gradient norm clipped in {clipped} of {len(rows)} steps")


def test_vi_only_the_mlp_linears_change_drop_path_and_layerscale_untouched(runs):
    sparse, dense = (
        runs["repo_record"].modules[0]["student"],
        runs["repo_record"].modules[SPARSE_STEPS]["student"],
    )
    assert sparse.keys() == dense.keys()
    for name, (cls, ident) in sparse.items():
        assert ident == dense[name][1], (
            name
        )  # the same module objects in both phases (in-place swap)
        if re.fullmatch(MLP_PATTERN, name):
            assert cls is SemiSparseLinear and dense[name][0] is nn.Linear, name
        else:
            assert cls is dense[name][0], name
            assert not issubclass(cls, SemiSparseLinear), name
    blocks = runs["repo"].model.student.backbone.blocks
    assert all(
        type(b.ls1).__name__ == "LayerScale"
        and type(b.drop_path1).__name__ == "DropPath"
        and b.sample_drop_ratio == pytest.approx(0.2)
        for b in blocks
    )
    for step, row in enumerate(_sparse_rows(runs)):
        assert row["gamma_grad_nonzero"] > 0.99 and row["gamma_change"] > 0 or step == 0, (
            step
        )  # lr = 0 at step 0


# ==================================================================================================
# GPU: the CIFAR recipe's shape in bf16 autocast

CIFAR_YAML = Path(__file__).resolve().parents[2] / "configs" / "cifar10.yaml"
# bf16 tolerances. On the GPU the repository's dense-backend step differs from the reference by
# design in one place: its weight gradient may come from one cuBLASLt call that writes fp32
# (sparsity.fused_wgrad, used where it is faster), where the reference (like F.linear under
# autocast) rounds dy^T @ x to bf16 first; backend=auto also runs the GEMMs in cuSPARSELt, whose
# accumulation order differs from cuBLAS's. A CPU proxy of the first (the tiny digits run in bf16
# autocast, the reference's dW written in fp32) moved the free-running losses by at most 1.4e-3
# relative over 50 steps (the same chaos as above; with the reference unchanged the bf16 runs were
# bit-identical), so GPU_FREE_RTOL = 1e-2 is ~7x that; in lockstep the forward is the same GEMMs on
# the same pruned weight (loss to GPU_LOCKSTEP_LOSS_RTOL, a quarter of one bf16 ulp), the norms see
# the fp32-vs-bf16 dW rounding (2^-9 per entry).
GPU_FREE_RTOL = 1e-2
GPU_LOCKSTEP_LOSS_RTOL = 1e-3
GPU_LOCKSTEP_NORMS_RTOL = 1e-2
GPU_LOCKSTEP_STEPS = (0, 1, 10, 29, 30, 49)


def synthetic_image_folder(root: Path, n: int = 512, classes: int = 4, size: int = 32) -> Path:
    """`root/train/c<k>/<i>.png`: n random RGB images (an ImageNet-style tree, as the CIFAR recipe
    reads)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(n):
        folder = root / "train" / f"c{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
            folder / f"{i:04d}.png"
        )
    return root


def cifar_config(root: Path, sparse_fraction: float, backend: str, batch: int = 256):
    """configs/cifar10.yaml's model and recipe (vit_tiny/4, 32 px, 2 + 8 crops, bf16), 50 steps,
    eager."""
    return load_config(
        CIFAR_YAML,
        [
            f"data.root={root}",
            f"train.batch_size_per_gpu={batch}",
            "optim.epochs=5",
            "train.epoch_length=10",
            "optim.warmup_epochs=1",
            "train.compile=false",
            "train.num_workers=0",
            f"sparsity.sparse_fraction={sparse_fraction}",
            f"sparsity.backend={backend}",
            "sparsity.pruning=tile_greedy",
        ],
    )


def cifar_comparison(tmp_path: Path, device: torch.device, batch: int = 256) -> dict:
    """The repository's run (backend dense, with lockstep reference steps; again, for the
    nondeterminism floor; backend auto, what the recipe runs) and the free-running reference run,
    all from the same seed and data."""
    root = synthetic_image_folder(tmp_path / "images")
    ctx = DistContext(0, 1, 0, device)

    def trainer(name, sparse_fraction, backend, dataset=None):
        cfg = cifar_config(root, sparse_fraction, backend, batch)
        assert cfg.total_steps == STEPS and cfg.sparse_steps == round(sparse_fraction * STEPS)
        return Trainer(cfg, tmp_path / name, ctx, dataset=dataset)

    shadow = trainer(
        "shadow", 0.0, "dense"
    )  # first: each later trainer seeds the RNG as a fresh run does
    data = shadow.dataset
    plan = [
        (
            "repository dense",
            lambda: (
                trainer("repo-dense", 0.6, "dense", data),
                Lockstep(shadow, GPU_LOCKSTEP_STEPS, mutation_steps=(10,)),
                None,
            ),
        ),
        (
            "repository dense again",
            lambda: (trainer("repo-dense-2", 0.6, "dense", data), Record(), None),
        ),
        ("repository auto", lambda: (trainer("repo-auto", 0.6, "auto", data), Record(), None)),
        (
            "reference",
            lambda: (
                trainer("reference", 0.0, "dense", data),
                Record(),
                swap_reference_at(SPARSE_STEPS),
            ),
        ),
    ]
    records, seconds = {}, {}
    for name, make in plan:
        t, record, before_step = make()
        start = time.perf_counter()
        records[name] = drive(t, record, before_step=before_step)
        seconds[name] = time.perf_counter() - start
        del t
    return {"records": records, "seconds": seconds, "amp_dtype": shadow.amp_dtype}


def _print_loss_table(records: dict) -> dict:
    ref = records["reference"].loss
    others = [k for k in records if k != "reference"]
    print(
        f"\n{'step':>4} {'phase':>6} {'reference loss':>15} "
        + " ".join(f"{'|d| ' + k:>26}" for k in others)
    )
    worst = {k: 0.0 for k in others}
    for i, r in enumerate(ref):
        diffs = [abs(records[k].loss[i] - r) for k in others]
        for k, d in zip(others, diffs):
            worst[k] = max(worst[k], d / abs(r))
        print(
            f"{i:>4} {'sparse' if i < SPARSE_STEPS else 'dense':>6} {r:>15.6f} "
            + " ".join(f"{d:>26.3e}" for d in diffs)
        )
    print(
        "max relative loss difference to the reference: "
        + ", ".join(f"{k} {v:.3g}" for k, v in worst.items())
    )
    return worst


@pytest.mark.gpu
def test_cifar_recipe_bf16_repository_vs_reference_on_gpu(tmp_path):
    result = cifar_comparison(tmp_path, torch.device("cuda"))
    records = result["records"]
    assert result["amp_dtype"] == torch.bfloat16
    print(f"\nseconds per 50-step run: {result['seconds']}")
    worst = _print_loss_table(records)
    control = max(
        abs(x - y) / abs(y)
        for x, y in zip(records["repository dense"].loss, records["repository dense again"].loss)
    )
    print(
        f"the repository's dense run twice (GPU nondeterminism floor): max relative loss "
        f"difference {control:.3g}"
    )
    for name in ("repository dense", "repository auto"):
        a, b = records[name], records["reference"]
        norms = max(norms_difference(x, y) for x, y in zip(a.norms, b.norms))
        frob = {
            at: relative_frobenius(a.snapshots[at], b.snapshots[at]) for at in (SPARSE_STEPS, STEPS)
        }
        print(
            f"{name}: max relative gradient-norm difference {norms:.3g}; relative Frobenius state "
            f"difference "
            f"after 30 / 50 steps {frob}"
        )
    lock = records["repository dense"].lockstep
    for step, variants in sorted(lock.items()):
        print(
            f"lockstep step {step}: "
            + "; ".join(
                f"{v}: loss {d['loss']:.3g}, norms {d['norms']:.3g}, "
                + ", ".join(
                    f"{g} {d[g][0]:.3g}"
                    for g in ("student", "teacher", "buffers", "adam")
                    if g in d
                )
                for v, d in variants.items()
            )
        )
    assert sorted(lock) == list(GPU_LOCKSTEP_STEPS)
    for step, variants in lock.items():
        d = variants["reference"]
        assert d["loss"] <= GPU_LOCKSTEP_LOSS_RTOL and d["norms"] <= GPU_LOCKSTEP_NORMS_RTOL, (
            step,
            d,
        )
    assert all(math.isfinite(x) for r in records.values() for x in r.loss)
    assert (
        worst["repository dense"] <= GPU_FREE_RTOL and worst["repository auto"] <= GPU_FREE_RTOL
    ), worst
    assert control <= GPU_FREE_RTOL
