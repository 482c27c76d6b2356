"""The converter's options: their names, defaults, choices and the rules between them
(`ConverterOptions`), in one place that imports nothing (no torch), so that a config reader can
check a `sparsity` section without loading the library, and a training config's `sparsity` section
extends them instead of declaring them again.

The modules that act on an option take its choices from here (`sparsity.backends.BACKENDS` is this
module's `BACKENDS`); `SparseThenDense` raises `options_problem`'s message, and a training config's
checks report it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

KINDS = (
    "weight",
    "activation",
    "block",
)  # SemiSparseLinear | SemiSparseActivationLinear | BlockSparseLinear
BACKENDS = ("dense", "cusparselt", "cutlass", "auto")
PRUNING_METHODS = ("tile_greedy", "tile_greedy_signed", "tile_optimal", "rowwise", "soft_threshold")
WEIGHT_GRADS = ("dense", "mvue24")
PRUNED_GRADS = (
    "ste",
    "masked",
)  # what a pruned entry's gradient is: the dense straight-through one | none
CSLT_SEARCH_MODES = ("sweep", "sweep_unsafe", "library", "none")
CSLT_PACK_MODES = ("auto", "triton", "library")
# rescales the kept entries: its zeros are not a mask the pruned-entry remedies assume
NOT_MASKING = "soft_threshold"
DEFAULT_MODULES = r"blocks\.\d+\.mlp\.fc[12]"  # a ViT's MLP linears


def _option(default, **meta):
    """A field with `meta` as its metadata: its valid values ("choices", or bounds "gt", "ge", "le")
    and, with "execution": True, that it changes how the layers run, not what they compute (a run
    may resume with another)."""
    return field(default=default, metadata=meta)


@dataclass
class ConverterOptions:
    """What `SparseThenDense` converts and how: its keyword options, each declared here once with
    its default."""

    modules: str = (
        DEFAULT_MODULES  # regex over module names (full match); glob if it starts with glob:
    )
    # weight (SemiSparseLinear: 2:4 weight) | activation (SemiSparseActivationLinear: 2:4 input) |
    # block (BlockSparseLinear: block_density of the weight's block_size x block_size blocks;
    # backend, pruning unused)
    kind: str = _option("weight", choices=KINDS)
    # the GEMMs of a 2:4 layer: auto (per GEMM shape the faster of cusparselt and dense, timed once;
    # its choices are written to the run's sparsity_decisions.json) | cusparselt | cutlass (A100) |
    # dense (the pruned weight dense)
    backend: str = _option("auto", choices=BACKENDS, execution=True)
    # tile_greedy (4x4 tiles, largest |w| first) | tile_greedy_signed (largest w first: torch's
    # default, which torchao's SemiSparseLinear used) | tile_optimal | rowwise | soft_threshold
    # (sparsity/pruning/reference.py)
    pruning: str = _option("tile_greedy", choices=PRUNING_METHODS)
    # kind=weight: the weight gradient dy^T @ x as is (dense) or from the MVUE 2:4-sparse dy^T
    # (mvue24: unbiased, sparsity/mvue_grad.py; on the 2:4 tensor cores with backend cusparselt or
    # auto; compiled on those alone)
    weight_grad: str = _option("dense", choices=WEIGHT_GRADS)
    # with weight_grad=mvue24: which of the converted linears take it (a pattern as `modules`; the
    # others keep the dense weight gradient). MVUE pays per GEMM shape: on one H200 at ViT-L's it
    # speeds up fc2's and slows fc1's (results/bench/NOTES.md), so `.*\.fc2` there
    weight_grad_modules: str = ".*"
    # kind=weight: the gradient of the entries the 2:4 mask drops: ste (the dense straight-through
    # gradient, the published recipe) | masked (none: AdamW's weight decay alone moves them)
    # (sparsity/pruned_entries.py)
    pruned_grad: str = _option("ste", choices=PRUNED_GRADS)
    # kind=weight, a masking pruning: in the sparse phase, after clipping and before AdamW, grad +=
    # pruned_decay * (1 - mask) * W (SR-STE's masked decay, on the gradient as Hu et al. 2024); 0 =
    # off (the published recipe). metrics.jsonl's pruned_grad_to_weight is the strength at which the
    # decay equals the gradient
    pruned_decay: float = _option(0.0, ge=0)
    # How the GEMM backends run (sparsity/backends/settings.py says each value): how cuSPARSELt
    # chooses a shape's algorithm, how W is compressed for it, and whether the weight gradient is
    # one cuBLASLt call
    cslt_search: str = _option("sweep", choices=CSLT_SEARCH_MODES, execution=True)
    cslt_pack: str = _option("auto", choices=CSLT_PACK_MODES, execution=True)
    fused_wgrad: bool = _option(True, execution=True)
    block_density: float = _option(
        0.5, gt=0, le=1
    )  # kind=block: fraction of the weight's blocks kept and trained
    block_size: int = _option(
        32, ge=1
    )  # kind=block: side of a block; must divide both dims of every converted linear

    def converter_problem(self) -> str | None:
        """`options_problem` of these options."""
        return options_problem(
            kind=self.kind,
            backend=self.backend,
            pruning=self.pruning,
            weight_grad=self.weight_grad,
            pruned_grad=self.pruned_grad,
            pruned_decay=self.pruned_decay,
            block_density=self.block_density,
            block_size=self.block_size,
        )


def options_problem(
    *,
    kind: str,
    backend: str,
    pruning: str,
    weight_grad: str,
    pruned_grad: str,
    pruned_decay: float,
    block_density: float,
    block_size: int,
) -> str | None:
    """What is wrong with these converter options, as one message naming the `sparsity.` config
    keys, or None: the library's one statement of its rules, which `SparseThenDense` raises and the
    training config's checks report."""
    for key, v, choices in (
        ("kind", kind, KINDS),
        ("backend", backend, BACKENDS),
        ("pruning", pruning, PRUNING_METHODS),
        ("weight_grad", weight_grad, WEIGHT_GRADS),
        ("pruned_grad", pruned_grad, PRUNED_GRADS),
    ):
        if v not in choices:
            return f"sparsity.{key}={v!r} is not one of {', '.join(choices)}"
    if weight_grad != "dense" and kind != "weight":
        return (
            f"sparsity.weight_grad={weight_grad} applies to sparsity.kind=weight only, not {kind}"
        )
    problem = pruned_decay_problem(pruned_decay, pruning)
    if problem:
        return problem
    if (pruned_grad != "ste" or pruned_decay) and kind != "weight":
        return (
            f"sparsity.pruned_grad={pruned_grad} and sparsity.pruned_decay={pruned_decay:g} apply "
            f"to "
            f"sparsity.kind=weight only, not {kind}"
        )
    if not 0.0 < block_density <= 1.0:
        return f"sparsity.block_density={block_density} must be in (0, 1]"
    if int(block_size) != block_size or block_size < 1:
        return f"sparsity.block_size={block_size} must be a positive integer"
    return None


def pruned_decay_problem(strength: float, pruning: str) -> str | None:
    """The masked decay's strength must be a finite number >= 0, and 0 with a method that does not
    mask."""
    if not (float(strength) >= 0 and math.isfinite(strength)):
        return f"sparsity.pruned_decay={strength} must be a finite number >= 0"
    if strength and pruning == NOT_MASKING:
        return (
            f"sparsity.pruned_decay={strength:g} needs a masking sparsity.pruning, not {pruning} "
            f"(S-STE "
            "shrinks the kept entries instead of masking)"
        )
    return None
