"""Metadata is in pyproject.toml. This file only adds `sparse24_dinov2-torchvision.pth` to the installed files, in
regular and editable (`pip install -e`) installs: at interpreter start-up it imports
`sparse24_dinov2_torchvision_hook`, so that torchvision and timm import in any order beside a CPU-only torch."""

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_NAME = "sparse24_dinov2-torchvision.pth"  # sorts after setuptools' __editable__.*.pth, which makes the hook importable
# site.py runs a .pth line that starts with `import`; a missing or failing hook must not print errors at start-up
PTH_LINE = 'import sys; exec("try:\\n import sparse24_dinov2_torchvision_hook\\nexcept Exception:\\n pass")\n'


class BuildPyWithPth(build_py):
    """Regular wheels: a file at the top of build_lib lands in site-packages."""

    def run(self):
        super().run()
        if not self.editable_mode:
            Path(self.build_lib, PTH_NAME).write_text(PTH_LINE)


def _add_to_wheel(wheel: Path, name: str, data: bytes) -> None:
    with zipfile.ZipFile(wheel) as zin:
        if name in zin.namelist():
            return
        items = [(info, zin.read(info)) for info in zin.infolist()]
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        zout.writestr(name, data)
        for info, content in items:
            if info.filename.endswith(".dist-info/RECORD"):  # pip installs (and uninstalls) what RECORD lists
                content += f"{name},sha256={digest},{len(data)}\n".encode()
            zout.writestr(info, content)
    os.replace(tmp, wheel)


class EditableWheelWithPth(editable_wheel):
    """Editable wheels hold only setuptools' own .pth and finder; the hook's .pth is added to the finished wheel."""

    def run(self):
        super().run()
        wheels = list(Path(self.dist_dir).glob("*.editable-*.whl"))
        if not wheels:
            raise RuntimeError(f"no editable wheel in {self.dist_dir} to add {PTH_NAME} to")
        for wheel in wheels:
            _add_to_wheel(wheel, PTH_NAME, PTH_LINE.encode())


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
