"""Every Triton pruning kernel equals its torch reference (masks exact; values exact, except bf16
values computed in fp32 under the CPU interpreter, whose fp32 -> bf16 cast truncates: there 1 ulp).
Runs the compiled kernels on CUDA."""

import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("triton")

from sparsity.pruning import METHODS, is_transposable, mvue, philox_uniform4, prune  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_values_equal(got: torch.Tensor, ref: torch.Tensor, computed: bool):
    """Bit equality; for bf16 values computed in fp32 under the interpreter, at most 1 ulp towards
    zero."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if computed and got.dtype == torch.bfloat16 and INTERPRETED:
        gi, ri = got.view(torch.int16).int(), ref.view(torch.int16).int()
        assert ((gi - ri).abs() <= 1).all(), (got - ref).abs().max()
        assert (got.float().abs() <= ref.float().abs()).all()  # truncation only shrinks
    else:
        assert torch.equal(got, ref), (got.float() - ref.float()).abs().max()


def _with_ties(w: torch.Tensor) -> torch.Tensor:
    w = w.clone()
    w.view(-1)[: w.numel() // 3] = (
        w.view(-1)[: w.numel() // 3].sign() * 0.5
    )  # many equal magnitudes
    w.view(-1)[-8:] = 0.0
    return w


def _cases(method):
    shapes = [(64, 128), (12, 20), (4, 4)]
    if not is_transposable(method):
        shapes += [(3, 8), (1, 4)]
    return shapes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", METHODS)
def test_prune_kernel_equals_reference(method, dtype):
    g = torch.Generator().manual_seed(0)
    for shape in _cases(method):
        w = _with_ties(torch.randn(shape, generator=g)).to(dtype).to(DEVICE)
        v_ref, m_ref = prune(w, method, impl="reference")
        v, m = prune(w, method, impl="triton")
        assert torch.equal(m, m_ref), (method, shape)
        assert_values_equal(v, v_ref, computed=method == "soft_threshold")


@pytest.mark.parametrize("method", METHODS)
def test_prune_kernel_non_contiguous_inputs(method):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(48, 40, generator=g).to(DEVICE)
    views = [
        base.t(),
        base[:, 8:32],
        base[::2, ::2][:, :16],
    ]  # transposed, sliced columns, strided both ways
    for w in views:
        assert not w.is_contiguous()
        v_ref, m_ref = prune(w.contiguous(), method, impl="reference")
        v, m = prune(w, method, impl="triton")
        assert torch.equal(m, m_ref) and torch.equal(v, v_ref)


@settings(max_examples=8, deadline=None)
@given(
    rows=st.integers(1, 6).map(lambda k: 4 * k),
    cols=st.integers(1, 6).map(lambda k: 4 * k),
    seed=st.integers(0, 2**31 - 1),
    ints=st.booleans(),
    dtype=st.sampled_from(DTYPES),
)
def test_prune_kernels_property(rows, cols, seed, ints, dtype):
    g = torch.Generator().manual_seed(seed)
    w = (
        torch.randint(-3, 4, (rows, cols), generator=g).float()
        if ints
        else torch.randn(rows, cols, generator=g)
    )
    w = w.to(dtype).to(DEVICE)
    for method in METHODS:
        v_ref, m_ref = prune(w, method, impl="reference")
        v, m = prune(w, method, impl="triton")
        assert torch.equal(m, m_ref), method
        assert_values_equal(v, v_ref, computed=method == "soft_threshold")


@pytest.mark.parametrize("dtype", DTYPES)
def test_mvue_kernel_equals_reference(dtype):
    g = torch.Generator().manual_seed(2)
    cases = [
        torch.randn(64, 128, generator=g),
        torch.randn(3, 5, 12, generator=g),  # leading dims
        torch.randn(40, 24, generator=g).t(),  # non-contiguous, last dim 40
        torch.zeros(2, 8),
    ]
    for x in cases:
        x = x.to(dtype).to(DEVICE)
        for seed in (0, 12345, 2**40 + 7):
            ref = mvue(x, seed, impl="reference")
            got = mvue(x, seed, impl="triton")
            assert torch.equal(got != 0, ref != 0)
            assert_values_equal(got, ref, computed=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mvue_pack_t_decodes_to_the_reference(dtype):
    """The weight gradient's operand, MVUE(dy^T) written straight in cuSPARSELt's "col" layout,
    against the torch references of MVUE and of the layout: decoded values equal
    `reference.mvue24(dy^T)`, metadata bytes equal `layout.pack_reference`'s (dy without zeros, so
    every kept entry is nonzero and both name the same pair)."""
    from sparsity.kernels.mvue import mvue_pack_t
    from sparsity.packing import layout as L

    g = torch.Generator().manual_seed(5)
    for tokens, out in ((64, 16), (128, 48), (192, 64)):  # 48: a partial band of 64 metadata rows
        dy = torch.randn(tokens, out, generator=g)
        dy[::7] *= (
            # groups with one large entry and tiny ones, where the draw probabilities are uneven
            1e-3
        )
        dy = dy.to(dtype).to(DEVICE)
        for seed in (0, 2**40 + 7):
            ref = mvue(dy.t(), seed, impl="reference")  # (out, tokens), 2:4 along tokens
            buf = mvue_pack_t(dy, seed)
            assert buf.numel() == L.compressed_size(out, tokens)
            got = L.unpack_reference(buf, out, tokens, "col", dtype)
            assert torch.equal(got != 0, ref != 0)
            assert_values_equal(got, ref, computed=True)
            meta = slice(L.values_bytes(out, tokens), None)
            valid = L.valid_byte_mask(out, tokens, DEVICE)[meta]
            assert torch.equal(buf[meta][valid], L.pack_reference(ref, "col")[meta][valid])
            # the seed read from a device tensor (a compiled backward's draw) gives the same bytes
            assert torch.equal(mvue_pack_t(dy, torch.tensor([seed], device=DEVICE)), buf)
            # approximate division: the same kept entries (the draws divide nothing), values within
            # an ulp
            approx = L.unpack_reference(
                mvue_pack_t(dy, seed, exact=False), out, tokens, "col", dtype
            )
            assert torch.equal(approx != 0, ref != 0)
            assert ((approx.view(torch.int16).int() - ref.view(torch.int16).int()).abs() <= 1).all()


def test_mvue_pack_t_refuses_shapes_the_layout_cannot_hold():
    from sparsity.kernels.mvue import mvue_pack_t

    with pytest.raises(ValueError, match=r"tokens % 64 == 0 and out % 16 == 0, got \(96, 16\)"):
        mvue_pack_t(torch.zeros(96, 16, dtype=torch.bfloat16, device=DEVICE), 0)
    with pytest.raises(ValueError, match=r"\(64, 8\)"):
        mvue_pack_t(torch.zeros(64, 8, dtype=torch.bfloat16, device=DEVICE), 0)
    with pytest.raises(TypeError, match="fp16/bf16"):
        mvue_pack_t(torch.zeros(64, 16, device=DEVICE), 0)
    with pytest.raises(ValueError, match="one int64"):
        mvue_pack_t(
            torch.zeros(64, 16, dtype=torch.bfloat16, device=DEVICE),
            torch.tensor([1.0], device=DEVICE),
        )


def test_philox_reference_equals_tl_rand4x():
    import triton
    import triton.language as tl

    @triton.jit
    def draw(out, seed, N: tl.constexpr):
        o = tl.arange(0, N)
        a, b, c, d = tl.rand4x(seed, o)
        tl.store(out + o, a)
        tl.store(out + N + o, b)
        tl.store(out + 2 * N + o, c)
        tl.store(out + 3 * N + o, d)

    for seed in (0, 1, 2**33 + 5, 2**62 + 3):
        out = torch.empty(4 * 512, device=DEVICE)
        draw[(1,)](out, seed, N=512)
        ref = torch.cat(philox_uniform4(seed, torch.arange(512, device=DEVICE)))
        assert torch.equal(out, ref), seed


def test_kernel_errors():
    with pytest.raises(ValueError, match=r"\(6, 8\)"):
        prune(torch.zeros(6, 8, device=DEVICE), "tile_greedy", impl="triton")
    with pytest.raises(ValueError, match="last dim"):
        mvue(torch.zeros(4, 6, device=DEVICE), 0, impl="triton")
