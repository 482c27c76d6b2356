"""The torch solver's arithmetic: the 3xTF32 split (fp32 accuracy from TF32 tensor-core products),
IEEE fp32 and float64, all reaching the float64 optimum; the setting is typed and recorded. On CPU
fp32 matmuls are IEEE, so 3xTF32's three products must reproduce the plain fp32 product; the TF32
input rounding itself is emulated."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from configs import ConfigError, load_eval_config
from configs.eval_schema import PRECISIONS as SCHEMA_PRECISIONS
from evaluation.logreg import (
    PRECISIONS,
    TorchLBFGS,
    addmm,
    build_solver,
    c_grid,
    objective_and_grad,
    split_tf32,
)
from evaluation.probe import run_probe


def tf32(x):
    """A TF32 tensor core's view of an fp32 operand (truncation: the worst case of its rounding)."""
    return split_tf32(x)[0]


def awkward(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.logspace(
        -6, 6, shape[-1]
    )  # many exponents, both signs


def test_split_is_exact_and_hi_fits_tf32():
    x = torch.cat(
        [awkward((64, 64), 0).flatten(), torch.tensor([0.0, -0.0, 1.0, -3.0, 2.0**-130, 3e38])]
    )
    hi, lo = split_tf32(x)
    assert torch.all(
        hi.view(torch.int32) & 0x1FFF == 0
    )  # low 13 of 23 mantissa bits zero: exact in TF32
    assert torch.equal(hi + lo, x)  # no information lost
    assert torch.all(lo.abs() <= x.abs() * 2.0**-10)
    bf16 = x.bfloat16().float()  # bf16 (8-bit mantissa) is exact in TF32: nothing left for lo
    assert torch.equal(split_tf32(bf16)[0], bf16) and torch.all(split_tf32(bf16)[1] == 0)


def test_three_tf32_products_recover_fp32_accuracy():
    a, b = awkward((96, 80), 1), awkward((80, 48), 2).t().contiguous().t()
    exact = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()  # error scale of each entry

    def rel(approx):
        return float(((approx.double() - exact).abs() / scale).max())

    a_hi, a_lo = split_tf32(a)
    b_hi, b_lo = split_tf32(b)
    # each product on emulated TF32 inputs (exact fp64 accumulation isolates the input rounding)
    one = tf32(a).double() @ tf32(b).double()
    three = (
        a_hi.double() @ tf32(b_lo).double()
        + tf32(a_lo).double() @ b_hi.double()
        + a_hi.double() @ b_hi.double()
    )
    assert rel(one) > 1e-4 and rel(three) < 2e-6
    # the code path: on CPU its TF32 products are IEEE, so it must reproduce the plain fp32 product
    c = torch.randn(48)
    plain = torch.addmm(c, a, b)
    split = addmm(c, a, b, "3xtf32")
    assert float((split - plain).abs().max() / plain.abs().max()) < 1e-6
    assert rel(split - c) < 1e-5
    a16 = a.bfloat16().float()  # an exact operand: its lo term is skipped, same result
    plain16 = torch.addmm(c, a16, b)
    assert (
        float(
            (addmm(c, a16, b, "3xtf32", a_exact=True) - plain16).abs().max() / plain16.abs().max()
        )
        < 1e-6
    )


def test_objective_in_3xtf32_matches_float64():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(500, 24, generator=g) * 3 + 5, torch.randint(0, 7, (500,), generator=g)
    w, b = torch.randn(7, 24, generator=g) * 0.1, torch.randn(7, generator=g)
    for xs in (
        x,
        x.bfloat16(),
    ):  # fp32 features (both operands split) and bf16 ones (exact: no lo term)
        ref = objective_and_grad(xs.double(), y, w.double(), b.double(), 0.3, chunk=128)
        ours = objective_and_grad(xs, y, w, b, 0.3, chunk=128, mode="3xtf32")
        assert ours[0] == pytest.approx(ref[0], rel=1e-6)
        assert torch.allclose(ours[1].double(), ref[1], rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    x, y = torch.tensor(d.data, dtype=torch.float32) / 16.0 * 5 + 2, torch.tensor(d.target)
    val = torch.arange(len(y)) % 5 == 0
    return x[~val], y[~val], x[val], y[val]


@pytest.mark.parametrize(
    "solver",
    [TorchLBFGS(dtype=torch.float32), TorchLBFGS(precision="float32_3xtf32")],
    ids=["ieee-float32", "3xtf32"],
)
def test_float32_paths_reach_the_float64_objective_at_the_chosen_C(digits, solver):
    x, y, xv, yv = digits
    result = run_probe(solver, x, y, xv, yv, Cs=c_grid(-4, 1, 4), progress=False)
    f64 = TorchLBFGS(precision="float64", tol=1e-9).fit(x, y, 10, result.best_C)
    assert result.final.precision == solver.precision and result.final.weight.dtype == torch.float32
    assert abs(result.final.loss - f64.loss) / f64.loss < 1e-4
    true_loss = objective_and_grad(
        x,
        y,
        result.final.weight.double(),
        result.final.bias.double(),
        result.best_C,
        need_grad=False,
    )[0]  # the fp32 weights' objective, evaluated in float64
    assert abs(true_loss - f64.loss) / f64.loss < 1e-4


def test_precision_setting_is_typed_and_resolved():
    assert tuple(SCHEMA_PRECISIONS) == PRECISIONS
    assert (
        load_eval_config(None, ["linear.precision=float32_3xtf32"]).linear.precision
        == "float32_3xtf32"
    )
    with pytest.raises(ConfigError, match="linear.precision='tf32' is not one of"):
        load_eval_config(None, ["linear.precision=tf32"])
    with pytest.raises(ConfigError, match="needs solver=torch"):
        load_eval_config(None, ["solver=sklearn", "linear.precision=float32"])
    assert (
        build_solver("auto", 10, 1e-6, precision="float32").name == "torch"
    )  # sklearn has no float32
    small = torch.zeros(10, 4)
    assert TorchLBFGS().resolve_precision(small, 3) == "float64"  # CPU: float64, whatever the size
    assert (
        TorchLBFGS(precision="float32_tf32").resolve_precision(small, 3) == "float32_tf32"
    )  # benchmarks only
    with pytest.raises(ValueError, match="contradicts"):
        TorchLBFGS(dtype=torch.float64, precision="float32")


@pytest.mark.gpu
def test_on_gpu_3xtf32_is_fp32_accurate_and_tf32_is_not():
    a, b = awkward((2048, 1024), 3).cuda(), awkward((1024, 1000), 4).cuda()
    exact = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    zero = torch.zeros(1000, device="cuda")
    err = {
        mode: float(((addmm(zero, a, b, mode).double() - exact).abs() / scale).max())
        for mode in ("ieee", "3xtf32", "tf32")
    }
    assert err["3xtf32"] < 4 * err["ieee"] + 1e-6 and err["tf32"] > 1e-4, err
    assert np.isfinite(list(err.values())).all()
