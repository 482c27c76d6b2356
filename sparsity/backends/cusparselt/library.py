"""cuSPARSELt loaded through NVIDIA's `nvmath-python` bindings, and one library handle per device
and thread.

The bottom layer of the cuSPARSELt backend (library -> compressor -> plans -> search -> ops ->
backend): nothing here knows about weights or GEMM shapes. `lib()` returns the
`nvmath.bindings.cusparseLt` module or raises `BackendUnavailable` saying why it cannot be used (no
GPU, nvmath missing, the library fails to initialise); `handle(device_index)` is this thread's
handle for a device (cuSPARSELt handles must not be shared across threads, pytorch/pytorch#113776;
autograd may run backward on another thread).
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import threading

import numpy as np
import torch

from ..base import BackendUnavailable

log = logging.getLogger(__name__)

# cudaDataType_t, cusparseOrder_t, cusparseOperation_t values (stable C enums)
CUDA_DTYPE = {torch.float16: 2, torch.bfloat16: 14}
ORDER_COL, ORDER_ROW = 1, 2
OP_N, OP_T = 0, 1
ALIGN = 16  # bytes; every pointer handed to cuSPARSELt must be 16-byte aligned

# Dimension multiples cuSPARSELt 0.8 accepts for 16-bit types (found on the H100, see
# results/bench/NOTES.md): both dims of the structured operand (8, 17, 20, 24, 40 refused; 16, 32,
# 48, 80, ... accepted) and the token dimension of the dense operand (4097 and 4100 refused with
# NOT_SUPPORTED, 4104 accepted). The backend pads tokens.
STRUCT_MULTIPLE = 16
TOKEN_MULTIPLE = 8


def padded_token_count(tokens: int) -> int:
    """`tokens` rounded up to the token multiple: the rows a 2:4 GEMM runs for `tokens` rows of
    input once they are padded."""
    return -(-tokens // TOKEN_MULTIPLE) * TOKEN_MULTIPLE


_cslt = None
_load_error: str | None = None
_load_lock = threading.Lock()
_version: int | None = None


def loaded_library_path(maps_text: str | None = None) -> str | None:
    """The file of the libcusparseLt mapped into this process (Linux: /proc/self/maps), or None.

    Which copy a process runs is what a benchmark of library versions must record: one started with
    `LD_PRELOAD=<another libcusparseLt.so.0>` runs that copy for torch and nvmath alike, whatever
    torch's wheel ships.
    """
    if maps_text is None:
        try:
            with open("/proc/self/maps") as f:
                maps_text = f.read()
        except OSError:
            return None
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libcusparseLt.so"):
            return fields[5].strip()
    return None


def _preload_libcusparselt() -> str | None:
    """Make sure libcusparseLt is loaded into the process so nvmath's loader finds it.

    torch's CUDA wheel depends on nvidia-cusparselt; its library lives in
    site-packages/nvidia/cusparselt/lib (or torch/lib). Loading it with RTLD_GLOBAL first lets
    nvmath (via cuda-pathfinder) pick up the already-loaded copy. A copy already mapped (torch's
    own, or one preloaded in its place) is kept: loading torch's file as well would put a second,
    different library beside it.
    """
    already = loaded_library_path()
    if already is not None:
        return already
    cands = []
    base = os.path.dirname(os.path.dirname(torch.__file__))
    cands += glob.glob(os.path.join(base, "nvidia", "cusparselt", "lib", "libcusparseLt.so*"))
    cands += glob.glob(os.path.join(base, "nvidia", "cu13", "lib", "libcusparseLt.so*"))
    cands += glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libcusparseLt.so*"))
    for path in sorted(cands):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return path
        except OSError:
            continue
    return None


def lib():
    """The `nvmath.bindings.cusparseLt` module, or raise BackendUnavailable saying why it cannot be
    used."""
    global _cslt, _load_error
    if _cslt is not None:
        return _cslt
    with _load_lock:
        if _cslt is not None:
            return _cslt
        if _load_error is not None:
            raise BackendUnavailable(_load_error)
        if not torch.cuda.is_available():
            _load_error = "cuSPARSELt needs a CUDA GPU"
            raise BackendUnavailable(_load_error)
        torch.cuda.init()
        _preload_libcusparselt()
        try:
            # nvmath-python is an optional dependency (the `gpu` extra): imported here, on first use
            # on a GPU, so that the package imports without it and the backend reports it missing as
            # BackendUnavailable
            from nvmath.bindings import cusparseLt as cslt  # noqa: PLC0415
        except ImportError as e:  # pragma: no cover - depends on the environment
            _load_error = (
                "nvmath-python is not importable (pip install nvmath-python; it binds the "
                "libcusparseLt that "
                f"torch's CUDA wheel ships): {e}"
            )
            raise BackendUnavailable(_load_error) from e
        try:
            h = cslt.init()
            ver = cslt.get_version(h)
            cslt.destroy(h)
        except Exception as e:  # pragma: no cover
            _load_error = f"cuSPARSELt failed to initialise through nvmath: {e!r}"
            raise BackendUnavailable(_load_error) from e
        log.info("cuSPARSELt %s loaded through nvmath-python (%s)", ver, loaded_library_path())
        _cslt = cslt
        return _cslt


class _Handles(threading.local):
    def __init__(self):
        self.by_device: dict[int, int] = {}


_handles = _Handles()


def handle(device_index: int) -> int:
    """This thread's cuSPARSELt handle for the device (created on first use)."""
    h = _handles.by_device.get(device_index)
    if h is None:
        with torch.cuda.device(device_index):
            h = lib().init()
        _handles.by_device[device_index] = h
    return h


def arch_of(device) -> str:
    """ "sm90": the compute capability of a CUDA device (index or torch.device), as the per-GPU
    tables key it."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def version() -> int:
    """cuSPARSELt version as an int (e.g. 800 for 0.8.0)."""
    global _version
    if _version is None:
        _version = int(lib().get_version(handle(torch.cuda.current_device())))
    return _version


def ptr(arr: np.ndarray) -> int:
    """The address of a numpy array's data (what the bindings take for scalars and attribute
    values)."""
    return arr.ctypes.data
