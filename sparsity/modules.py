"""Drop-in `nn.Linear` subclasses whose weight (or input) is pruned 2:4 on every forward.

Swapping to and from these modules shares the *same* Parameter objects (`from_dense` / `to_dense`),
so optimizer state, EMA copies, DDP's parameter hooks and `state_dict` keys are untouched. One
exception to "keys identical to nn.Linear": with pruning="soft_threshold" the module holds S-STE's
per-tensor scale in the persistent buffer ``soft_threshold_scale`` (0-d fp32), computed from the
weight when the module is created, so a resumed run uses the stored value. Loading a state dict
without that key (e.g. one saved from nn.Linear) recomputes it from the loaded weight.
"""

from __future__ import annotations

import torch
from torch import nn

from sparsity.autograd import semi_sparse_activation_linear, semi_sparse_linear
from sparsity.backends import check_backend_name, get_backend
from sparsity.mvue_grad import check_weight_grad
from sparsity.pruning import check_method, check_shape, soft_threshold_scale

SCALE_BUFFER = "soft_threshold_scale"


def _share_linear_state(src: nn.Linear, dst: nn.Module) -> None:
    """Make dst use src's Parameters (the same objects), features and train/eval flag."""
    dst.in_features = src.in_features
    dst.out_features = src.out_features
    dst.weight = src.weight
    dst.register_parameter("bias", src.bias)
    dst.train(src.training)


def linear_to_dense(m: nn.Linear) -> nn.Linear:
    """A plain nn.Linear holding m's Parameters (the same objects)."""
    lin = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(lin)
    _share_linear_state(m, lin)
    return lin


class SparseLinearMixin:
    """Conversion between nn.Linear and an nn.Linear subclass that adds its state in
    `_init_sparse(**opts)` and lists it in `_SPARSE_ATTRS` / `_SPARSE_BUFFERS` (so that it can be
    stripped again).

    Two ways, both sharing the Parameter objects: a new module object (default), or `inplace=True`,
    which changes the class of the given module object itself (a plain nn.Linear) and back. In-place
    keeps the module's identity, so whatever holds a reference to it keeps working: FSDP's
    per-module parameter bookkeeping, forward hooks, names in other containers. The swap functions
    use in-place conversion for plain nn.Linear modules.
    """

    _SPARSE_ATTRS: tuple[str, ...] = ()
    _SPARSE_BUFFERS: tuple[str, ...] = ()

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        **opts,
    ):
        """Like nn.Linear(...); the keyword options go to `_init_sparse`."""
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._init_sparse(**opts)

    def _init_sparse(self, **opts) -> None:
        raise NotImplementedError

    @classmethod
    def from_dense(cls, linear: nn.Linear, *, inplace: bool = False, **opts):
        """A module of this class holding `linear`'s Parameters (the same objects); with
        inplace=True, `linear` itself (which must be a plain nn.Linear) turned into this class."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"{cls.__name__}.from_dense needs an nn.Linear, got {type(linear).__name__}"
            )
        if inplace:
            if type(linear) is not nn.Linear:
                raise TypeError(
                    f"in-place conversion needs a plain nn.Linear, got {type(linear).__name__}"
                )
            linear.__class__ = cls
            try:
                linear._init_sparse(**opts)
            except BaseException:
                linear._strip_sparse()
                linear.__class__ = nn.Linear
                raise
            return linear
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        _share_linear_state(linear, m)
        m._init_sparse(**opts)
        return m

    def to_dense(self, *, inplace: bool = False) -> nn.Linear:
        """A plain nn.Linear holding this module's Parameters (the same objects); with inplace=True
        this module object itself, its sparse state (attributes, extra buffers) removed."""
        if inplace:
            self._strip_sparse()
            self.__class__ = nn.Linear
            return self
        return linear_to_dense(self)

    def _strip_sparse(self) -> None:
        for name in self._SPARSE_BUFFERS:
            self._buffers.pop(name, None)
            self._non_persistent_buffers_set.discard(name)
        for name in self._SPARSE_ATTRS:
            self.__dict__.pop(name, None)


class _SparseLinearBase(SparseLinearMixin, nn.Linear):
    default_pruning = "tile_greedy"
    _SPARSE_ATTRS = ("backend", "pruning")

    def _init_sparse(self, *, backend: str = "dense", pruning: str | None = None, **opts) -> None:
        """backend, pruning (default: the class's default_pruning) and the class's other `configure`
        options."""
        self.configure(backend=backend, pruning=pruning or self.default_pruning, **opts)

    def _check_pruning(self, pruning: str) -> None:
        raise NotImplementedError

    def configure(self, *, backend: str | None = None, pruning: str | None = None) -> None:
        if backend is not None:
            check_backend_name(backend)
            get_backend(backend)  # fails now (BackendUnavailable) rather than at the first forward
            self.backend = backend
        if pruning is not None:
            self._check_pruning(check_method(pruning))
            self.pruning = pruning

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend}, pruning={self.pruning}"


class SemiSparseLinear(_SparseLinearBase):
    """nn.Linear with its weight pruned 2:4 every forward (`sparsity.autograd.semi_sparse_linear`).

    backend: "dense" | "cusparselt" | "cutlass" | "auto"; pruning: "tile_greedy" |
    "tile_greedy_signed" (torchao's order, by signed value) | "tile_optimal" (transposable: both
    GEMMs sparse) | "rowwise" | "soft_threshold" (input-gradient GEMM dense); masked_grad: multiply
    the straight-through weight gradient by the mask; weight_grad: "dense" | "mvue24" (the weight
    gradient from the MVUE 2:4-sparse output gradient, `sparsity.mvue_grad`).
    """

    masked_grad = False
    weight_grad = "dense"
    _SPARSE_ATTRS = ("backend", "pruning", "masked_grad", "weight_grad")
    _SPARSE_BUFFERS = (SCALE_BUFFER,)

    def configure(
        self,
        *,
        backend: str | None = None,
        pruning: str | None = None,
        masked_grad: bool | None = None,
        weight_grad: str | None = None,
    ) -> None:
        super().configure(backend=backend, pruning=pruning)
        if masked_grad is not None:
            self.masked_grad = bool(masked_grad)
        if weight_grad is not None:
            self.weight_grad = check_weight_grad(weight_grad)
        if pruning is not None:
            self._sync_scale_buffer()

    def _check_pruning(self, pruning: str) -> None:
        try:
            check_shape(self.weight.shape, pruning)
        except ValueError as e:
            raise ValueError(
                f"{type(self).__name__}: weight (out, in) = {tuple(self.weight.shape)}: {e}"
            ) from None

    def _sync_scale_buffer(self) -> None:
        if self.pruning == "soft_threshold":
            if getattr(self, SCALE_BUFFER, None) is None:
                self.register_buffer(
                    SCALE_BUFFER, self.compute_soft_threshold_scale(), persistent=True
                )
        elif SCALE_BUFFER in self._buffers:
            del self._buffers[SCALE_BUFFER]

    @torch.no_grad()
    def compute_soft_threshold_scale(self) -> torch.Tensor:
        return soft_threshold_scale(self.weight)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, *args
    ):
        key = prefix + SCALE_BUFFER
        recompute = self.pruning == "soft_threshold" and key not in state_dict
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, *args
        )
        if recompute:
            if key in missing_keys:
                missing_keys.remove(key)
            getattr(self, SCALE_BUFFER).copy_(self.compute_soft_threshold_scale())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return semi_sparse_linear(
            x,
            self.weight,
            self.bias,
            backend=self.backend,
            pruning=self.pruning,
            masked_grad=self.masked_grad,
            scale=getattr(self, SCALE_BUFFER) if self.pruning == "soft_threshold" else None,
            weight_grad=self.weight_grad,
        )

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + (", masked_grad=True" if self.masked_grad else "")
            + (f", weight_grad={self.weight_grad}" if self.weight_grad != "dense" else "")
        )


class SemiSparseActivationLinear(_SparseLinearBase):
    """nn.Linear whose *input* is pruned 2:4 along features every forward (torchao's
    SemiSparseActivationLinear): y = x_s @ W^T + b, straight-through gradient to x. pruning defaults
    to "rowwise" (any number of tokens)."""

    default_pruning = "rowwise"

    def _check_pruning(self, pruning: str) -> None:
        if pruning == "soft_threshold":
            raise ValueError(
                "SemiSparseActivationLinear: soft_threshold is a weight method (S-STE); use rowwise"
            )
        try:
            check_shape((4, self.in_features), pruning)
        except ValueError as e:
            raise ValueError(
                f"{type(self).__name__}: in_features = {self.in_features}: {e}"
            ) from None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return semi_sparse_activation_linear(
            x, self.weight, self.bias, backend=self.backend, pruning=self.pruning
        )
