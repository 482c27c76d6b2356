"""GPU tests of the cuSPARSELt backend, the fused prune+pack kernel and the auto backend.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`. Every check draws fresh random inputs;
sparse results are compared with the dense masked product (fp32 reference) by relative Frobenius
error.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparsity.backends.cuda import (
    rel_err as _rel,
)  # relative Frobenius error against an fp32 reference

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def cs():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import os

    from sparsity.backends import (
        BackendSettings,
        BackendUnavailable,
        configure_backends,
        get_backend,
    )

    # the algorithm sweep (~50 plans per new shape) would dominate the run time of these many-shape
    # tests; it has its own test below. SPARSITY_TEST_SWEEP=1 keeps it on everywhere.
    if os.environ.get("SPARSITY_TEST_SWEEP") != "1":
        configure_backends(BackendSettings(cslt_search="none"))
    b = get_backend("cusparselt")
    try:
        b.check(torch.device("cuda"), torch.bfloat16)
    except BackendUnavailable as e:
        pytest.skip(f"cusparselt unavailable: {e}")
    return b


def _masked(w, pruning="tile_greedy"):
    from sparsity.pruning import prune

    values, mask = prune(w, pruning, impl="reference")
    return values, mask


# --------------------------------------------------------------------------------------------------
# fused pack == library compressor


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096, 1024), (1024, 4096), (256, 512), (48, 80), (96, 160)])
def test_fused_pack_equals_library(cs, dtype, shape):
    from sparsity.backends.cusparselt import compressor as P
    from sparsity.kernels.pack_cusparselt import prune_pack, tile_bits_to_mask
    from sparsity.packing import layout as L
    from sparsity.pruning.reference import tile_greedy_mask

    out_f, in_f = shape
    w = torch.randn(out_f, in_f, device="cuda", dtype=dtype)
    w[::5, ::3] = 0.5  # exact ties
    pk = prune_pack(w)
    mask = tile_bits_to_mask(pk.tile_bits)
    assert torch.equal(mask, tile_greedy_mask(w)), "fused greedy differs from the reference mask"
    wp = torch.where(mask, w, torch.zeros((), dtype=dtype, device="cuda"))
    for kind, got in (("fwd", pk.fwd), ("dgrad", pk.dgrad)):
        comp = P.compressor(0, P.OperandLayout.for_weight(out_f, in_f, kind), dtype)
        ref = comp(wp)
        m, k = (out_f, in_f) if kind == "fwd" else (in_f, out_f)
        valid = L.valid_byte_mask(m, k, "cuda")
        assert ref.numel() == got.numel()
        assert torch.equal(ref[valid], got[valid]), f"{kind} bytes differ"


@pytest.mark.parametrize("write_t", [True, False])
@pytest.mark.parametrize("shape", [(4096, 1024), (1024, 4096)])
def test_group_pack_equals_the_library_and_replays_in_a_graph(cs, shape, write_t):
    """prune_pack_group at ViT-L's MLP shapes: each weight's bytes those of the library's compressor
    on its tile_greedy pruning; captured in a CUDA graph and replayed after the weights changed in
    place (as a training step's parameters do), it packs the new values."""
    from sparsity.backends.cusparselt import compressor as P
    from sparsity.kernels.pack_cusparselt import tile_bits_to_mask
    from sparsity.kernels.pack_cusparselt_group import prune_pack_group
    from sparsity.packing import layout as L
    from sparsity.pruning.reference import tile_greedy_mask

    out_f, in_f = shape
    weights = [torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    weights[2][::5, ::3] = 0.5  # exact ties

    def check(outs):
        for pk, w in zip(outs, weights):
            mask = tile_bits_to_mask(pk.tile_bits)
            assert torch.equal(mask, tile_greedy_mask(w))
            wp = torch.where(mask, w, torch.zeros((), dtype=w.dtype, device="cuda"))
            for kind, got in (("fwd", pk.fwd), ("dgrad", pk.dgrad)):
                if kind == "dgrad" and not write_t:
                    assert got is None
                    continue
                comp = P.compressor(0, P.OperandLayout.for_weight(out_f, in_f, kind), w.dtype)
                m, k = (out_f, in_f) if kind == "fwd" else (in_f, out_f)
                valid = L.valid_byte_mask(m, k, "cuda")
                assert torch.equal(comp(wp)[valid], got[valid]), f"{kind} bytes differ"

    outs = prune_pack_group(weights, write_t=write_t)
    check(outs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prune_pack_group(weights, write_t=write_t, out=outs)
    for w in weights:
        w.copy_(torch.randn_like(w))
    graph.replay()
    torch.cuda.synchronize()
    check(outs)


@pytest.mark.parametrize("pruning", ["tile_optimal", "rowwise", "soft_threshold"])
def test_pack_given_mask_equals_library(cs, pruning):
    from sparsity.backends.cusparselt import compressor as P
    from sparsity.kernels.pack_cusparselt import prune_pack
    from sparsity.packing import layout as L
    from sparsity.pruning import is_transposable, prune

    dtype = torch.bfloat16
    w = torch.randn(512, 256, device="cuda", dtype=dtype)
    values, mask = prune(w, pruning)
    pk = prune_pack(values, mask, write_t=is_transposable(pruning))
    kinds = [("fwd", pk.fwd)] + ([("dgrad", pk.dgrad)] if is_transposable(pruning) else [])
    for kind, got in kinds:
        ref = P.compressor(0, P.OperandLayout.for_weight(512, 256, kind), dtype)(values)
        m, k = (512, 256) if kind == "fwd" else (256, 512)
        valid = L.valid_byte_mask(m, k, "cuda")
        assert torch.equal(ref[valid], got[valid])


def test_layout_probe_and_status(cs):
    from sparsity.backends.cusparselt import layout_status, probe_layout

    assert probe_layout(torch.device("cuda"), torch.bfloat16)
    assert probe_layout(torch.device("cuda"), torch.float16)
    st = layout_status(torch.device("cuda"), torch.bfloat16)
    assert st["pack"] == "triton", st


# --------------------------------------------------------------------------------------------------
# GEMMs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [4096, 1000, 37, 4100])
@pytest.mark.parametrize("shape", [(4096, 1024), (1024, 4096), (192, 80)])
def test_matmul_and_matmul_t_match_dense(cs, dtype, tokens, shape):
    out_f, in_f = shape
    w = torch.randn(out_f, in_f, device="cuda", dtype=dtype)
    sw = cs.sparsify(w, "tile_greedy")
    wp = sw.to_dense()
    values, mask = _masked(w)
    assert torch.equal(sw.mask(), mask) and torch.equal(wp, values)
    for _ in range(2):  # a fresh input every check
        x = torch.randn(tokens, in_f, device="cuda", dtype=dtype)
        dy = torch.randn(tokens, out_f, device="cuda", dtype=dtype)
        b = torch.randn(out_f, device="cuda", dtype=dtype)
        assert _rel(sw.matmul(x), x.float() @ wp.float().t()) < 1e-2
        assert _rel(sw.matmul(x, b), x.float() @ wp.float().t() + b.float()) < 1e-2
        assert _rel(sw.matmul_t(dy), dy.float() @ wp.float()) < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_non_contiguous_inputs(cs, dtype):
    w = torch.randn(1024, 512, device="cuda", dtype=dtype)
    sw = cs.sparsify(w, "tile_greedy")
    wp = sw.to_dense().float()
    big = torch.randn(2048, 1024, device="cuda", dtype=dtype)
    cases = {
        "column slice": big[:, 100:612],  # row stride 1024, misaligned start
        "transposed": torch.randn(
            512, 2048, device="cuda", dtype=dtype
        ).t(),  # column-major: op(B)=N path
        "row step": big[::2, :512],
        "expanded": torch.randn(1, 512, device="cuda", dtype=dtype).expand(64, 512),
    }
    for name, x in cases.items():
        assert _rel(sw.matmul(x), x.float() @ wp.t()) < 1e-2, name
    dy = torch.randn(1024, 2048, device="cuda", dtype=dtype).t()
    assert _rel(sw.matmul_t(dy), dy.float() @ wp) < 1e-2


@pytest.mark.parametrize("pruning", ["tile_optimal", "rowwise", "soft_threshold"])
def test_other_prunings(cs, pruning):
    dtype = torch.bfloat16
    w = torch.randn(1024, 512, device="cuda", dtype=dtype)
    sw = cs.sparsify(w, pruning)
    values, mask = _masked(w, pruning)
    assert torch.equal(sw.mask(), mask)
    x = torch.randn(333, 512, device="cuda", dtype=dtype)
    dy = torch.randn(333, 1024, device="cuda", dtype=dtype)
    assert _rel(sw.matmul(x), x.float() @ values.float().t()) < 1e-2
    assert _rel(sw.matmul_t(dy), dy.float() @ values.float()) < 1e-2


def test_padded_rows_and_bad_shapes(cs):
    from sparsity.backends import BackendUnavailable

    w = torch.randn(
        100, 64, device="cuda", dtype=torch.bfloat16
    )  # out not a multiple of 16: zero-padded rows
    sw = cs.sparsify(w, "tile_greedy")
    values, _ = _masked(w)
    x = torch.randn(50, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(100, device="cuda", dtype=torch.bfloat16)
    assert _rel(sw.matmul(x, b), x.float() @ values.float().t() + b.float()) < 1e-2
    dy = torch.randn(50, 100, device="cuda", dtype=torch.bfloat16)
    assert _rel(sw.matmul_t(dy), dy.float() @ values.float()) < 1e-2
    with pytest.raises(BackendUnavailable, match=r"\(64, 72\)"):
        cs.sparsify(torch.randn(64, 72, device="cuda", dtype=torch.bfloat16), "tile_greedy")
    with pytest.raises(BackendUnavailable, match="fp16 and bf16"):
        cs.sparsify(torch.randn(64, 64, device="cuda"), "tile_greedy")


def test_library_compressor_fallback(cs, monkeypatch):
    import sparsity.backends.cusparselt.packing as C

    dev_index = torch.cuda.current_device()
    monkeypatch.setitem(
        C._layout_status,
        (dev_index, torch.float16, cs.settings.cslt_pack),
        {"pack": "library", "reason": "test"},
    )
    w = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    sw = cs.sparsify(w, "tile_greedy")
    values, _ = _masked(w)
    x = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    dy = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    assert _rel(sw.matmul(x), x.float() @ values.float().t()) < 1e-2
    assert _rel(sw.matmul_t(dy), dy.float() @ values.float()) < 1e-2


def test_other_thread(cs):
    """Backward may run on autograd's device thread: plans and handles are per thread."""
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    sw = cs.sparsify(w, "tile_greedy")
    wp = sw.to_dense().float()
    res = {}

    def work():
        x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
        res["err"] = _rel(sw.matmul_t(x), x.float() @ wp)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert res["err"] < 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
def test_plans_record_verified_algorithms(cs, dtype):
    from sparsity.backends import BackendSettings
    from sparsity.backends.cusparselt import CuSparseLtBackend, search as P

    sweeping = CuSparseLtBackend(
        BackendSettings(cslt_search="sweep")
    )  # the setting reaches it by its constructor
    w = torch.randn(2048, 1024, device="cuda", dtype=dtype)
    sw = sweeping.sparsify(w, "tile_greedy")
    x = torch.randn(2048, 1024, device="cuda", dtype=dtype)
    y = sw.matmul(x)
    assert _rel(y, x.float() @ sw.to_dense().float().t()) < 1e-2
    recs = [v for k, v in P.plan_records().items() if "2048, 1024, 2048" in k and str(dtype) in k]
    assert recs and all("alg_id" in r for r in recs)
    # each record names its GEMM, so that a benchmark can say which algorithm each of its rows ran
    assert {(r["out_features"], r["in_features"], r["tokens"], r["dtype"]) for r in recs} == {
        (2048, 1024, 2048, str(dtype).replace("torch.", ""))
    }
    if dtype == torch.float16:  # the blocklisted (crashing) algorithms were never run
        assert all(r["alg_id"] < 34 for r in recs)


def test_the_mapped_library_is_found(cs):
    """What a benchmark records as the library it ran (a process started with LD_PRELOAD runs
    another copy)."""
    from sparsity.backends.cusparselt.library import loaded_library_path, version

    path = loaded_library_path()
    assert path is not None and "libcusparseLt.so" in path, path
    assert version() >= 800


# --------------------------------------------------------------------------------------------------
# through the modules: eager, autocast, CUDA graph, torch.compile


def _pair(in_f=1024, out_f=4096, dtype=torch.float32, seed=0):
    from sparsity import SemiSparseLinear

    torch.manual_seed(seed)
    lin = nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    a = SemiSparseLinear.from_dense(lin, backend="cusparselt")
    lin2 = nn.Linear(in_f, out_f, device="cuda", dtype=dtype)
    lin2.load_state_dict(lin.state_dict())
    b = SemiSparseLinear.from_dense(lin2, backend="dense")
    return a, b


@pytest.mark.parametrize("dtype", DTYPES)
def test_semisparse_linear_equals_dense_backend(cs, dtype):
    a, b = _pair(dtype=dtype)
    x = torch.randn(8, 300, 1024, device="cuda", dtype=dtype)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn(8, 300, 4096, device="cuda", dtype=dtype)
    ya, yb = a(xa), b(xb)
    ya.backward(dy)
    yb.backward(dy)
    assert _rel(ya, yb) < 1e-2
    assert _rel(xa.grad, xb.grad) < 1e-2
    assert _rel(a.weight.grad, b.weight.grad) < 1e-2
    assert _rel(a.bias.grad, b.bias.grad) < 1e-2


def test_semisparse_linear_autocast_fp32_master(cs):
    a, b = _pair(dtype=torch.float32)
    x = torch.randn(4096, 1024, device="cuda")
    dy = torch.randn(4096, 4096, device="cuda")
    outs = []
    for m in (a, b):
        xx = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xx)
        assert y.dtype == torch.bfloat16
        y.backward(dy.to(y.dtype))
        assert m.weight.grad.dtype == torch.float32 and xx.grad.dtype == torch.float32
        outs.append((y, xx.grad, m.weight.grad))
    for u, v in zip(outs[0], outs[1]):
        assert _rel(u, v) < 1e-2


def test_masked_grad_and_activation_sparse(cs):
    from sparsity import SemiSparseActivationLinear, SemiSparseLinear

    torch.manual_seed(1)
    lin = nn.Linear(512, 256, device="cuda", dtype=torch.bfloat16)
    m = SemiSparseLinear.from_dense(lin, backend="cusparselt", masked_grad=True)
    x = torch.randn(100, 512, device="cuda", dtype=torch.bfloat16)
    m(x).sum().backward()
    mask = _masked(lin.weight.detach())[1]
    assert bool((lin.weight.grad[~mask] == 0).all())
    # activation 2:4 (rowwise over tokens x in; odd token count -> padded sparse rows)
    lin2 = nn.Linear(512, 256, device="cuda", dtype=torch.bfloat16)
    ma = SemiSparseActivationLinear.from_dense(lin2, backend="cusparselt")
    lin3 = nn.Linear(512, 256, device="cuda", dtype=torch.bfloat16)
    lin3.load_state_dict(lin2.state_dict())
    mb = SemiSparseActivationLinear.from_dense(lin3, backend="dense")
    x = torch.randn(3, 37, 512, device="cuda", dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ma(xa), mb(xb)
    dy = torch.randn_like(ya)
    ya.backward(dy)
    yb.backward(dy)
    assert (
        _rel(ya, yb) < 1e-2
        and _rel(xa.grad, xb.grad) < 1e-2
        and _rel(lin2.weight.grad, lin3.weight.grad) < 1e-2
    )


def test_cuda_graph_capture(cs):
    a, b = _pair(dtype=torch.bfloat16)
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up: plans and algorithm choice happen here, outside capture
            a.weight.grad = None
            x.grad = None
            a(x).backward(dy)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    a.weight.grad = None
    x.grad = None
    with torch.cuda.graph(g):
        y = a(x)
        y.backward(dy)
    with torch.no_grad():
        x.copy_(torch.randn_like(x))
        a.weight.add_(
            0.01 * torch.randn_like(a.weight)
        )  # the graph re-prunes and re-packs the new weight
        b.weight.copy_(a.weight)
    g.replay()
    torch.cuda.synchronize()
    xb = x.detach().clone().requires_grad_()
    yb = b(xb)
    yb.backward(dy)
    assert _rel(y, yb) < 1e-2
    assert _rel(x.grad, xb.grad) < 1e-2
    assert _rel(a.weight.grad, b.weight.grad) < 1e-2


def test_torch_compile(cs):
    a, b = _pair(in_f=512, out_f=1024, dtype=torch.bfloat16)
    mlp = nn.Sequential(a, nn.GELU()).cuda()
    comp = torch.compile(mlp)
    x = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = comp(x)
    y.float().pow(2).mean().backward()
    xb = x.detach().clone().requires_grad_()
    yb = F.gelu(b(xb))
    yb.float().pow(2).mean().backward()
    assert (
        _rel(y, yb) < 1e-2
        and _rel(x.grad, xb.grad) < 1e-2
        and _rel(a.weight.grad, b.weight.grad) < 1e-2
    )


# --------------------------------------------------------------------------------------------------
# auto


def test_auto_decides_and_records(cs):
    from sparsity import SemiSparseLinear
    from sparsity.backends import get_backend

    auto = get_backend("auto")
    torch.manual_seed(0)
    lin = nn.Linear(1024, 4096, device="cuda", dtype=torch.bfloat16)
    ref = nn.Linear(1024, 4096, device="cuda", dtype=torch.bfloat16)
    ref.load_state_dict(lin.state_dict())
    m = SemiSparseLinear.from_dense(lin, backend="auto")
    r = SemiSparseLinear.from_dense(ref, backend="dense")
    for tokens in (8192, 256):
        x = torch.randn(tokens, 1024, device="cuda", dtype=torch.bfloat16)
        assert _rel(m(x), r(x)) < 1e-2
    from sparsity.backends.auto import MARGIN

    decisions = auto.describe()["decisions"]
    got = {(d["tokens"], d["in_features"], d["out_features"]) for d in decisions}
    assert {(8192, 1024, 4096), (256, 1024, 4096)} <= got
    for d in decisions:
        assert d["choice"] in ("cusparselt", "dense")
        if "speedup" in d:
            assert (d["choice"] == "cusparselt") == (d["speedup"] > MARGIN)


def test_prune_dense_kernel(cs):
    from sparsity.kernels.pack_cusparselt import prune_dense, tile_bits_to_mask
    from sparsity.pruning.reference import tile_greedy_mask

    for dtype in DTYPES:
        w = torch.randn(1024, 4096, device="cuda", dtype=dtype)
        w[::5, ::3] = 0.5
        wp, bits = prune_dense(w)
        m = tile_greedy_mask(w)
        assert torch.equal(tile_bits_to_mask(bits), m)
        assert torch.equal(wp, torch.where(m, w, torch.zeros((), dtype=dtype, device="cuda")))


def test_auto_on_cpu_is_dense():
    from sparsity.backends import get_backend
    from sparsity.backends.dense import DenseSparseWeight

    sw = get_backend("auto").sparsify(torch.randn(64, 64), "tile_greedy")
    assert isinstance(sw, DenseSparseWeight)


# --------------------------------------------------------------------------------------------------
# the other helper's Triton pruning kernels on the GPU


@pytest.mark.parametrize("method", ["rowwise", "soft_threshold", "tile_greedy", "tile_optimal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pruning_kernels_equal_reference_on_gpu(method, dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sparsity.pruning import prune

    w = torch.randn(512, 768, device="cuda").to(dtype)
    w[::3, ::5] = 0.5
    v_k, m_k = prune(w, method, impl="triton")
    v_r, m_r = prune(w, method, impl="reference")
    assert torch.equal(m_k, m_r)
    assert torch.equal(v_k, v_r)


def test_mvue_kernel_equals_reference_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sparsity.pruning import mvue

    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(mvue(x, 1234, impl="triton"), mvue(x, 1234, impl="reference"))


def test_mvue_pack_t_equals_the_references_on_gpu():
    """The weight gradient's compressed operand, bit for bit: values as `reference.mvue24(dy^T)`,
    all defined bytes as `layout.pack_reference` (the layout checked against cuSPARSELt's own
    compressor in test_pack_layout)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sparsity.kernels.mvue import mvue_pack_t
    from sparsity.packing import layout as L
    from sparsity.pruning import mvue

    for dtype in DTYPES:
        dy = torch.randn(1024, 192, device="cuda", dtype=dtype)
        ref = mvue(dy.t(), 99, impl="reference")
        buf = mvue_pack_t(dy, 99)
        valid = L.valid_byte_mask(192, 1024, "cuda")
        assert torch.equal(buf[valid], L.pack_reference(ref, "col")[valid])
        approx = L.unpack_reference(mvue_pack_t(dy, 99, exact=False), 192, 1024, "col", dtype)
        assert torch.equal(approx != 0, ref != 0)  # the draws divide nothing: the same entries kept
        assert ((approx.view(torch.int16).int() - ref.view(torch.int16).int()).abs() <= 1).all()


@pytest.mark.parametrize(
    "tokens", [1024, 1000]
)  # 1000: 960 pruned, the last 40 exact through a dense GEMM
def test_mvue_weight_grad_on_cusparselt_equals_the_dense_product_of_the_reference(cs, tokens):
    from sparsity.backends import get_backend
    from sparsity.pruning import mvue

    n = tokens - tokens % 64
    for dtype in DTYPES:
        dy = torch.randn(tokens, 256, device="cuda", dtype=dtype)
        x = torch.randn(tokens, 128, device="cuda", dtype=dtype)
        got = cs.mvue_weight_grad(dy, x, 7)
        assert got is not None and got.shape == (256, 128) and got.dtype == dtype
        pruned = mvue(dy[:n].t(), 7, impl="reference").float()
        expected = pruned @ x[:n].float() + dy[n:].t().float() @ x[n:].float()
        assert _rel(got, expected) < 1e-2
        assert _rel(got, dy.t().float() @ x.float()) > 0.1  # an estimate, not the dense gradient
        assert torch.equal(
            get_backend("auto").mvue_weight_grad(dy, x, 7), got
        )  # auto runs it on cuSPARSELt too
        seed = torch.tensor(
            [7], device="cuda"
        )  # the compiled backward's op, its seed on the GPU: the same GEMM
        assert torch.equal(
            torch.ops.sparsity.cslt_mvue_wgrad(dy, x, seed, cs.settings.cslt_search), got
        )
    assert (
        cs.mvue_weight_grad(dy[:32], x[:32], 7) is None
    )  # under 64 tokens: the caller's dense GEMM


def test_mvue24_layer_trains_its_weight_gradient_on_cusparselt(cs):
    """The eager layer under bf16 autocast with fp32 master weights: its weight gradient is the 2:4
    GEMM's estimate (the seed drawn from torch's CPU generator), dx and db exact."""
    from sparsity.modules import SemiSparseLinear
    from sparsity.pruning import mvue

    torch.manual_seed(0)
    layer = SemiSparseLinear.from_dense(
        nn.Linear(256, 512).cuda(), backend="cusparselt", weight_grad="mvue24"
    )
    x = torch.randn(4, 200, 256, device="cuda", requires_grad=True)  # 800 tokens: 768 pruned
    dy = torch.randn(4, 200, 512, device="cuda")
    torch.manual_seed(3)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    y.backward(dy)
    torch.manual_seed(3)
    seed = int(torch.randint(0, 2**62, ()))
    dy2, x2 = dy.reshape(800, 512).bfloat16(), x.detach().reshape(800, 256).bfloat16()
    expected = (
        mvue(dy2[:768].t(), seed, impl="reference").float() @ x2[:768].float()
        + dy2[768:].t().float() @ x2[768:].float()
    )
    assert layer.weight.grad.dtype == torch.float32
    assert _rel(layer.weight.grad, expected) < 1e-2
    torch.testing.assert_close(layer.bias.grad, dy.reshape(800, 512).sum(0), rtol=1e-2, atol=0.5)
