"""2:4 (semi-structured) and block-sparse training of linear layers.

Typical use (the MLPs of a ViT, sparse for the first part of training, dense afterwards):

    from sparsity import swap_linear_modules, swap_to_dense
    swap_linear_modules(model, pattern=r"blocks\\.\\d+\\.mlp\\.fc[12]", backend="auto", pruning="tile_greedy")
    ...                         # train: each forward re-prunes W into a transposable 2:4 pattern (STE to W)
    swap_to_dense(model)        # same Parameter objects: optimizer state, EMA, DDP hooks untouched
    pruned_state_dict(model)    # (while sparse) the 2:4 network as plain weights, for a plain model to load

or the same as a model converter with a schedule: `SparseThenDense(sparse_steps,
backend=...).apply(model, step)` at every step (`convert(model)` / `revert(model)` by hand; its
keyword options are `ConverterOptions`' fields); `decisions()` says what the backends chose per
shape.

Modules: `SemiSparseLinear` (weight 2:4), `SemiSparseActivationLinear` (input 2:4),
`BlockSparseLinear`. Functions: `semi_sparse_linear`, `semi_sparse_activation_linear`,
`block_sparse_linear`. Pruning: `prune(w, method)`, `mvue`, `is_transposable`, `PRUNING_METHODS`;
backends: `get_backend(name)`. Importing this package imports nothing: each name loads its module on
first use (`sparsity.options`, the converter's choices and rules, never loads torch, so that a
config reader can check them cheaply); Triton loads with the first kernel, on CUDA tensors;
torchvision never. On Linux with a CPU-only torch, the first use of a name (or `import sparsity`
once torch is loaded) lets PyPI's torchvision, and so timm, import afterwards
(`sparsity.torchvision_compat`).
"""

import importlib
import sys

# name -> (module, attribute) of everything the package exports
_EXPORTS = {
    "compute_dtype_for": ("sparsity.autograd", "compute_dtype_for"),
    "semi_sparse_activation_linear": ("sparsity.autograd", "semi_sparse_activation_linear"),
    "semi_sparse_linear": ("sparsity.autograd", "semi_sparse_linear"),
    "BACKENDS": ("sparsity.options", "BACKENDS"),
    "Backend": ("sparsity.backends", "Backend"),
    "BackendSettings": ("sparsity.backends", "BackendSettings"),
    "BackendUnavailable": ("sparsity.backends", "BackendUnavailable"),
    "SparseWeight": ("sparsity.backends", "SparseWeight"),
    "available_backends": ("sparsity.backends", "available_backends"),
    "configure_backends": ("sparsity.backends", "configure_backends"),
    "get_backend": ("sparsity.backends", "get_backend"),
    "BlockSparseLinear": ("sparsity.block_sparse", "BlockSparseLinear"),
    "block_sparse_linear": ("sparsity.block_sparse", "block_sparse_linear"),
    "select_blocks": ("sparsity.block_sparse", "select_blocks"),
    "KINDS": ("sparsity.options", "KINDS"),
    "ConverterOptions": ("sparsity.options", "ConverterOptions"),
    "SparseThenDense": ("sparsity.converter", "SparseThenDense"),
    "build_converter": ("sparsity.converter", "build_converter"),
    "decisions": ("sparsity.backend_decisions", "decisions"),
    "SemiSparseActivationLinear": ("sparsity.modules", "SemiSparseActivationLinear"),
    "SemiSparseLinear": ("sparsity.modules", "SemiSparseLinear"),
    "PRUNING_METHODS": ("sparsity.options", "PRUNING_METHODS"),
    "is_transposable": ("sparsity.pruning", "is_transposable"),
    "mvue": ("sparsity.pruning", "mvue"),
    "prune": ("sparsity.pruning", "prune"),
    "soft_threshold_scale": ("sparsity.pruning", "soft_threshold_scale"),
    "SPARSE_LINEAR_TYPES": ("sparsity.swap", "SPARSE_LINEAR_TYPES"),
    "pruned_state_dict": ("sparsity.swap", "pruned_state_dict"),
    "set_sparse_backend": ("sparsity.swap", "set_sparse_backend"),
    "sparse_modules": ("sparsity.swap", "sparse_modules"),
    "swap_linear_modules": ("sparsity.swap", "swap_linear_modules"),
    "swap_linear_with_semi_sparse_linear": ("sparsity.swap", "swap_linear_with_semi_sparse_linear"),
    "swap_semi_sparse_linear_with_linear": ("sparsity.swap", "swap_semi_sparse_linear_with_linear"),
    "swap_to_dense": ("sparsity.swap", "swap_to_dense"),
}
__all__ = sorted(_EXPORTS)


def _let_torchvision_import() -> None:
    from sparsity.torchvision_compat import ensure_torchvision_importable

    ensure_torchvision_importable()


def __getattr__(name: str):
    if name not in _EXPORTS:
        try:  # a submodule not imported yet (`sparsity.backends` after a bare `import sparsity`)
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    if module != "sparsity.options":
        _let_torchvision_import()  # before the user's `import timm`, which imports torchvision
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_EXPORTS})


# torch is loaded already, so the shim costs nothing: a later `import timm` works
if "torch" in sys.modules:
    _let_torchvision_import()
