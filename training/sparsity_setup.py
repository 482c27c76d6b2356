"""The config's `sparsity` section as the library's model converter, built in one place for training
and evaluation."""

from configs import Config
from configs.schema import CONVERTER_FIELDS
from rundir.errors import UsageError
from sparsity import SparseThenDense, build_converter
from sparsity.converter import ConversionError


class ModelConfigError(UsageError, ValueError):
    """A config the model cannot take (a `sparsity.` key, `student.pretrained_weights`): the
    command's refusal, exit status 2. The library's own `ConversionError` becomes one where training
    checks the model."""


def check_sparsity(converter: SparseThenDense, modules) -> None:
    """`converter.check(modules)`, a sparsity option the model cannot take refused as a
    `ModelConfigError`."""
    try:
        converter.check(modules)
    except ConversionError as e:
        raise ModelConfigError(str(e)) from None


def sparsity_converter(cfg: Config, backend: str | None = None) -> SparseThenDense:
    """`SparseThenDense` with every other `sparsity` key of `cfg`; `backend` replaces the configured
    GEMM backend (evaluation multiplies the pruned weights densely)."""
    values = {
        key: getattr(cfg.sparsity, key) for key in CONVERTER_FIELDS
    }  # the library's own options
    if backend is not None:
        values["backend"] = backend
    return build_converter(
        SparseThenDense.name, cfg.sparse_steps, dense_warmup_steps=cfg.dense_warmup_steps, **values
    )
