"""cuSPARSELt's compressed 2:4 layout: the pure-torch reference packer against bytes dumped from the
library (sm90, cuSPARSELt 0.8.0, tests/fixtures/cusparselt_layout_sm90_v800.pt), and the fused
Triton prune+pack kernel (interpreter on CPU) against the reference packer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sparsity.packing import layout as L
from sparsity.pruning.reference import rowwise_mask, tile_greedy_mask, tile_optimal_mask

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cusparselt_layout_sm90_v800.pt"

# compressed sizes the library reported (cusparseLtSpMMACompressedSize2, both orientations alike)
LIBRARY_SIZES = {
    (16, 16): 512,
    (16, 32): 768,
    (32, 16): 768,
    (32, 32): 1280,
    (48, 48): 2816,
    (64, 64): 4608,
    (80, 96): 9216,
    (128, 128): 18432,
    (144, 160): 26880,
    (256, 256): 73728,
    (32, 64): 2560,
    (64, 32): 2560,
    (192, 320): 69120,
    (4096, 1024): 4718592,
    (1024, 4096): 4718592,
}


def _fixture_items():
    data = torch.load(FIXTURE, weights_only=False)
    assert data["info"]["arch"] == "sm90" and data["info"]["cusparselt_version"] == 800
    return data["items"]


def _logical(item):
    dtype = getattr(torch, item["dtype"])
    m, k = item["m"], item["k"]
    mem = item["dense_memory"].view(dtype)
    return mem.reshape(m, k) if item["orient"] == "row" else mem.reshape(k, m).t()


@pytest.mark.parametrize("shape", sorted(LIBRARY_SIZES))
def test_size_formula(shape):
    assert L.compressed_size(*shape) == LIBRARY_SIZES[shape]


def test_shape_check():
    for bad in [(8, 16), (16, 8), (24, 40), (17, 16), (16, 20)]:
        with pytest.raises(ValueError, match="multiples of 16"):
            L.compressed_size(*bad)


@pytest.mark.parametrize("idx", range(10))
def test_reference_reproduces_library_bytes(idx):
    items = _fixture_items()
    item = items[idx]
    a = _logical(item)
    m, k = item["m"], item["k"]
    out = L.pack_reference(a, item["orient"])
    valid = L.valid_byte_mask(m, k)
    assert out.numel() == item["bytes"].numel()
    assert torch.equal(out[valid], item["bytes"][valid]), item["what"]
    # and the inverse gives the pruned matrix back
    back = L.unpack_reference(item["bytes"], m, k, item["orient"], a.dtype)
    assert torch.equal(back, torch.where(a != 0, a, torch.zeros((), dtype=a.dtype)))


def test_nibble_index_is_a_bijection():
    for m, k in [(64, 64), (128, 96), (48, 80), (4096, 1024)]:
        q = L.nibble_index(m, k).reshape(-1)
        assert q.unique().numel() == q.numel()
        assert int(q.max()) < 2 * L.used_meta_bytes(m, k) <= 2 * L.meta_bytes(m, k)


def test_pair_rule():
    # fewer than two nonzeros: fill with the highest unused indices; -0.0 is a zero
    a = torch.tensor([[1.0, 0, 0, 0, 0, 2.0, 0, 0, 0, 0, 0, 3.0, 0, 0, 0, 0, -0.0, 4.0, 0, 5.0]])
    i0, i1 = L.select_pairs(a)
    assert i0.tolist() == [[0, 1, 2, 2, 1]] and i1.tolist() == [[3, 3, 3, 3, 3]]


# --------------------------------------------------------------------------------------------------
# Triton kernel (interpreter on CPU, real GPU otherwise)


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _weights(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    w[::7, ::3] = 0.25  # ties
    w[1, :] = 0.0  # zero rows (pads everywhere)
    w[2, 4:8] = -0.0
    return w.to(dtype).to(_device())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(64, 64), (48, 80), (128, 64), (32, 96)])
def test_kernel_equals_reference_tile_greedy(dtype, shape):
    from sparsity.kernels.pack_cusparselt import prune_pack, tile_bits_to_mask

    w = _weights(shape, dtype, seed=sum(shape))
    pk = prune_pack(w)
    mask = tile_greedy_mask(w.cpu())
    wp = torch.where(mask, w.cpu(), torch.zeros((), dtype=dtype))
    R, C = shape
    vf, vd = L.valid_byte_mask(R, C), L.valid_byte_mask(C, R)
    assert torch.equal(pk.fwd.cpu()[vf], L.pack_weight_reference(wp, "fwd")[vf])
    assert torch.equal(pk.dgrad.cpu()[vd], L.pack_weight_reference(wp, "dgrad")[vd])
    assert torch.equal(tile_bits_to_mask(pk.tile_bits).cpu(), mask)


@pytest.mark.parametrize("shape", [(64, 64), (48, 80)])
def test_dense_output_mode_equals_reference_tile_greedy(shape):
    """prune_dense (auto's dense path): the same kernel writing the pruned W itself instead of the
    packed bytes."""
    from sparsity.kernels.pack_cusparselt import prune_dense, tile_bits_to_mask

    w = _weights(shape, torch.bfloat16, seed=7 + sum(shape))
    wp, bits = prune_dense(w)
    mask = tile_greedy_mask(w.cpu())
    assert torch.equal(
        wp.cpu().view(torch.int16),
        torch.where(mask, w.cpu(), torch.zeros((), dtype=w.dtype)).view(torch.int16),
    )
    assert torch.equal(tile_bits_to_mask(bits).cpu(), mask)


@pytest.mark.parametrize("method", ["rowwise", "tile_optimal"])
def test_kernel_given_mask(method):
    from sparsity.kernels.pack_cusparselt import prune_pack

    dtype = torch.bfloat16
    w = _weights((64, 96), dtype, seed=3)
    mask = (rowwise_mask if method == "rowwise" else tile_optimal_mask)(w.cpu())
    transposable = method == "tile_optimal"
    pk = prune_pack(w, mask.to(w.device), write_t=transposable)
    wp = torch.where(mask, w.cpu(), torch.zeros((), dtype=dtype))
    vf = L.valid_byte_mask(64, 96)
    assert torch.equal(pk.fwd.cpu()[vf], L.pack_weight_reference(wp, "fwd")[vf])
    if transposable:
        vd = L.valid_byte_mask(96, 64)
        assert torch.equal(pk.dgrad.cpu()[vd], L.pack_weight_reference(wp, "dgrad")[vd])
    else:
        assert pk.dgrad is None


def test_kernel_reproduces_library_bytes():
    """Kernel in given-mask mode on the library's own inputs (row items: A = W; col items: A =
    W^T)."""
    from sparsity.kernels.pack_cusparselt import prune_pack

    for item in _fixture_items():
        a = _logical(item)
        w = (
            a if item["orient"] == "row" else a.t()
        )  # the (out, in) weight whose memory the library read
        w = w.contiguous().to(_device())
        # the mask that produced the dense input: every entry whose bits are not +0.0 (kept -0.0
        # included)
        pk = prune_pack(w, w.view(torch.int16) != 0, write_t=True)
        got = pk.fwd if item["orient"] == "row" else pk.dgrad
        valid = L.valid_byte_mask(item["m"], item["k"])
        assert torch.equal(got.cpu()[valid], item["bytes"][valid]), (
            item["dtype"],
            item["orient"],
            item["what"],
        )


def test_kernel_rejects_bad_shapes():
    from sparsity.kernels.pack_cusparselt import prune_pack

    with pytest.raises(ValueError, match="multiples of 16"):
        prune_pack(torch.zeros(40, 64, dtype=torch.bfloat16, device=_device()))
    with pytest.raises(TypeError):
        prune_pack(torch.zeros(64, 64, dtype=torch.float32, device=_device()))


@pytest.mark.parametrize("write_t", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(48, 80), (32, 96)])
def test_group_kernel_packs_each_weight_as_the_reference(dtype, shape, write_t):
    """prune_pack_group: one launch over three weights of one shape writes, for each, the reference
    packer's bytes of its tile_greedy pruning (every byte the layout uses) and its tile masks; W^T
    only when asked. Outputs passed back in are rewritten in place."""
    from sparsity.kernels.pack_cusparselt import tile_bits_to_mask
    from sparsity.kernels.pack_cusparselt_group import prune_pack_group

    weights = [_weights(shape, dtype, seed=sum(shape) + i) for i in range(3)]
    weights[1] = -weights[1]  # different weights in every slot
    outs = prune_pack_group(weights, write_t=write_t)
    R, C = shape
    vf, vd = L.valid_byte_mask(R, C), L.valid_byte_mask(C, R)

    def check(outs, weights):
        for pk, w in zip(outs, weights):
            mask = tile_greedy_mask(w.cpu())
            wp = torch.where(mask, w.cpu(), torch.zeros((), dtype=dtype))
            assert torch.equal(pk.fwd.cpu()[vf], L.pack_weight_reference(wp, "fwd")[vf])
            if write_t:
                assert torch.equal(pk.dgrad.cpu()[vd], L.pack_weight_reference(wp, "dgrad")[vd])
            else:
                assert pk.dgrad is None
            assert torch.equal(tile_bits_to_mask(pk.tile_bits).cpu(), mask)

    check(outs, weights)
    again = prune_pack_group(weights[::-1], write_t=write_t, out=outs)
    assert all(a.fwd is o.fwd for a, o in zip(again, outs))
    check(outs, weights[::-1])


def test_group_kernel_refuses_what_one_launch_cannot_pack():
    from sparsity.kernels.pack_cusparselt_group import prune_pack_group

    dev = _device()
    w = torch.zeros(64, 64, dtype=torch.bfloat16, device=dev)
    with pytest.raises(ValueError, match="at least one"):
        prune_pack_group([])
    with pytest.raises(ValueError, match="one launch packs one shape"):
        prune_pack_group([w, torch.zeros(64, 32, dtype=torch.bfloat16, device=dev)])
    with pytest.raises(ValueError, match="one launch packs one shape"):
        prune_pack_group([w, w.half()])
    with pytest.raises(ValueError, match="contiguous"):
        prune_pack_group([w, torch.zeros(64, 128, dtype=torch.bfloat16, device=dev)[:, ::2]])
    with pytest.raises(ValueError, match="2 outputs for 1 weights"):
        prune_pack_group([w], out=prune_pack_group([w, w]))
    with pytest.raises(TypeError):
        prune_pack_group([w.float()])
