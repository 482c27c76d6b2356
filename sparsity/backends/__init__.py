"""Backend registry: `get_backend(name)` -> one cached `Backend` instance per name and process.

"dense" (`dense.DenseBackend`, any device) is the reference math. "cusparselt", "cutlass" and "auto"
live in their own modules (`cusparselt.CuSparseLtBackend`, `cutlass.CutlassBackend`,
`auto.AutoBackend`) and are imported lazily by module path, so this registry imports nothing heavy
and works in builds without them: asking for a missing one raises `BackendUnavailable`. Instances
are cached because some keep per-shape state (plans, `auto`'s decisions).

Every instance is built with the process's `BackendSettings` (`settings.py`: cuSPARSELt's algorithm
search and packing, the fused weight gradient), set with `configure_backends(settings)` (a training
run does this from its config when it converts the model, `sparsity.converter`); changing them drops
the cached instances.
"""

from __future__ import annotations

import importlib
import threading

import torch

from sparsity.options import BACKENDS

from .base import Backend, BackendUnavailable, GemmKey, SparseWeight
from .settings import CSLT_PACK_MODES, CSLT_SEARCH_MODES, BackendSettings

_IMPLEMENTATIONS = {
    "dense": ("sparsity.backends.dense", "DenseBackend"),
    "cusparselt": ("sparsity.backends.cusparselt", "CuSparseLtBackend"),
    "cutlass": ("sparsity.backends.cutlass", "CutlassBackend"),
    "auto": ("sparsity.backends.auto", "AutoBackend"),
}
_CACHE: dict[str, Backend] = {}
_LOCK = threading.Lock()
_SETTINGS = BackendSettings()


def configure_backends(settings: BackendSettings) -> None:
    """The settings every backend instance is built with from now on; instances built with other
    settings are dropped (the next `get_backend` builds a new one)."""
    global _SETTINGS
    if not isinstance(settings, BackendSettings):
        raise TypeError(
            f"configure_backends takes a BackendSettings, got {type(settings).__name__}"
        )
    with _LOCK:
        if settings != _SETTINGS:
            _SETTINGS = settings
            _CACHE.clear()


def backend_settings() -> BackendSettings:
    """The settings backend instances are built with."""
    return _SETTINGS


def check_backend_name(name: str) -> str:
    if name not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown sparse backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


def get_backend(name: str) -> Backend:
    """The process-wide instance of backend `name` (ValueError if the name is unknown,
    BackendUnavailable if this build lacks it). Whether it can run on a given device/dtype is
    `get_backend(name).check(device, dtype)`."""
    backend = _CACHE.get(name)
    if backend is not None:
        return backend
    module_name, class_name = _IMPLEMENTATIONS[check_backend_name(name)]
    with _LOCK:
        if name not in _CACHE:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                if e.name == module_name:
                    raise BackendUnavailable(
                        f"sparse backend {name!r} is not available in this build ({module_name} "
                        f"does not exist)"
                    ) from e
                raise BackendUnavailable(f"sparse backend {name!r} cannot be imported: {e}") from e
            except ImportError as e:
                raise BackendUnavailable(f"sparse backend {name!r} cannot be imported: {e}") from e
            _CACHE[name] = getattr(module, class_name)(_SETTINGS)
    return _CACHE[name]


def built_backends() -> dict[str, Backend]:
    """{name: instance} of the backends built so far in this process (nothing is built by
    asking)."""
    with _LOCK:
        return dict(_CACHE)


def available_backends(device: torch.device, dtype: torch.dtype) -> list[str]:
    """Names of the backends that can run on `device` with `dtype` in this process."""
    out = []
    for name in BACKENDS:
        try:
            get_backend(name).check(torch.device(device), dtype)
        except BackendUnavailable:
            continue
        out.append(name)
    return out


def clear_backend_cache() -> None:
    """Forget the cached instances (tests; a new instance starts without plans or decisions)."""
    with _LOCK:
        _CACHE.clear()


__all__ = [
    "BACKENDS",
    "CSLT_PACK_MODES",
    "CSLT_SEARCH_MODES",
    "Backend",
    "BackendSettings",
    "BackendUnavailable",
    "GemmKey",
    "SparseWeight",
    "available_backends",
    "backend_settings",
    "built_backends",
    "check_backend_name",
    "clear_backend_cache",
    "configure_backends",
    "get_backend",
]
