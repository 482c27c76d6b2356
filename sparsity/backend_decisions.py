"""What the sparse layers decided in this process, per GEMM shape, as one JSON-ready dict
(`decisions()`).

Choices made at run time by timing, which a run cannot reproduce from its config alone: `auto`'s
sparse-or-dense choice per GEMM shape (eager and compiled), the devices on which it runs dense for
every layer, the cuSPARSELt algorithm chosen per GEMM, how cuSPARSELt operands are packed per
(device, dtype), and whether the fused cuBLASLt weight gradient or the torch ops run per shape. A
training run writes it into its run directory (`sparsity_decisions.json`) once they are made.
"""

from __future__ import annotations

import dataclasses

from sparsity import weight_grad
from sparsity.backends import backend_settings, built_backends
from sparsity.backends.cusparselt.packing import layout_records
from sparsity.backends.cusparselt.search import plan_records


def decisions() -> dict:
    """{"settings", "auto" (one record per GEMM shape), "auto_fallbacks", "cusparselt_plans",
    "cusparselt_packing", "weight_grad" (one record per shape)}: everything decided so far (empty
    where nothing was)."""
    auto = built_backends().get("auto")
    described = auto.describe() if auto is not None else {"decisions": [], "fallbacks": []}
    return {
        "settings": dataclasses.asdict(backend_settings()),
        "auto": described["decisions"],
        "auto_fallbacks": described["fallbacks"],
        "cusparselt_plans": plan_records(),
        "cusparselt_packing": layout_records(),
        "weight_grad": weight_grad.decisions(),
    }
