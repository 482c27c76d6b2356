"""Make PyPI torchvision (and so timm) importable on CPU-only torch; a no-op on CUDA builds.

PyPI has no CPU torchvision build: its compiled ops fail to load against a CPU torch, and importing it then dies
registering fake kernels for `torchvision::nms`. Declaring the two op schemas first lets the Python parts
(transforms, datasets, timm's layers) import; the compiled detection ops stay unavailable, which we never use.
"""

import torch


def ensure_torchvision_importable() -> None:
    if torch.version.cuda is not None or torch.version.hip is not None:
        return
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # already defined (by us earlier, or a torchvision whose ops did load)
        return
    _KEEP_ALIVE.append(lib)


_KEEP_ALIVE: list = []  # a Library deregisters its definitions when garbage-collected
