"""Sparse-then-dense: the student's MLP linears are 2:4-sparse for the first `sparse_steps`, then dense.

Only the student backbone changes; the teacher (an EMA of the dense master weights) always runs dense. Swapping
shares the Parameter objects, so the optimizer state, the EMA and the checkpoints never see the difference.
"""

import logging

from torch import nn

from configs.schema import SparsityConfig
from sparsity import SemiSparseActivationLinear, SemiSparseLinear, get_backend, swap_linear_modules, swap_to_dense

logger = logging.getLogger(__name__)

SPARSE, DENSE = "sparse", "dense"


class SparseSchedule:
    def __init__(self, cfg: SparsityConfig, sparse_steps: int):
        self.cfg = cfg
        self.sparse_steps = sparse_steps
        self.current = DENSE
        self.swapped: list[str] = []

    def auto_summary(self) -> dict:
        """For the metrics, in the sparse phase with backend `auto`: how many GEMM shapes it has decided, and how many
        of them run sparse in eager code (`choice`) and in compiled code (`choice_graph`, decided by device time).
        Each decision is also logged when it is made."""
        if self.current != SPARSE or self.cfg.backend != "auto":
            return {}
        decisions = get_backend("auto").describe()["decisions"]
        return {"auto_shapes": len(decisions),
                "auto_sparse_eager": sum(d["choice"] == "cusparselt" for d in decisions),
                "auto_sparse_compiled": sum(d["choice_graph"] == "cusparselt" for d in decisions)}

    def phase_at(self, step: int) -> str:
        return SPARSE if step < self.sparse_steps else DENSE

    def apply(self, backbone: nn.Module, step: int) -> bool:
        """Put `backbone` in the phase of `step`; True if it changed."""
        return self.set_phase(backbone, self.phase_at(step), step)

    def set_phase(self, backbone: nn.Module, wanted: str, step: int) -> bool:
        if wanted not in (SPARSE, DENSE):
            raise ValueError(f"unknown sparsity phase {wanted!r}")
        if wanted == self.current:
            return False
        if wanted == SPARSE:
            module_cls = SemiSparseLinear if self.cfg.kind == "weight" else SemiSparseActivationLinear
            self.swapped = swap_linear_modules(
                backbone,
                pattern=self.cfg.modules,
                module_cls=module_cls,
                backend=self.cfg.backend,
                pruning=self.cfg.pruning,
            )
            logger.info(
                "step %d: %d linears now 2:4-sparse (%s, backend=%s, pruning=%s)",
                step, len(self.swapped), self.cfg.kind, self.cfg.backend, self.cfg.pruning,
            )
        else:
            swap_to_dense(backbone)
            logger.info("step %d: sparse -> dense switch, %d linears dense again", step, len(self.swapped))
        self.current = wanted
        return True
