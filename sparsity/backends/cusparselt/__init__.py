"""The cuSPARSELt backend, in layers whose imports point only down:

library      nvmath's cuSPARSELt bindings loaded, version, one handle per device and thread
compressor   the structured operand's layout, the library's compressor plans        one GEMM plan
(descriptors, algorithm, workspace), built once per shape search       which algorithm a shape runs
(setting `cslt_search`), the per-thread plan cache packing      the fused Triton packer or the
library's compressor (setting `cslt_pack`) ops          the GEMMs and the prune + pack as
torch.library operators (what torch.compile traces call) backend      `CuSparseLtBackend` /
`CuSparseLtSparseWeight`: the `Backend` contract on top of them
"""

from .backend import DTYPES, CuSparseLtBackend, CuSparseLtSparseWeight
from .packing import VALIDATED_LAYOUTS, layout_status, probe_layout

__all__ = [
    "DTYPES",
    "VALIDATED_LAYOUTS",
    "CuSparseLtBackend",
    "CuSparseLtSparseWeight",
    "layout_status",
    "probe_layout",
]
