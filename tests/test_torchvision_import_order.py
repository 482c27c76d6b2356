"""A user's own script may import timm or torchvision first, after the README's install: the installed
`sparse24_dinov2-torchvision.pth` (setup.py) runs `sparse24_dinov2_torchvision_hook` at start-up, which applies
`sparsity/torchvision_compat.py` just before torchvision is first looked for. Each case runs a fresh interpreter
outside the repository, so what is tested is the installed package, as a user gets it."""

import importlib.machinery
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import sparse24_dinov2_torchvision_hook as hook
from tests.sparsity.test_torchvision_compat import loadable_shared_library

REINSTALL = "installed before the hook existed? reinstall: .venv/bin/pip install -c constraints-cpu.txt -e '.[test]'"
CPU_TORCH_ON_LINUX = (sys.platform.startswith("linux") and torch.version.cuda is None
                      and torch.version.hip is None)


def run_python(code: str, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("first", ["timm", "torchvision"])
def test_timm_or_torchvision_imported_first_works(tmp_path, first):
    result = run_python(f"""
        import {first}
        import sys
        import timm
        import torch
        import torchvision
        from torchvision.ops import box_iou
        from torchvision.transforms.v2 import functional as F

        iou = box_iou(torch.tensor([[0.0, 0.0, 2.0, 2.0]]), torch.tensor([[1.0, 1.0, 3.0, 3.0]]))
        assert abs(iou.item() - 1 / 7) < 1e-6, iou
        assert F.resize(torch.rand(3, 8, 8), [4, 4]).shape == (3, 4, 4)
        assert "sparsity" not in sys.modules, "the hook imported the whole sparsity package"
        print("ok")
    """, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "ok", f"{REINSTALL}\n{result.stderr[-3000:]}"


def test_the_hook_is_installed_and_imports_nothing_heavy_at_start_up(tmp_path):
    result = run_python("""
        import sys
        print(any(type(f).__name__ == "_BeforeTorchvision" for f in sys.meta_path))
        print(sorted(m for m in ("torch", "torchvision", "sparsity") if m in sys.modules))
    """, cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["True", "[]"], f"{REINSTALL}\n{result.stdout}"


@pytest.mark.skipif(not CPU_TORCH_ON_LINUX, reason="the shim acts only on Linux, CPU-only torch")
@pytest.mark.parametrize("compiled_ops, expected", [("fails", "nms: declared"), ("loads", "nms: undeclared")])
def test_the_hook_declares_the_schemas_only_where_torchvisions_ops_fail_to_load(tmp_path, compiled_ops, expected):
    """A stand-in torchvision: where its compiled ops load (a matching build) the hook must declare nothing, or the
    real torchvision's own registration would abort the process."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    package = tmp_path / "stand_in" / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent("""
        import torch
        try:
            torch.ops.torchvision.nms
        except (AttributeError, RuntimeError):
            print("nms: undeclared")
        else:
            print("nms: declared")
    """))
    if compiled_ops == "loads":
        (package / f"_C{suffix}").write_bytes(open(loadable_shared_library(), "rb").read())
    else:
        (package / f"_C{suffix}").write_bytes(b"not an ELF file, as a CUDA _C beside CPU torch fails to load")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stand_in")}
    result = run_python("import torchvision", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == expected, f"{REINSTALL}\n{result.stdout}"


def test_a_failing_hook_module_prints_nothing_at_start_up(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / f"{hook.__name__}.py").write_text("raise RuntimeError('broken hook')\n")
    result = run_python("print('started')", cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(shadow)})
    assert (result.returncode, result.stdout, result.stderr) == (0, "started\n", "")


def test_a_failing_shim_does_not_stop_the_import(monkeypatch):
    def broken():
        raise OSError("cannot read the shim")

    monkeypatch.setattr(hook, "_apply_shim", broken)
    monkeypatch.setattr(sys, "meta_path", [hook._FINDER, *(f for f in sys.meta_path if f is not hook._FINDER)])
    assert hook._FINDER.find_spec("torchvision") is None  # the ordinary finders then import it
    assert hook._FINDER not in sys.meta_path  # once only
    assert hook._FINDER.find_spec("numpy") is None
