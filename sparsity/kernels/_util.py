"""Helpers shared by the kernel modules (imports Triton)."""

from __future__ import annotations

import os

import torch
import triton  # noqa: F401  (kernel modules import this module first)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_launchable(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if not (t.is_cuda or interpreting()):
            raise RuntimeError(
                f"Triton kernels need CUDA tensors (got {t.device}); on CPU set TRITON_INTERPRET=1 before importing "
                "sparsity.kernels, or use the torch references (sparsity.pruning.reference)"
            )
        if t.numel() >= 2**31:
            raise ValueError(f"tensor of {t.numel()} elements is too large for the int32 indexing of these kernels")
