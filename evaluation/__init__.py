"""Evaluation of frozen teachers: the dinov2 logistic-regression probe, k-NN, feature extraction and
caching.

Public API:
    evaluate_run(run_dir, eval_cfg) -> dict          what `eval_linear.py` runs (writes <run>/eval_linear.json)
    run_probe(solver, train_x, train_y, val_x, val_y, ...) -> ProbeResult    the protocol on given features
    TorchLBFGS, SklearnLBFGS, build_solver, c_grid   the two logistic-regression solvers and the C grid
    knn_classify(train_x, train_y, val_x, val_y, ks, temperature) -> {k: {top1, top5}}   (float64-exact neighbours)
Names are imported lazily so the solvers can be used without the data / config stack
(scripts/bench_probe.py).
"""

import importlib

_EXPORTS = {
    "evaluate_run": "evaluate",
    "EvalInputError": "features",
    "run_probe": "probe",
    "ProbeResult": "probe",
    "holdout_split": "probe",
    "TorchLBFGS": "logreg",
    "SklearnLBFGS": "logreg",
    "LogRegFit": "logreg",
    "build_solver": "logreg",
    "c_grid": "logreg",
    "topk_accuracy": "logreg",
    "knn_classify": "knn",
    "CosineIndex": "knn",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
