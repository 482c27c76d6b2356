"""The converter's options: their choices and the rules between them, in one place that imports nothing (no torch),
so that a config reader can check a `sparsity` section without loading the library.

The modules that act on an option take its choices from here (`sparsity.backends.BACKENDS` is this module's
`BACKENDS`); `SparseThenDense` raises `options_problem`'s message, and a training config's checks report it.
"""

from __future__ import annotations

import math

KINDS = ("weight", "activation", "block")  # SemiSparseLinear | SemiSparseActivationLinear | BlockSparseLinear
BACKENDS = ("dense", "cusparselt", "cutlass", "auto")
PRUNING_METHODS = ("tile_greedy", "tile_greedy_signed", "tile_optimal", "rowwise", "soft_threshold")
WEIGHT_GRADS = ("dense", "mvue24")
PRUNED_GRADS = ("ste", "masked")  # what a pruned entry's gradient is: the dense straight-through one | none
CSLT_SEARCH_MODES = ("sweep", "sweep_unsafe", "library", "none")
CSLT_PACK_MODES = ("auto", "triton", "library")
NOT_MASKING = "soft_threshold"  # rescales the kept entries: its zeros are not a mask the pruned-entry remedies assume


def options_problem(*, kind: str, backend: str, pruning: str, weight_grad: str, pruned_grad: str,
                    pruned_decay: float, block_density: float, block_size: int) -> str | None:
    """What is wrong with these converter options, as one message naming the `sparsity.` config keys, or None: the
    library's one statement of its rules, which `SparseThenDense` raises and the training config's checks report."""
    for key, v, choices in (("kind", kind, KINDS), ("backend", backend, BACKENDS),
                            ("pruning", pruning, PRUNING_METHODS), ("weight_grad", weight_grad, WEIGHT_GRADS),
                            ("pruned_grad", pruned_grad, PRUNED_GRADS)):
        if v not in choices:
            return f"sparsity.{key}={v!r} is not one of {', '.join(choices)}"
    if weight_grad != "dense" and kind != "weight":
        return f"sparsity.weight_grad={weight_grad} applies to sparsity.kind=weight only, not {kind}"
    problem = pruned_decay_problem(pruned_decay, pruning)
    if problem:
        return problem
    if (pruned_grad != "ste" or pruned_decay) and kind != "weight":
        return (f"sparsity.pruned_grad={pruned_grad} and sparsity.pruned_decay={pruned_decay:g} apply to "
                f"sparsity.kind=weight only, not {kind}")
    if not 0.0 < block_density <= 1.0:
        return f"sparsity.block_density={block_density} must be in (0, 1]"
    if int(block_size) != block_size or block_size < 1:
        return f"sparsity.block_size={block_size} must be a positive integer"
    return None


def pruned_decay_problem(strength: float, pruning: str) -> str | None:
    """The masked decay's strength must be a finite number >= 0, and 0 with a method that does not mask."""
    if not (float(strength) >= 0 and math.isfinite(strength)):
        return f"sparsity.pruned_decay={strength} must be a finite number >= 0"
    if strength and pruning == NOT_MASKING:
        return (f"sparsity.pruned_decay={strength:g} needs a masking sparsity.pruning, not {pruning} (S-STE "
                "shrinks the kept entries instead of masking)")
    return None
