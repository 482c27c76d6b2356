"""Let PyPI's torchvision (and so timm) import beside a CPU-only torch on Linux; a no-op everywhere
else.

`sparsity` itself never imports torchvision. This exists because `import timm` imports torchvision,
and on Linux PyPI's torchvision is a CUDA build: beside a CPU-only torch its compiled ops (`_C`)
cannot load, and `import torchvision` then dies registering fake kernels for them (`operator
torchvision::nms does not exist`). Declaring the two op schemas it needs lets the Python parts
(transforms, datasets, timm's layers) import; the compiled detection ops stay unavailable. `import
sparsity` calls `ensure_torchvision_importable()`, so a script that imports `sparsity` before
timm/torchvision works on such a machine; nothing can help once torchvision has failed. Keep this
file free of imports other than torch and the standard library: it must run before anything imports
torchvision.

The schemas are declared only when torchvision's `_C` is installed and fails to load: where it loads
(CUDA torch, PyPI's CPU builds on macOS/Windows, PyTorch's CPU index on Linux) declaring them would
make its own registration abort the process ("registered ... multiple times").
"""

import importlib.machinery
import importlib.util
import os
import sys

import torch

_KEEP_ALIVE: list = []  # a torch.library.Library deregisters its definitions when garbage-collected


def _compiled_ops_path(package_dir: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(package_dir, "_C" + suffix)
        if os.path.isfile(path):
            return path
    return None


def _loads(path: str) -> bool:
    try:
        torch.ops.load_library(
            path
        )  # what torchvision does itself; loading the same file again is a no-op
    except (ImportError, OSError):
        return False
    return True


def ensure_torchvision_importable() -> None:
    if (
        not sys.platform.startswith("linux")
        or torch.version.cuda is not None
        or torch.version.hip is not None
    ):
        return
    if "torchvision" in sys.modules:  # imported already (it worked, or it is too late)
        return
    spec = importlib.util.find_spec("torchvision")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        return
    path = _compiled_ops_path(list(spec.submodule_search_locations)[0])
    if path is not None and _loads(path):
        return
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # declared already (by an earlier call)
        return
    _KEEP_ALIVE.append(lib)
