"""Helpers shared by the kernel modules (imports Triton)."""

from __future__ import annotations

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _decorated_like_the_kernels():
    pass


# Whether Triton runs kernels in its CPU interpreter (its own TRITON_INTERPRET switch, applied when
# a kernel is decorated, i.e. when the kernel modules are imported). Asked of Triton through a
# function decorated the same way at the same time, so the launch wrappers (CUDA tensors required or
# not, block sizes) agree with it by construction and this package reads no environment variable;
# computed once, as the wrappers ask on every launch.
_INTERPRETING = isinstance(_decorated_like_the_kernels, InterpretedFunction)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1 when the kernels
    were imported)."""
    return _INTERPRETING


def check_launchable(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if not (t.is_cuda or interpreting()):
            raise RuntimeError(
                f"Triton kernels need CUDA tensors (got {t.device}); on CPU set TRITON_INTERPRET=1 "
                f"before importing "
                "sparsity.kernels, or use the torch references (sparsity.pruning.reference)"
            )
        if t.numel() >= 2**31:
            raise ValueError(
                f"tensor of {t.numel()} elements is too large for the int32 indexing of these "
                f"kernels"
            )
