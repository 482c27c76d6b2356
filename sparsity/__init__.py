"""2:4 (semi-structured) and block-sparse training of linear layers.

Typical use (the MLPs of a ViT, sparse for the first part of training, dense afterwards):

    from sparsity import swap_linear_modules, swap_to_dense
    swap_linear_modules(model, pattern=r"blocks\\.\\d+\\.mlp\\.fc[12]", backend="auto", pruning="tile_greedy")
    ...                         # train: each forward re-prunes W into a transposable 2:4 pattern (STE to W)
    swap_to_dense(model)        # same Parameter objects: optimizer state, EMA, DDP hooks untouched
    pruned_state_dict(model)    # (while sparse) the 2:4 network as plain weights, for a plain model to load

or the same as a model converter with a schedule: `SparseThenDense(sparse_steps, backend=...).apply(model, step)`
at every step (`convert(model)` / `revert(model)` by hand); `decisions()` says what the backends chose per shape.

Modules: `SemiSparseLinear` (weight 2:4), `SemiSparseActivationLinear` (input 2:4), `BlockSparseLinear`.
Functions: `semi_sparse_linear`, `semi_sparse_activation_linear`, `block_sparse_linear`.
Pruning: `prune(w, method)`, `mvue`, `is_transposable`, `PRUNING_METHODS`; backends: `get_backend(name)`.
Importing this package does not import Triton (kernels load on first use, on CUDA tensors), nor torchvision; on
Linux with a CPU-only torch it lets PyPI's torchvision (and so timm) import afterwards (`sparsity.torchvision_compat`).
"""

from sparsity.autograd import compute_dtype_for, semi_sparse_activation_linear, semi_sparse_linear
from sparsity.backends import (
    BACKENDS,
    Backend,
    BackendSettings,
    BackendUnavailable,
    SparseWeight,
    available_backends,
    configure_backends,
    get_backend,
)
from sparsity.block_sparse import BlockSparseLinear, block_sparse_linear, select_blocks
from sparsity.converter import KINDS, SparseThenDense, build_converter
from sparsity.decisions import decisions
from sparsity.modules import SemiSparseActivationLinear, SemiSparseLinear
from sparsity.pruning import METHODS as PRUNING_METHODS
from sparsity.pruning import is_transposable, mvue, prune, soft_threshold_scale
from sparsity.swap import (
    SPARSE_LINEAR_TYPES,
    pruned_state_dict,
    set_sparse_backend,
    sparse_modules,
    swap_linear_modules,
    swap_linear_with_semi_sparse_linear,
    swap_semi_sparse_linear_with_linear,
    swap_to_dense,
)
from sparsity.torchvision_compat import ensure_torchvision_importable

# None of the modules above imports torchvision; this only prepares a later `import timm` / `import torchvision`.
ensure_torchvision_importable()

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendSettings",
    "BackendUnavailable",
    "BlockSparseLinear",
    "KINDS",
    "PRUNING_METHODS",
    "SPARSE_LINEAR_TYPES",
    "SemiSparseActivationLinear",
    "SemiSparseLinear",
    "SparseThenDense",
    "SparseWeight",
    "available_backends",
    "block_sparse_linear",
    "build_converter",
    "compute_dtype_for",
    "configure_backends",
    "decisions",
    "get_backend",
    "is_transposable",
    "mvue",
    "prune",
    "pruned_state_dict",
    "select_blocks",
    "semi_sparse_activation_linear",
    "semi_sparse_linear",
    "set_sparse_backend",
    "soft_threshold_scale",
    "sparse_modules",
    "swap_linear_modules",
    "swap_linear_with_semi_sparse_linear",
    "swap_semi_sparse_linear_with_linear",
    "swap_to_dense",
]
