"""Applies `sparsity/torchvision_compat.py` before the first `import torchvision` of any script, whatever it imports
first (`import timm` imports torchvision): the installed `sparse24_dinov2-torchvision.pth` imports this module at
interpreter start-up (setup.py installs it, editable or not).

At start-up it only puts a finder on `sys.meta_path` (standard library only: no torch, nothing that can fail). The
first time Python looks for `torchvision`, the finder removes itself, runs the shim and lets the ordinary finders
import torchvision. The shim is loaded from its file, not through `import sparsity`: that package's other modules
would add about a second to every script that imports torchvision. Where torchvision's compiled ops load (CUDA torch,
a matching CPU build) the shim does nothing; any error is swallowed, the import then goes on as without this module.
"""

import importlib.util
import os
import sys

_shim = None  # the loaded shim module: it keeps its torch.library definitions alive


def _apply_shim() -> None:
    global _shim
    # `sparsity` is installed beside this module (the repository root in an editable install)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparsity", "torchvision_compat.py")
    spec = importlib.util.spec_from_file_location("_sparse24_dinov2_torchvision_compat", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ensure_torchvision_importable()
    _shim = module


class _BeforeTorchvision:
    """A meta-path finder that finds nothing: it only runs the shim once, just before torchvision is looked for."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            uninstall()  # first, so that the shim's own look-up of torchvision does not come back here
            try:
                _apply_shim()
            except Exception:  # noqa: BLE001 - never stand in the way of the import itself
                pass
        return None


_FINDER = _BeforeTorchvision()


def install() -> None:
    if "torchvision" not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


install()
