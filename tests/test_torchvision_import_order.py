"""The install adds nothing that runs at interpreter start-up (no `.pth` hook): a user's script that
uses `sparsity` first (`import torch` then `import sparsity`, or any name of the library), then
imports timm or torchvision, works beside a CPU-only torch, since either applies
`sparsity/torchvision_compat.py`, and the shim declares torchvision's op schemas only where its
compiled ops fail to load. Each case runs a fresh interpreter outside the repository, so what is
tested is the installed package."""

import importlib.machinery
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.sparsity.test_torchvision_compat import loadable_shared_library

CPU_TORCH_ON_LINUX = (
    sys.platform.startswith("linux") and torch.version.cuda is None and torch.version.hip is None
)


def run_python(code: str, cwd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "first, then",
    [
        ("import torch; import sparsity", "timm"),
        ("import sparsity; sparsity.SemiSparseLinear", "torchvision"),
    ],
)
def test_sparsity_first_then_timm_or_torchvision_works(tmp_path, first, then):
    result = run_python(
        f"""
        {first}
        import {then}
        import timm
        import torch
        from torchvision.ops import box_iou
        from torchvision.transforms.v2 import functional as F

        iou = box_iou(torch.tensor([[0.0, 0.0, 2.0, 2.0]]), torch.tensor([[1.0, 1.0, 3.0, 3.0]]))
        assert abs(iou.item() - 1 / 7) < 1e-6, iou
        assert F.resize(torch.rand(3, 8, 8), [4, 4]).shape == (3, 4, 4)
        print("ok")
    """,
        cwd=tmp_path,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_nothing_of_the_project_runs_at_interpreter_start_up(tmp_path):
    """No start-up hook: no `.pth` of the project in site-packages imports anything, and a fresh
    interpreter has no finder or module of ours before the script asks for one."""
    folders = [
        Path(p) for p in (*site.getsitepackages(), site.getusersitepackages()) if Path(p).is_dir()
    ]
    hooks = [
        p.name
        for folder in folders
        for p in folder.glob("*.pth")
        if "sparse24" in p.name
        and "import" in p.read_text().replace("__editable__", "")
        and not p.name.startswith("__editable__")
    ]
    assert hooks == [], (
        f"a start-up hook is installed: {hooks}; reinstall: pip install -e '.[test]'"
    )
    result = run_python(
        """
        import sys
        print(sorted(m for m in ("torch", "torchvision", "sparsity", "sparse24_dinov2_torchvision_hook")
                     if m in sys.modules))
        print([type(f).__name__ for f in sys.meta_path if "Torchvision" in type(f).__name__])
    """,
        cwd=tmp_path,
    )
    assert result.returncode == 0 and result.stdout.split("\n")[:2] == ["[]", "[]"], (
        result.stdout + result.stderr
    )


@pytest.mark.skipif(not CPU_TORCH_ON_LINUX, reason="the shim acts only on Linux, CPU-only torch")
@pytest.mark.parametrize(
    "compiled_ops, expected", [("fails", "nms: declared"), ("loads", "nms: undeclared")]
)
def test_the_shim_declares_the_schemas_only_where_torchvisions_ops_fail_to_load(
    tmp_path, compiled_ops, expected
):
    """A stand-in torchvision: where its compiled ops load (a matching build) `import sparsity` must
    declare nothing, or the real torchvision's own registration would abort the process."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    package = tmp_path / "stand_in" / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent("""
        import torch
        try:
            torch.ops.torchvision.nms
        except (AttributeError, RuntimeError):
            print("nms: undeclared")
        else:
            print("nms: declared")
    """)
    )
    if compiled_ops == "loads":
        (package / f"_C{suffix}").write_bytes(open(loadable_shared_library(), "rb").read())
    else:
        (package / f"_C{suffix}").write_bytes(
            b"not an ELF file, as a CUDA _C beside CPU torch fails to load"
        )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stand_in")}
    result = run_python("import torch\nimport sparsity\nimport torchvision", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == expected, result.stdout
