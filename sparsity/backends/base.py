"""The contract between the sparse autograd functions and the GEMM backends.

A backend turns a dense weight W (out x in, in the compute dtype) into a `SparseWeight`: W pruned to
a transposable 2:4 pattern and packed however its GEMMs want it, for both products a linear layer
needs:

    forward        y  = x  @ W_s^T     (`SparseWeight.matmul`)
    input grad     dx = dy @ W_s       (`SparseWeight.matmul_t`: W_s^T is 2:4 too, because the pattern is
                                        transposable; backends keep a second packed copy for it)

The weight gradient dW = dy^T @ x is always a dense GEMM and is done by the autograd function, not
here.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass

import torch

from .settings import BackendSettings


class BackendUnavailable(RuntimeError):
    """A backend was asked for on a device, dtype or shape it cannot serve; the message says why."""


class SparseWeight(abc.ABC):
    """A weight pruned to 2:4 and packed for one backend."""

    shape: torch.Size  # (out_features, in_features) of the dense weight

    @abc.abstractmethod
    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (tokens, in) -> x @ W_s^T + bias (tokens, out), in x's dtype; bias may come in any
        float dtype (e.g. the fp32 master bias under autocast): the backend casts it where its GEMM
        needs it."""

    @abc.abstractmethod
    def matmul_t(self, dy: torch.Tensor) -> torch.Tensor:
        """dy (tokens, out) -> dy @ W_s (tokens, in)."""

    @abc.abstractmethod
    def to_dense(self) -> torch.Tensor:
        """The pruned weight as a dense (out, in) tensor: zeros where pruned."""

    @abc.abstractmethod
    def mask(self) -> torch.Tensor:
        """Boolean (out, in): True where W is kept."""


class Backend(abc.ABC):
    """A way to run the two sparse GEMMs of a linear layer, configured by the `BackendSettings` it
    is built with."""

    name: str = ""
    settings: BackendSettings = (
        BackendSettings()
    )  # the defaults, for subclasses that do not call __init__

    def __init__(self, settings: BackendSettings | None = None):
        self.settings = settings if settings is not None else BackendSettings()

    def settings_dict(self) -> dict:
        return dataclasses.asdict(self.settings)

    @abc.abstractmethod
    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raise `BackendUnavailable` with a clear reason if this backend cannot run here."""

    @abc.abstractmethod
    def sparsify(self, weight: torch.Tensor, pruning: str) -> SparseWeight:
        """Prune `weight` (out, in) with the named transposable method and pack it. Called every
        step."""

    def mvue_weight_grad(self, dy: torch.Tensor, x: torch.Tensor, seed: int) -> torch.Tensor | None:
        """dW = MVUE(dy^T) @ x on this backend's sparse GEMM where it has one for these operands
        (`sparsity.mvue_grad` says which tokens are pruned), else None: the caller runs the dense
        GEMM on the pruned operand."""
        return None

    def describe(self) -> dict:
        """What this backend decided (e.g. `auto`'s per-shape choices), for the run log."""
        return {"backend": self.name}


@dataclass(frozen=True)
class GemmKey:
    """What a cached plan or timing decision is keyed by."""

    tokens: int
    in_features: int
    out_features: int
    dtype: torch.dtype
    device_index: int


def cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """t in dtype (t itself when it already is, or None): a no-op .to() still costs host time on the
    hot path."""
    return t if t is None or t.dtype == dtype else t.to(dtype)
