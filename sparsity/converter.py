"""The sparse-then-dense switch as a model converter (torchtitan's `ModelConverter` shape): a named
object built from plain values, with `convert(model)` (the selected nn.Linear modules become
2:4-sparse, or block-sparse with kind="block") and `revert(model)` (dense again), both sharing the
Parameter objects, so optimizer state, EMA copies, DDP/FSDP hooks and checkpoints never see the
difference.

    converter = SparseThenDense(sparse_steps=87_500, backend="auto", pruning="tile_greedy")
    converter.apply(model, step)      # at every step: convert at the first sparse step, revert at the first dense one

`SparseThenDense(**values)` takes exactly the training config's `sparsity` keys (but
`sparse_fraction`, which the caller turns into `sparse_steps`); the valid values of each are the
tuples this package owns (`KINDS`, `sparsity.backends.BACKENDS`, `sparsity.pruning.METHODS`,
`sparsity.backends.settings`, `sparsity.mvue_grad.WEIGHT_GRADS`,
`sparsity.pruned_entries.PRUNED_GRADS`). Converting also sets the backend settings the GEMM backends
are built with (`configure_backends`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import torch
from torch import nn

from sparsity.backend_decisions import decisions
from sparsity.backends import BackendSettings, check_backend_name, configure_backends, get_backend
from sparsity.block_sparse import BlockSparseLinear
from sparsity.modules import SemiSparseActivationLinear, SemiSparseLinear
from sparsity.options import DEFAULT_MODULES, KINDS, ConverterOptions  # noqa: F401  (as sparsity.converter.X too)
from sparsity.pruned_entries import decay_pruned_grads
from sparsity.pruning import check_method, check_shape, prune
from sparsity.swap import name_matcher, swap_linear_modules, swap_to_dense

log = logging.getLogger(__name__)

SPARSE, DENSE = "sparse", "dense"
PHASES = (SPARSE, DENSE)
# weight: the weight is pruned 2:4 (SemiSparseLinear) | activation: the input is
# (SemiSparseActivationLinear) | block: a fixed `block_density` of the weight's (block_size x
# block_size) blocks is used and trained (BlockSparseLinear; backend and pruning do not apply)
MODULE_CLASSES = {
    "weight": SemiSparseLinear,
    "activation": SemiSparseActivationLinear,
    "block": BlockSparseLinear,
}


Models = (
    nn.Module | Sequence[nn.Module]
)  # one model, or several converted together (a student and its teacher)


def _each(models: Models) -> list[nn.Module]:
    return [models] if isinstance(models, nn.Module) else list(models)


class ConversionError(ValueError):
    """The converter's options do not fit the model (the message names the `sparsity.` config
    key)."""


class SparseThenDense:
    """2:4-sparse linears for the first `sparse_steps` steps, dense afterwards; with
    `dense_warmup_steps`, the first that many of them dense too (a warm-up before the sparse phase;
    the switch to dense stays at `sparse_steps`).

    Its keyword `options` are `sparsity.options.ConverterOptions`' fields (modules, kind, backend,
    pruning, weight_grad, weight_grad_modules, pruned_grad, pruned_decay, cslt_search, cslt_pack,
    fused_wgrad, block_density, block_size), which say what each does and its default; an unknown
    one is a TypeError naming it. Errors name the `sparsity.` config key."""

    name = "sparse_then_dense"

    def __init__(self, sparse_steps: int = 0, *, dense_warmup_steps: int = 0, **options):
        opts = ConverterOptions(**options)
        check_backend_name(opts.backend)
        check_method(opts.pruning)
        problem = opts.converter_problem()
        if problem:
            raise ValueError(problem)
        if sparse_steps < 0:
            raise ValueError(f"sparse_steps={sparse_steps} must be >= 0")
        if dense_warmup_steps < 0 or (sparse_steps and dense_warmup_steps >= sparse_steps):
            raise ValueError(
                f"dense_warmup_steps={dense_warmup_steps} must be >= 0 and leave a sparse step "
                f"before the "
                f"switch at step {sparse_steps}"
            )
        self.sparse_steps, self.dense_warmup_steps = (
            sparse_steps,
            dense_warmup_steps if sparse_steps else 0,
        )
        self.modules, self.kind, self.backend, self.pruning = (
            opts.modules,
            opts.kind,
            opts.backend,
            opts.pruning,
        )
        self.weight_grad, self.weight_grad_modules = opts.weight_grad, opts.weight_grad_modules
        self.block_density, self.block_size = float(opts.block_density), int(opts.block_size)
        self.pruned_grad, self.pruned_decay = opts.pruned_grad, float(opts.pruned_decay)
        self.settings = BackendSettings(
            cslt_search=opts.cslt_search, cslt_pack=opts.cslt_pack, fused_wgrad=opts.fused_wgrad
        )
        self.phase = DENSE
        self.converted: list[str] = []
        self._weight_sparse: list[
            SemiSparseLinear
        ] = []  # the converted weight-sparse linears (decay_pruned)

    def _module_options(self) -> dict:
        if self.kind == "block":
            return {"density": self.block_density, "block_size": self.block_size}
        options = {"backend": self.backend, "pruning": self.pruning}
        if self.kind != "weight":
            return options
        return {
            **options,
            "weight_grad": self.weight_grad,
            "masked_grad": self.pruned_grad == "masked",
        }

    def check(self, models: Models) -> None:
        """Raise ConversionError (naming the config key) if `convert(models)` would fail: `modules`
        not a valid pattern, or (with sparse steps to run) selecting no linear of a model, or a
        selected linear of a shape the kind and pruning cannot take. Checks without converting (a
        model on the meta device will do), so a run can refuse its config before it starts."""
        try:
            selected = [self.selected_linears(model) for model in _each(models)]
        except re.error as e:
            raise ConversionError(
                f"sparsity.modules={self.modules!r} is not a valid regular expression ({e})"
            ) from None
        if self.sparse_steps > 0 and not all(selected):
            raise ConversionError(
                f"sparsity.modules={self.modules!r} selects no nn.Linear of the model (full match "
                f"of "
                "the module name, e.g. blocks\\.\\d+\\.mlp\\.fc[12]; glob:PATTERN for a glob)"
            )
        for name, m in (item for found in selected for item in found.items()):
            problem = self._shape_problem(m.out_features, m.in_features)
            if problem:
                raise ConversionError(
                    f"{problem}: {name} is (out, in) = ({m.out_features}, {m.in_features})"
                )
        self._check_weight_grad_modules([name for found in selected for name in found])

    def _check_weight_grad_modules(self, selected: list[str]) -> None:
        key = f"sparsity.weight_grad_modules={self.weight_grad_modules!r}"
        if self.weight_grad == "dense":
            if self.weight_grad_modules != ".*":
                raise ConversionError(
                    f"{key} picks the linears of sparsity.weight_grad=mvue24; with the dense "
                    f"weight "
                    "gradient it means nothing: leave it at .*"
                )
            return
        try:
            match = name_matcher(self.weight_grad_modules)
        except re.error as e:
            raise ConversionError(f"{key} is not a valid regular expression ({e})") from None
        if self.sparse_steps > 0 and not any(match(name) for name in selected):
            shown = ", ".join(selected[:4]) + (", ..." if len(selected) > 4 else "")
            raise ConversionError(
                f"{key} matches none of the linears sparsity.modules selects ({shown}): full match "
                "of the module name, e.g. .*fc2, or glob:PATTERN"
            )

    def _shape_problem(self, out_features: int, in_features: int) -> str:
        if self.kind == "block":
            if out_features % self.block_size or in_features % self.block_size:
                return (
                    f"sparsity.block_size={self.block_size} must divide both dims of every "
                    f"converted linear"
                )
            return ""
        shape = (out_features, in_features) if self.kind == "weight" else (4, in_features)
        try:
            check_shape(shape, self.pruning)
        except ValueError as e:
            return f"sparsity.pruning={self.pruning} ({e})"
        return ""

    # -------------------------------------------------------------------------------- the converter
    def convert(self, models: Models) -> list[str]:
        """Turn the selected nn.Linear modules of `models` (one model or several, each matched by
        its own module names) into 2:4-sparse ones (in place, same Parameters); returns their names.
        The GEMM backends are (re)built with this converter's settings."""
        configure_backends(self.settings)
        self.check(models)
        converted = []
        try:
            for model in _each(models):
                converted += swap_linear_modules(
                    model,
                    pattern=self.modules,
                    module_cls=MODULE_CLASSES[self.kind],
                    **self._module_options(),
                )
        # all or nothing: the models converted before the failing one are reverted
        except BaseException:
            self.revert(models)
            raise
        self.converted = converted
        self._weight_sparse = [
            m for model in _each(models) for m in model.modules() if isinstance(m, SemiSparseLinear)
        ]
        self._dense_weight_grad_outside(models)
        self.phase = SPARSE
        return self.converted

    def _dense_weight_grad_outside(self, models: Models) -> None:
        """The converted linears `weight_grad_modules` leaves out take the dense weight gradient."""
        if self.weight_grad == "dense" or self.weight_grad_modules == ".*":
            return
        match = name_matcher(self.weight_grad_modules)
        for model in _each(models):
            for name, m in model.named_modules():
                if isinstance(m, SemiSparseLinear) and not match(name):
                    m.configure(weight_grad="dense")

    def revert(self, models: Models) -> list[str]:
        """Every sparse linear of `models` back to nn.Linear (same module objects and Parameters);
        returns names."""
        names = [name for model in _each(models) for name in swap_to_dense(model)]
        self._weight_sparse = []
        self.phase = DENSE
        return names

    def selected_linears(self, models: Models) -> dict[str, nn.Linear]:
        """The linears this converter selects in `models` (converted or not), by name (several
        models: each one's names, which must not collide)."""
        match = name_matcher(self.modules)
        return {
            name: m
            for model in _each(models)
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and match(name)
        }

    def decay_pruned(
        self, mask_dtype: torch.dtype | None = None, scale: float | torch.Tensor = 1.0
    ) -> int:
        """In the sparse phase with `pruned_decay` > 0: grad += pruned_decay * scale * (1 - mask) *
        W for every converted weight-sparse linear with a gradient
        (`sparsity.pruned_entries.decay_pruned_grads`; `mask_dtype`: the dtype the forward pruned
        in; `scale`: the step's share of the strength, e.g. a ramp's). Call after backward and
        clipping, before the optimizer step. Returns how many."""
        if self.phase != SPARSE or not self.pruned_decay:
            return 0
        return decay_pruned_grads(self._weight_sparse, self.pruned_decay, mask_dtype, scale)

    @torch.no_grad()
    def prune_weights(self, models: Models, mask_dtype: torch.dtype | None = None) -> list[str]:
        """Zero the entries of every selected linear weight of `models` (converted or not) that this
        converter's 2:4 pruning drops: the network a sparse phase computed with, kept as dense
        weights, so that a dense phase can start from it. The mask is computed on the weight cast to
        `mask_dtype` (the dtype the sparse forward pruned in, e.g. bf16 under autocast; default the
        weight's own) and applied to the Parameters in place. kind=weight only, and not
        soft_threshold (its values are rescaled, not masked). Returns the names."""
        if self.kind != "weight" or self.pruning == "soft_threshold":
            raise ConversionError(
                f"pruning the weights applies to sparsity.kind=weight with a masking method, not "
                f"kind={self.kind}, pruning={self.pruning}"
            )
        names = []
        for model in _each(models):
            for name, m in self.selected_linears(model).items():
                _, mask = prune(m.weight.to(mask_dtype or m.weight.dtype), self.pruning)
                m.weight.mul_(mask.to(m.weight.dtype))
                names.append(name)
        return names

    # --------------------------------------------------------------------------------- the schedule
    def phase_at(self, step: int) -> str:
        """The phase of step `step` (0-based): sparse for the first `sparse_steps` but the
        `dense_warmup_steps`."""
        return SPARSE if self.dense_warmup_steps <= step < self.sparse_steps else DENSE

    def apply(self, models: Models, step: int) -> bool:
        """Put `models` in the phase of `step`; True if it changed."""
        return self.set_phase(models, self.phase_at(step), step)

    def set_phase(self, models: Models, wanted: str, step: int) -> bool:
        """Convert or revert `models` so that they are in phase `wanted` (logged with `step`); True
        if it changed."""
        if wanted not in PHASES:
            raise ValueError(f"unknown sparsity phase {wanted!r}")
        if wanted == self.phase:
            return False
        if wanted == SPARSE:
            self.convert(models)
            log.info("step %d: %d linears now %s", step, len(self.converted), self.describe())
        else:
            self.revert(models)
            log.info(
                "step %d: sparse -> dense switch, %d linears dense again", step, len(self.converted)
            )
        return True

    def describe(self) -> str:
        """What the sparse phase runs, in words (the log and the run's start-up summary)."""
        if self.kind == "block":
            return f"block-sparse (density {self.block_density:g}, {self.block_size}x{self.block_size} blocks)"
        grad = f", weight gradient {self.weight_grad}" if self.weight_grad != "dense" else ""
        grad += (
            f" on {self.weight_grad_modules}" if grad and self.weight_grad_modules != ".*" else ""
        )
        grad += ", pruned entries get no gradient" if self.pruned_grad == "masked" else ""
        grad += f", pruned entries decayed ({self.pruned_decay:g})" if self.pruned_decay else ""
        return f"2:4-sparse ({self.kind}, backend={self.backend}, pruning={self.pruning}{grad})"

    # --------------------------------------------------------------------------------------------- what it decided
    def auto_summary(self) -> dict:
        """For the metrics, in the sparse phase with backend `auto`: how many GEMM shapes it has
        decided, and how many of them run sparse in eager code (`choice`) and in compiled code
        (`choice_graph`, decided by device time). Each decision is also logged when it is made."""
        if self.phase != SPARSE or self.backend != "auto" or self.kind == "block":
            return {}
        recs = get_backend("auto").describe()["decisions"]
        return {
            "auto_shapes": len(recs),
            "auto_sparse_eager": sum(d["choice"] == "cusparselt" for d in recs),
            "auto_sparse_compiled": sum(d["choice_graph"] == "cusparselt" for d in recs),
        }

    def decisions(self) -> dict:
        """`sparsity.decisions()`: what the backends decided so far, per GEMM shape."""
        return decisions()


CONVERTERS = {SparseThenDense.name: SparseThenDense}


def build_converter(name: str, sparse_steps: int, **values) -> SparseThenDense:
    """The converter registered as `name`, built from plain values (e.g. a config section's
    keys)."""
    if name not in CONVERTERS:
        raise ValueError(f"unknown model converter {name!r}; choose one of {', '.join(CONVERTERS)}")
    return CONVERTERS[name](sparse_steps, **values)
