"""Make PyPI torchvision (and so timm) importable on CPU-only torch: `data` and `models` call this
before importing torchvision/timm. The shim lives in the self-contained `sparsity` library
(`sparsity/torchvision_compat.py`), whose own import applies it too, so that a user's `import
sparsity` before `import timm` works on such a machine."""

from sparsity.torchvision_compat import ensure_torchvision_importable

__all__ = ["ensure_torchvision_importable"]
