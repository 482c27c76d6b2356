"""Helpers shared by the kernel modules (imports Triton)."""

from __future__ import annotations

import os

import torch
import triton  # noqa: F401  (kernel modules import this module first)


# TRITON_INTERPRET is Triton's own switch (its CPU interpreter), not a setting of this package: Triton reads it when a
# kernel is decorated, i.e. when the kernel modules are imported, and the kernels' launch wrappers must agree with
# Triton about it (CUDA tensors required or not, block sizes). The only environment read in `sparsity`: once, here
# (the wrappers ask on every launch, and an environment lookup costs host time).
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 when the kernels were imported)."""
    return _INTERPRETING


def check_launchable(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if not (t.is_cuda or interpreting()):
            raise RuntimeError(
                f"Triton kernels need CUDA tensors (got {t.device}); on CPU set TRITON_INTERPRET=1 before importing "
                "sparsity.kernels, or use the torch references (sparsity.pruning.reference)"
            )
        if t.numel() >= 2**31:
            raise ValueError(f"tensor of {t.numel()} elements is too large for the int32 indexing of these kernels")
