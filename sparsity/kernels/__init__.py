"""Triton kernels of the sparsity package. Importing this package does not import Triton; its
modules do:

- `prune`        rowwise / soft_threshold (groups of 4) and tile_greedy / tile_optimal (4x4 tiles)
  pruning,
                 bit-identical to `sparsity.pruning.reference`;
- `mvue`         MVUE 2:4 (unbiased stochastic pruning of gradients), bit-identical to
  `reference.mvue24`;
- `block_sparse` block-sparse GEMMs (forward, input grad, kept-block weight grad) for
  `sparsity.block_sparse`.

On CPU they run only under TRITON_INTERPRET=1 (set before the first import of these modules); the
package's production code uses the torch references on CPU. Block sizes are chosen large when
interpreting (few programs).
"""
