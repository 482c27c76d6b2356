"""Swap `nn.Linear` modules of a model to sparse ones and back, sharing the Parameter objects both
ways.

    names = swap_linear_modules(model, pattern=r"blocks\\.\\d+\\.mlp\\.fc[12]", backend="auto", pruning="tile_greedy")
    ...
    swap_to_dense(model)            # at the sparse -> dense switch; parameters, optimizer state, EMA untouched

Selection: either a dict {fully-qualified module name: class-with-from_dense or callable(linear) ->
module} (torchao's `swap_linear_with_semi_sparse_linear` convention), or `pattern`: a regex that
must match the whole name (`re.fullmatch`), or a shell glob when it starts with "glob:". Only
`nn.Linear` modules are considered; ones that are already sparse (`SPARSE_LINEAR_TYPES`) are left as
they are and not reported. A pattern or dict naming no Linear raises ValueError listing some of the
model's Linear names; a module whose shape the pruning cannot handle raises ValueError naming the
module and shape, and the modules swapped before it are swapped back.

Plain nn.Linear modules are converted *in place* (their class changes; `SparseLinearMixin`), and
swapped back in place, so the module objects stay the same: wrappers that hold module references
(FSDP2's `fully_shard`, FSDP1, forward hooks) keep working across the sparse -> dense switch. Other
selections (subclasses of nn.Linear, callables) get a new module object sharing the Parameters.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable

import torch
from torch import nn

from sparsity.block_sparse import BlockSparseLinear
from sparsity.modules import (
    SCALE_BUFFER,
    SemiSparseActivationLinear,
    SemiSparseLinear,
    SparseLinearMixin,
)
from sparsity.pruning import prune

SPARSE_LINEAR_TYPES = (SemiSparseLinear, SemiSparseActivationLinear, BlockSparseLinear)

ModuleFactory = type | Callable[..., nn.Module]


def name_matcher(pattern: str) -> Callable[[str], bool]:
    """Regex full match, or fnmatch-style glob when the pattern starts with "glob:"."""
    if pattern.startswith("glob:"):
        glob = pattern[len("glob:") :]
        return lambda name: fnmatch.fnmatchcase(name, glob)
    regex = re.compile(pattern)
    return lambda name: regex.fullmatch(name) is not None


def _linear_names(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def _some_names(names, limit: int = 12) -> str:
    names = list(names)
    shown = ", ".join(names[:limit]) or "(none)"
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _replace(model: nn.Module, fqn: str, new: nn.Module) -> None:
    if not fqn:
        raise ValueError(
            "cannot swap the root module itself; swap inside a container (e.g. nn.Sequential)"
        )
    parent_name, _, child = fqn.rpartition(".")
    setattr(model.get_submodule(parent_name), child, new)


def _convert(factory: ModuleFactory, linear: nn.Linear, kwargs: dict) -> nn.Module:
    """The sparse module for `linear`: `linear` itself converted in place when the factory is one of
    our classes and `linear` a plain nn.Linear, else a new module from `factory.from_dense(linear,
    **kwargs)` or `factory(linear, **kwargs)`."""
    if isinstance(factory, type):
        if issubclass(factory, SparseLinearMixin) and type(linear) is nn.Linear:
            return factory.from_dense(linear, inplace=True, **kwargs)
        if not hasattr(factory, "from_dense"):
            raise TypeError(f"{factory.__name__} has no from_dense(linear, ...) classmethod")
        return factory.from_dense(linear, **kwargs)
    return factory(linear, **kwargs)


def swap_linear_modules(
    model: nn.Module,
    config: dict[str, ModuleFactory] | None = None,
    *,
    pattern: str | None = None,
    module_cls: type = SemiSparseLinear,
    **module_kwargs,
) -> list[str]:
    """Replace the selected nn.Linear modules in place; returns the names swapped (model order).

    config: {fqn: class or callable}; pattern: regex (full match) or "glob:..." selecting modules to
    turn into `module_cls`. module_kwargs go to `from_dense` (e.g. backend="auto",
    pruning="tile_greedy", masked_grad=False).
    """
    if (config is None) == (pattern is None):
        raise ValueError("give exactly one of config (a {name: class} dict) or pattern")
    linears = _linear_names(model)
    if config is not None:
        unknown = [k for k in config if k not in linears]
        if unknown:
            raise ValueError(
                f"not nn.Linear modules of the model: {unknown}; Linear modules: "
                f"{_some_names(linears)}"
            )
        selected = {name: config[name] for name in linears if name in config}
    else:
        match = name_matcher(pattern)
        selected = {name: module_cls for name in linears if match(name)}
        if not selected:
            raise ValueError(
                f"pattern {pattern!r} matches no nn.Linear module; Linear modules: "
                f"{_some_names(linears)}"
            )
    done = []  # (name, original module, its sparse replacement), to undo everything if one fails
    try:
        for name, factory in selected.items():
            linear = linears[name]
            if isinstance(linear, SPARSE_LINEAR_TYPES):
                continue
            try:
                new = _convert(factory, linear, module_kwargs)
            except ValueError as e:
                raise ValueError(
                    f"cannot swap {name!r} (weight {tuple(linear.weight.shape)}): {e}"
                ) from None
            if new is not linear:
                _replace(model, name, new)
            done.append((name, linear, new))
    except BaseException:
        for name, linear, new in reversed(done):
            if new is linear:
                new.to_dense(inplace=True)
            else:
                _replace(model, name, linear)
        raise
    return [name for name, _, _ in done]


def swap_to_dense(model: nn.Module, pattern: str | None = None) -> list[str]:
    """Turn every sparse linear module (or those whose name matches `pattern`) back into nn.Linear
    holding the same Parameters; returns the names swapped. Their extra buffers
    (soft_threshold_scale, block masks) are dropped."""
    match = name_matcher(pattern) if pattern is not None else (lambda name: True)
    swapped = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, SPARSE_LINEAR_TYPES) and match(name)
    ]
    for name, m in swapped:
        if type(m) in SPARSE_LINEAR_TYPES:
            m.to_dense(
                inplace=True
            )  # same module object: references to it stay valid (FSDP, hooks)
        else:
            _replace(model, name, m.to_dense())
    return [name for name, _ in swapped]


@torch.no_grad()
def pruned_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The network a model with 2:4 weights computes, as a plain state_dict: `model.state_dict()`
    with each SemiSparseLinear's weight replaced by the 2:4 weight its forward multiplies by (pruned
    with its own method; for soft_threshold, shrunk and scaled), and the sparse modules' own buffers
    left out. The same architecture with plain nn.Linear layers (timm's, your own) loads it and
    computes the sparse forward's function; the dense weights in `model` are untouched. A module
    whose sparsity is not in its weight (SemiSparseActivationLinear prunes its input,
    BlockSparseLinear its blocks at every step) cannot be baked into one: ValueError naming it."""
    state = model.state_dict()
    for name, module in model.named_modules():
        if not isinstance(module, SPARSE_LINEAR_TYPES):
            continue
        if type(module) is not SemiSparseLinear:
            raise ValueError(
                f"{name}: {type(module).__name__} is not sparse in its weight, so no plain weight "
                "computes its function; swap it back (swap_to_dense) or export the model as it is"
            )
        prefix = f"{name}." if name else ""
        weight, _ = prune(module.weight.detach(), module.pruning)
        if module.pruning == "soft_threshold":
            weight = weight * getattr(module, SCALE_BUFFER)
        state[prefix + "weight"] = weight.to(module.weight.dtype)
        for buffer in module._SPARSE_BUFFERS:
            state.pop(prefix + buffer, None)
    return state


def sparse_modules(model: nn.Module) -> dict[str, nn.Module]:
    """{name: module} of the model's sparse linear modules."""
    return {name: m for name, m in model.named_modules() if isinstance(m, SPARSE_LINEAR_TYPES)}


def set_sparse_backend(model: nn.Module, backend: str) -> list[str]:
    """Switch the GEMM backend of every 2:4 module (SemiSparseLinear, SemiSparseActivationLinear);
    returns names."""
    names = []
    for name, m in model.named_modules():
        if isinstance(m, (SemiSparseLinear, SemiSparseActivationLinear)):
            m.configure(backend=backend)
            names.append(name)
    return names


# torchao-compatible names
# ------------------------------------------------------------------------------------


def swap_linear_with_semi_sparse_linear(
    model: nn.Module, config: dict[str, type], current: str = ""
) -> list[str]:
    """torchao's API: config = {fqn: class with from_dense}; `current` is the FQN of `model` inside
    a larger model (keys are full names). Unlike torchao, a key naming no nn.Linear raises
    ValueError."""
    if current:
        config = {
            k[len(current) + 1 :]: v for k, v in config.items() if k.startswith(current + ".")
        }
    return swap_linear_modules(model, config)


def swap_semi_sparse_linear_with_linear(model: nn.Module, current: str = "") -> list[str]:
    """torchao's API: every sparse linear module back to nn.Linear (same Parameters)."""
    return swap_to_dense(model)
