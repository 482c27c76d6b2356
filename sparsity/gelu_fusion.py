"""GELU taken into a 2:4 linear: where a converted `fc1` is followed by its parent's GELU (timm's `Mlp`: fc1, act,
drop1, norm, fc2), `fuse_gelu` makes `fc1` return GELU of its output (`SemiSparseLinear.gelu`) and sets the parent's
`act` to nn.Identity: the same function, but where no gradient is asked (an EMA teacher) cuSPARSELt applies GELU in
the GEMM's epilogue, which saves a read and a write of the hidden activations (tokens x 4 * dim) per block. With a
gradient, the layer applies the module's own GELU after the GEMM, as before. `unfuse_gelu` puts the GELU modules back
(`swap_to_dense` does it first).

    fuse_gelu(model)               # after swap_linear_modules; returns the fc1 names
    fuse_gelu(model, parents=(MyMlp,))   # your own MLP class, whose forward applies `act` right after `fc1`

Only parents whose forward applies `act` to the whole of `fc1`'s output qualify: a GLU MLP, which splits it
first, must not be fused. So the parents are named, not guessed: timm's `Mlp` by default.
"""

from __future__ import annotations

from torch import nn

from sparsity.modules import SemiSparseLinear

FC1, ACT = "fc1", "act"
TIMM_MLP = "timm.layers.mlp.Mlp"  # by name: the library does not import timm
_UNFUSED = "_unfused_act"  # the parent's GELU module, kept on fc1 (not as a submodule: the module tree is unchanged)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _fusable(parent: nn.Module, parents: tuple[type, ...]) -> bool:
    if parents:
        return isinstance(parent, parents)
    return _qualified(type(parent)) == TIMM_MLP


def fuse_gelu(model: nn.Module, parents: tuple[type, ...] = ()) -> list[str]:
    """Fuse every parent's (timm `Mlp`, or an instance of `parents`) exact `nn.GELU` `act` into its 2:4 `fc1`
    (a SemiSparseLinear); returns the fc1 names. Parents whose fc1 is not 2:4, or whose act is not nn.GELU, are left
    as they are."""
    names = []
    for name, parent in model.named_modules():
        fc1, act = parent._modules.get(FC1), parent._modules.get(ACT)
        if not (isinstance(fc1, SemiSparseLinear) and type(act) is nn.GELU and _fusable(parent, parents)):
            continue
        fc1.gelu = act.approximate
        fc1.__dict__[_UNFUSED] = act
        parent.act = nn.Identity()
        names.append(f"{name}.{FC1}" if name else FC1)
    return names


def unfuse_gelu(model: nn.Module) -> list[str]:
    """Undo `fuse_gelu`: each fused fc1 computes its plain output again and its parent's GELU module (the same
    object) is back in place; returns the fc1 names."""
    names = []
    for name, parent in model.named_modules():
        fc1 = parent._modules.get(FC1)
        if isinstance(fc1, SemiSparseLinear) and _UNFUSED in fc1.__dict__:
            parent.act = fc1.__dict__.pop(_UNFUSED)
            fc1.__dict__.pop("gelu", None)
            names.append(f"{name}.{FC1}" if name else FC1)
    return names


def fused_gelu_modules(model: nn.Module) -> list[str]:
    """The names of the fc1 layers that apply their parent's GELU themselves."""
    return [name for name, m in model.named_modules() if isinstance(m, SemiSparseLinear) and _UNFUSED in m.__dict__]
