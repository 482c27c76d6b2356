"""The backend settings (no environment variable: they reach a backend through its constructor), the
sparse-then-dense model converter (convert / revert round trip, schedule), the decisions record, and
the library's layering rules (no environment reads, no cycle-breaking function-local imports, the
cuSPARSELt layers import only downward, modules under ~450 lines as formatted)."""

import ast
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sparsity
import sparsity.autograd as autograd_mod
from sparsity import (
    SemiSparseActivationLinear,
    SemiSparseLinear,
    SparseThenDense,
    build_converter,
    decisions,
)
from sparsity.backends import (
    BackendSettings,
    backend_settings,
    configure_backends,
    get_backend,
)
from sparsity.backends.auto import AutoBackend
from sparsity.backends.cusparselt import CuSparseLtBackend
from sparsity.backends.settings import CSLT_PACK_MODES, CSLT_SEARCH_MODES

PACKAGE = Path(sparsity.__file__).resolve().parent


@pytest.fixture
def default_settings():
    """Whatever a test configures, the next one starts from the default settings."""
    configure_backends(BackendSettings())
    yield
    configure_backends(BackendSettings())


# --------------------------------------------------------------------------------------------------
# settings


@pytest.mark.parametrize(
    "field, bad", [("cslt_search", "fastest"), ("cslt_pack", "cutlass"), ("fused_wgrad", "no")]
)
def test_bad_setting_names_the_field(field, bad):
    with pytest.raises(ValueError, match=rf"{field}={bad!r}"):
        BackendSettings(**{field: bad})


def test_valid_values_are_the_owner_tuples():
    assert BackendSettings().cslt_search == CSLT_SEARCH_MODES[0] == "sweep"
    assert BackendSettings().cslt_pack == CSLT_PACK_MODES[0] == "auto"
    for mode in CSLT_SEARCH_MODES:
        assert BackendSettings(cslt_search=mode).cslt_search == mode


def test_settings_reach_the_backends_through_their_constructors(default_settings):
    s = BackendSettings(cslt_search="none", cslt_pack="library", fused_wgrad=False)
    assert CuSparseLtBackend(s).settings is s
    assert (
        AutoBackend(s).backend("cusparselt").settings is s
    )  # auto's own backends are built with its settings
    before = get_backend("cusparselt")
    configure_backends(s)
    assert backend_settings() is s
    cs = get_backend("cusparselt")
    assert cs is not before and cs.settings is s  # a new instance, built with the new settings
    assert get_backend("auto").backend("cusparselt").settings is s
    assert cs.describe()["settings"] == {
        "cslt_search": "none",
        "cslt_pack": "library",
        "fused_wgrad": False,
    }
    configure_backends(BackendSettings(cslt_search="none", cslt_pack="library", fused_wgrad=False))
    assert (
        get_backend("cusparselt") is cs
    )  # equal settings keep the instance (and its per-shape state)
    with pytest.raises(TypeError):
        configure_backends({"cslt_search": "none"})


@pytest.mark.parametrize("fused_wgrad", [True, False])
def test_fused_wgrad_setting_decides_whether_the_fused_path_is_asked(
    default_settings, monkeypatch, fused_wgrad
):
    calls = []

    def fake(dy2, x2, w_dtype, b_dtype):
        calls.append(dy2.shape)
        return None  # "does not apply here": the torch ops run

    monkeypatch.setattr(autograd_mod, "weight_bias_grad", fake)
    configure_backends(BackendSettings(fused_wgrad=fused_wgrad))
    torch.manual_seed(0)
    m = SemiSparseLinear.from_dense(nn.Linear(16, 8), backend="dense")
    x = torch.randn(5, 16)
    m(x).sum().backward()
    assert len(calls) == (1 if fused_wgrad else 0)
    assert m.weight.grad is not None and m.bias.grad is not None  # the torch ops ran either way


def test_no_environment_variable_is_read_by_the_library():
    """Settings come from the config through constructors; even Triton's interpreter switch is asked
    of Triton."""
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            # os.environ, from os import environ, ...
            if re.search(r"environ(?!ment)|getenv|putenv", line):
                hits.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert hits == [], hits


def test_the_interpreter_switch_is_triton_s_own_decision():
    from triton.runtime.interpreter import InterpretedFunction

    from sparsity.kernels import prune  # noqa: F401  (any kernel module: decorated under the same switch)
    from sparsity.kernels._util import interpreting

    kernels = [
        v
        for v in vars(prune).values()
        if hasattr(v, "fn") and type(v).__module__.startswith("triton")
    ]
    assert kernels and all(isinstance(k, InterpretedFunction) == interpreting() for k in kernels)


# --------------------------------------------------------------------------------------------------
# layering


def _function_local_imports(path: Path):
    tree = ast.parse(path.read_text())
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    out.append((node.lineno, ("." * node.level) + (node.module or "")))
                elif isinstance(node, ast.Import):
                    out.extend((node.lineno, a.name) for a in node.names)
    return out


def test_function_local_imports_are_only_optional_dependencies_and_say_so():
    """Imports inside functions load Triton (through sparsity.kernels) or nvmath on first use, with
    a comment saying why; none breaks an import cycle. (The package's own `__init__.py` loads every
    name on first use: that is what it is for.)"""
    for path in sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py"):
        lines = path.read_text().splitlines()
        for lineno, module in _function_local_imports(path):
            assert module.startswith(("sparsity.kernels", "nvmath")), (
                f"{path.relative_to(PACKAGE)}:{lineno} {module}"
            )
            context = "\n".join(lines[max(0, lineno - 4) : lineno])
            assert "optional dependency" in context, (
                f"{path.relative_to(PACKAGE)}:{lineno}: say why it is lazy"
            )


CSLT_LAYERS = ["library", "compressor", "plans", "search", "packing", "wgrad", "ops", "backend"]


def test_cusparselt_layers_import_only_downward():
    pkg = PACKAGE / "backends" / "cusparselt"
    assert sorted(p.stem for p in pkg.glob("*.py")) == sorted(CSLT_LAYERS + ["__init__"])
    for i, name in enumerate(CSLT_LAYERS):
        tree = ast.parse((pkg / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert node.module in CSLT_LAYERS[:i], f"{name} imports .{node.module}"
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("sparsity.")
            ):
                assert not node.module.startswith(
                    (
                        "sparsity.autograd",
                        "sparsity.traced",
                        "sparsity.modules",
                        "sparsity.converter",
                    )
                ), f"{name} imports {node.module}"


def test_library_modules_are_short_and_import_nothing_outside():
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        # (lines as `ruff format` writes them at 100 columns: 400 in the earlier 120-column style)
        assert len(text.splitlines()) <= 450, (
            f"{path.relative_to(PACKAGE)} has {len(text.splitlines())} lines"
        )
        for node in ast.walk(ast.parse(text)):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
            )
            for n in names:
                assert n.split(".")[0] not in (
                    "models",
                    "data",
                    "training",
                    "configs",
                    "evaluation",
                    "reporting",
                    "scripts",
                ), f"{path.relative_to(PACKAGE)} imports {n}"


# --------------------------------------------------------------------------------------------------
# the model converter


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.fc2(F.gelu(self.fc1(x))))


def test_convert_revert_round_trip(default_settings):
    torch.manual_seed(0)
    model = Mlp()
    x = torch.randn(3, 16)
    y_dense = model(x)
    modules = {n: m for n, m in model.named_modules()}
    params = {n: p for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    conv = SparseThenDense(
        modules=r"fc[12]", backend="dense", pruning="tile_greedy", cslt_search="none"
    )
    assert conv.name == "sparse_then_dense" and conv.phase == "dense"
    assert conv.convert(model) == ["fc1", "fc2"] and conv.phase == "sparse"
    assert type(model.fc1) is SemiSparseLinear and type(model.head) is nn.Linear
    assert backend_settings() == conv.settings  # converting configures the backends it runs on
    assert not torch.equal(model(x), y_dense)  # 2:4 now
    assert list(model.state_dict()) == keys
    assert conv.revert(model) == ["fc1", "fc2"] and conv.phase == "dense"
    assert all(type(m) is nn.Linear for m in (model.fc1, model.fc2, model.head))
    assert {n: m for n, m in model.named_modules()} == modules  # the same module objects
    assert all(p is params[n] for n, p in model.named_parameters())  # the same Parameters
    assert torch.equal(model(x), y_dense)


def test_activation_kind_and_bad_values():
    model = Mlp()
    SparseThenDense(modules="fc1", kind="activation", backend="dense", pruning="rowwise").convert(
        model
    )
    assert type(model.fc1) is SemiSparseActivationLinear
    with pytest.raises(ValueError, match="kind='bias'"):
        SparseThenDense(kind="bias")
    with pytest.raises(ValueError, match="unknown sparse backend 'fast'"):
        SparseThenDense(backend="fast")
    with pytest.raises(ValueError, match="cslt_pack='x'"):
        SparseThenDense(cslt_pack="x")
    with pytest.raises(ValueError, match="unknown model converter"):
        build_converter("float8", 0)


def test_schedule_converts_at_the_first_sparse_step_and_reverts_after(default_settings):
    model = Mlp()
    conv = build_converter("sparse_then_dense", 2, modules=r"fc[12]", backend="dense")
    assert [conv.phase_at(s) for s in range(4)] == ["sparse", "sparse", "dense", "dense"]
    assert conv.apply(model, 0) and type(model.fc1) is SemiSparseLinear
    assert not conv.apply(model, 1)
    assert conv.apply(model, 2) and type(model.fc1) is nn.Linear
    assert not conv.apply(model, 3)
    with pytest.raises(ValueError, match="unknown sparsity phase"):
        conv.set_phase(model, "half", 0)


def test_a_dense_warm_up_converts_after_it_and_reverts_at_the_same_switch(default_settings):
    """dense_warmup_steps=2 of sparse_steps=5: steps 0-1 dense, 2-4 sparse, 5 on dense."""
    model = Mlp()
    conv = build_converter(
        "sparse_then_dense", 5, modules=r"fc[12]", backend="dense", dense_warmup_steps=2
    )
    assert [conv.phase_at(s) for s in range(7)] == ["dense"] * 2 + ["sparse"] * 3 + ["dense"] * 2
    assert not conv.apply(model, 0) and type(model.fc1) is nn.Linear
    assert conv.apply(model, 2) and type(model.fc1) is SemiSparseLinear
    assert conv.apply(model, 5) and type(model.fc1) is nn.Linear
    assert (
        build_converter("sparse_then_dense", 0, dense_warmup_steps=3).phase_at(0) == "dense"
    )  # no sparse phase
    for warmup in (5, 6, -1):
        with pytest.raises(
            ValueError, match=f"dense_warmup_steps={warmup} must be >= 0 and leave a sparse step"
        ):
            SparseThenDense(5, dense_warmup_steps=warmup)


def test_decisions_are_json_and_name_each_shape(default_settings, monkeypatch):
    auto = get_backend("auto")
    monkeypatch.setattr(auto, "_sparse_unavailable", lambda w, t: "no GPU here")
    monkeypatch.setattr(auto, "decisions", {})
    auto.decide(torch.zeros(64, 32), "tile_greedy", 128, False)
    rec = json.loads(json.dumps(decisions(), default=str))
    assert rec["settings"] == {"cslt_search": "sweep", "cslt_pack": "auto", "fused_wgrad": True}
    (shape,) = rec["auto"]
    assert (shape["tokens"], shape["in_features"], shape["out_features"], shape["choice"]) == (
        128,
        32,
        64,
        "dense",
    )
    assert set(rec) == {
        "settings",
        "auto",
        "auto_fallbacks",
        "cusparselt_plans",
        "cusparselt_packing",
        "weight_grad",
    }
