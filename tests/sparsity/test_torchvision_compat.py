"""`import sparsity` lets PyPI's CUDA torchvision import beside a CPU-only torch, and stays out of
the way of a torchvision whose compiled ops load (declaring their schemas first would make
torchvision's own registration abort the process). Each case runs `import sparsity` in a fresh
interpreter against a stand-in torchvision package."""

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or torch.version.cuda is not None
    or torch.version.hip is not None,
    reason="the shim acts only on Linux, CPU-only torch",
)

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]

PROBE = textwrap.dedent("""
    import sys
    import torch
    import sparsity
    assert "torchvision" not in sys.modules, "sparsity imported torchvision"
    try:
        torch.ops.torchvision.nms
    except (AttributeError, RuntimeError):
        print("nms: undeclared")
    else:
        print("nms: declared")
""")


def loadable_shared_library() -> str:
    """A compiled module of the standard library: dlopen-able, registers nothing with torch."""
    for name in ("_json", "_csv", "_bisect", "_struct", "array", "math"):
        spec = importlib.util.find_spec(name)
        if spec and spec.origin and spec.origin.endswith(SUFFIX):
            return spec.origin
    pytest.skip("no compiled standard-library module to stand in for torchvision's _C")


def probe(tmp_path, compiled_ops: str) -> str:
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise AssertionError('the stand-in torchvision must not be imported')\n"
    )
    if compiled_ops == "loads":
        shutil.copy(loadable_shared_library(), package / f"_C{SUFFIX}")
    elif compiled_ops == "fails":
        (package / f"_C{SUFFIX}").write_bytes(
            b"not an ELF file, as a CUDA _C beside CPU torch fails to load"
        )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_schemas_are_declared_when_torchvisions_compiled_ops_fail_to_load(tmp_path):
    assert probe(tmp_path, "fails") == "nms: declared"


def test_nothing_is_declared_when_torchvisions_compiled_ops_load(tmp_path):
    assert probe(tmp_path, "loads") == "nms: undeclared"
