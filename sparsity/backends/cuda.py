"""Small CUDA helpers shared by the cuSPARSELt backend and the fused cuBLASLt weight gradient."""

from __future__ import annotations

import torch

# The raw cudaStream_t of the current stream of a device, as an int: torch's private fast path where
# it exists (a Stream object costs microseconds of host time per call), else the public one.
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda idx: torch.cuda.current_stream(idx).cuda_stream
)


def device_index(device: torch.device) -> int:
    """The CUDA device index of `device` (the current device when it has none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of a against the reference b (in fp32)."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
