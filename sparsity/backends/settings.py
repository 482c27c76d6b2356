"""How the GEMM backends run: `BackendSettings`, what a backend gets in its constructor.

A training run fills it from its config (`sparsity.cslt_search`, `sparsity.cslt_pack`,
`sparsity.fused_wgrad`: the schema takes its valid values from the tuples below), a library user
passes one to `sparsity.backends.configure_backends` (or to a backend's constructor). Nothing here
is read from the environment.

    cslt_search   how cuSPARSELt's algorithm is chosen, once per GEMM shape (`cusparselt.search`):
                  "sweep" (default) every algorithm id checked against the dense product and timed, the fastest
                  correct one kept; ids known to crash the GPU on this (arch, cuSPARSELt version, dtype) are never
                  run, and where no such list exists the default algorithm is used; "sweep_unsafe" sweeps there
                  too; "library" cusparseLtMatmulSearch, its winner checked once; "none" the library's default.
    cslt_pack     how W is compressed for cuSPARSELt (`cusparselt.packing`): "auto" (default) the fused Triton
                  packer where its byte layout is validated or matches the library's at a start-up probe, else the
                  library compressor; "triton" the packer without the check; "library" always the library's.
    fused_wgrad   the weight gradient of a sparse layer as one cuBLASLt call that also reduces the bias gradient
                  and writes fp32 (`sparsity.weight_grad`; eager CUDA only, timed against the torch ops per shape
                  and used only where faster); False: always the torch ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparsity.options import CSLT_PACK_MODES, CSLT_SEARCH_MODES, ConverterOptions


@dataclass(frozen=True)
class BackendSettings:
    cslt_search: str = ConverterOptions.cslt_search  # the converter's defaults, declared there once
    cslt_pack: str = ConverterOptions.cslt_pack
    fused_wgrad: bool = ConverterOptions.fused_wgrad

    def __post_init__(self):
        for name, choices in (("cslt_search", CSLT_SEARCH_MODES), ("cslt_pack", CSLT_PACK_MODES)):
            v = getattr(self, name)
            if v not in choices:
                raise ValueError(f"{name}={v!r} is not one of {', '.join(choices)}")
        if not isinstance(self.fused_wgrad, bool):
            raise ValueError(f"fused_wgrad={self.fused_wgrad!r} is not a bool")
