"""`prune_mlp`: probe the teacher with its MLP linears 2:4-pruned at every forward, as the run's
student ran them.

A run with sparsity.sparse_fraction=1.0 never used whole MLP weights: each forward pruned the
student's fc1/fc2 to a transposable 2:4 pattern (straight-through to the dense weights). Its
exported teacher is an EMA of those dense weights, so a dense probe measures a network that never
ran. With pruning on, the loaded teacher backbone is converted with the run's own `sparsity`
settings (modules, kind, pruning method) by the library's converter (`sparsity.SparseThenDense`), so
every forward prunes as training did. `auto` prunes when the run's last step was sparse; `true` /
`false` force it (e.g. `true` for the teacher exported at the switch of a sparse-then-dense run).

The GEMM backend is "dense" (the pruned weight multiplied densely) whatever the run used: every
backend applies the same mask (each is tested against this one), it runs on CPU and in fp32, where
cusparselt / cutlass do not, and the features do not depend on a timing decision (`auto`). The mask
is computed on the weight in the compute dtype: bf16 under the GPU extraction's autocast, as in
training; fp32 on CPU (rare bf16 ties may then break otherwise).
"""

import logging
from dataclasses import dataclass

from torch import nn

from rundir.layout import DENSE_MLP_SUFFIX, PRUNED_MLP_SUFFIX
from rundir.status import last_step
from sparsity import SparseThenDense
from sparsity.converter import SPARSE
from training.sparsity_setup import sparsity_converter

from .features import EvalInputError

logger = logging.getLogger(__name__)

EVAL_BACKEND = "dense"
DENSE = "dense"
PRUNED_SUFFIX, DENSE_SUFFIX = PRUNED_MLP_SUFFIX, DENSE_MLP_SUFFIX


@dataclass(frozen=True)
class MlpPruning:
    """What `prune_mlp` resolved to for one evaluation."""

    prune: bool  # convert the teacher's MLP linears
    as_trained: bool  # the run's last step ran its MLPs this way (what `auto` picks)
    weights: str  # recorded as the result's "mlp_weights": "dense", "2:4-pruned (tile_greedy)", ...
    reason: str  # why, for the first log line
    modules: str = ""  # the run's sparsity.modules pattern, when pruned

    @property
    def cache_tag(self) -> str:
        """What the features depend on (`features.cache_key`'s mlp_weights): "dense", or the pruning
        and modules."""
        return f"{self.weights} of {self.modules}" if self.prune else DENSE

    @property
    def output_suffix(self) -> str:
        """ "" for the probe of the run as trained, which keeps the usual name (`eval_linear.json`
        is what tables read, so for a 2:4 run it must be the 2:4 model); the other mode gets
        `_pruned_mlp` / `_dense_mlp`, so a user who asks for both gets two files instead of one
        silently replacing the other."""
        return probe_suffix(self.prune, self.as_trained)

    @property
    def cache_suffix(self) -> str:
        """Pruned features are cached next to the dense ones, not over them (their cache key differs
        too)."""
        return PRUNED_SUFFIX if self.prune else ""


def probe_suffix(prune: bool, as_trained: bool) -> str:
    """The result-file suffix of a probe with the MLPs pruned or not (`MlpPruning.output_suffix`):
    none in the mode the run's last step ran, `_pruned_mlp` / `_dense_mlp` in the other."""
    if as_trained:
        return ""
    return PRUNED_SUFFIX if prune else DENSE_SUFFIX


def eval_converter(run_cfg) -> SparseThenDense:
    """The run's `sparsity` section as the library's converter, as training builds it, with the eval
    backend."""
    return sparsity_converter(run_cfg, backend=EVAL_BACKEND)


def run_ended_sparse(run_cfg) -> bool:
    """Whether the run's last training step (0-based: last_step - 1) was in the sparse phase; True
    exactly when sparse_fraction rounds to every step of the schedule, or train.max_steps stops the
    run before the switch."""
    return eval_converter(run_cfg).phase_at(last_step(run_cfg) - 1) == SPARSE


def describe(run_cfg) -> str:
    s = run_cfg.sparsity
    return (
        f"2:4-pruned ({s.pruning})"
        if s.kind == "weight"
        else f"dense, inputs 2:4-pruned ({s.pruning})"
    )


def resolve_mlp_pruning(setting: str, run_cfg, has_model: bool = True) -> MlpPruning:
    """`prune_mlp` ("auto" | "true" | "false") for this run; `has_model` False for the raw-pixel
    baseline."""
    kind = run_cfg.sparsity.kind
    if not has_model:
        if setting == "true":
            raise EvalInputError("prune_mlp=true: checkpoint=pixels has no model to prune")
        return MlpPruning(False, True, "none (raw pixels)", "no model")
    # block-sparse masks were chosen from the student's weights and are not in the exported teacher:
    # no 2:4 to redo
    last_sparse = run_ended_sparse(run_cfg)
    ended_sparse = last_sparse and kind != "block"
    if setting == "true" and kind == "block":
        raise EvalInputError(
            "prune_mlp=true needs a run with 2:4 sparsity (sparsity.kind=weight or activation); "
            "this run's MLPs were block-sparse (sparsity.kind=block), whose masks the exported "
            "teacher does not hold: use prune_mlp=false"
        )
    prune = ended_sparse if setting == "auto" else setting == "true"
    reason = f"the run's last step was {'sparse' if last_sparse else 'dense'}"
    if last_sparse and kind == "block":
        reason += " (block-sparse, not 2:4)"
    return MlpPruning(
        prune,
        prune == ended_sparse,
        describe(run_cfg) if prune else DENSE,
        f"prune_mlp={setting}: {reason}",
        run_cfg.sparsity.modules if prune else "",
    )


def prune_teacher(backbone: nn.Module, run_cfg) -> list:
    """Convert `backbone`'s MLP linears (the run's `sparsity.modules`) in place; returns their
    names."""
    converter = eval_converter(run_cfg)
    try:
        names = converter.convert(backbone)
    except ValueError as e:  # a pattern matching no linear, a shape the pruning cannot take
        raise EvalInputError(
            f"prune_mlp: cannot prune the teacher with the run's sparsity settings: {e}"
        ) from None
    logger.info(
        "teacher: %d linears (%s) now %s",
        len(names),
        run_cfg.sparsity.modules,
        converter.describe(),
    )
    return names
