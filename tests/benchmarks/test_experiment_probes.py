"""The GPU probes' host-side pieces against hand-computed cases: the FP8 2:4 probe's quantisation,
pruning and totals, the Philox probe's kernel copy against the kernel it copies (CPU: Triton's
interpreter), the CUTLASS comparison's reading of its binaries, and the pack-grouping probe's bytes,
ratios and stacked work."""

import stat

import pytest
import torch

from scripts.experiments.probes.probe_fp8 import mlp_totals, prune_24, quantize_e4m3, ratios


def test_prune_24_keeps_the_two_largest_magnitudes_of_each_group():
    w = torch.tensor([[1.0, -3.0, 2.0, 0.5, 0.0, 0.125, -0.25, 7.0]])
    assert prune_24(w).tolist() == [[0.0, -3.0, 2.0, 0.0, 0.0, 0.0, -0.25, 7.0]]


def test_quantize_maps_the_largest_magnitude_to_448_and_round_trips_representable_values():
    q, scale = quantize_e4m3(torch.tensor([-896.0, 1.0, 0.5]))
    assert scale.item() == 2.0  # 896 / 448
    assert q.dtype == torch.float8_e4m3fn
    assert (q.float() * scale).tolist() == [-896.0, 1.0, 0.5]


def test_mlp_totals_double_the_two_shapes_and_ratios_are_baseline_over_row():
    per_shape = {
        "fc1": {"bf16_dense": 1.0, "bf16_24": 0.8, "fp8_dense": 0.6, "fp8_24": 0.5},
        "fc2": {"bf16_dense": 1.0, "bf16_24": 0.7, "fp8_dense": 0.5, "fp8_24": None},
    }
    ms = mlp_totals(per_shape)
    assert ms["bf16_dense"] == 4.0 and ms["bf16_24"] == 3.0 and ms["fp8_dense"] == 2.2
    assert ms["fp8_24"] is None  # one shape refused: no MLP total
    r = ratios(ms)
    assert r["bf16_24_vs_bf16_dense"] == pytest.approx(1.333)
    assert r["fp8_dense_vs_bf16_dense"] == pytest.approx(1.818)
    assert r["fp8_24_vs_fp8_dense"] is None


def test_philox_probe_copies_the_built_kernel_and_its_variants_differ():
    from scripts.experiments.probes.probe_mvue_philox import pack
    from sparsity.kernels.mvue import mvue_pack_t

    dy = torch.randn(128, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    built = mvue_pack_t(dy, 1234)
    assert torch.equal(pack(dy, 1234, 10), built)
    assert not torch.equal(pack(dy, 1234, 7), built)  # another generator: other draws
    assert not torch.equal(pack(dy, 1234, 0), built)


def test_cutlass_compare_reads_a_binarys_last_json_line_and_reports_one_that_fails(tmp_path):
    from scripts.experiments.cutlass_sm90.compare import ratio, run_binary

    good = tmp_path / "sgemm_ok"
    good.write_text(
        "#!/bin/sh\necho note\n"
        'printf \'{"sparse_ms": 0.25, "args": "%s %s %s"}\\n\' "$1" "$2" "$3"\n'
    )
    bad = tmp_path / "sgemm_bad"
    bad.write_text("#!/bin/sh\necho refused >&2\nexit 3\n")
    for f in (good, bad):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    assert run_binary(good, 4096, 8, 1024) == {"sparse_ms": 0.25, "args": "--m=4096 --n=8 --k=1024"}
    failed = run_binary(bad, 4096, 8, 1024)
    assert failed["returncode"] == 3 and "refused" in failed["error"]
    assert ratio(0.5, 0.25) == 2.0 and ratio(0.5, None) is None and ratio(None, 0.25) is None


def test_pack_grouping_counts_a_vit_l_weights_bytes_and_its_ratios():
    """One prune + pack of fc1's 4096 x 1024 bf16 weight moves 18.35 MB with W^T (W read 8,388,608
    bytes; each packed operand 4,194,304 of values and 524,288 of metadata; the tile masks 524,288),
    13.63 MB without."""
    from scripts.experiments.probes.probe_pack_grouping import ratios, traffic_bytes

    assert traffic_bytes(4096, 1024, write_t=True) == 18_350_080
    assert traffic_bytes(4096, 1024, write_t=False) == 13_631_488
    assert traffic_bytes(1024, 4096, write_t=True) == 18_350_080
    us = {"separate": 600.0, "grouped": 240.0, "stacked": 200.0}
    r = ratios({**us, "copy_separate": 400.0, "copy_stacked": 160.0})
    assert r == {
        "grouped_speedup": 2.5,
        "stacked_speedup": 3.0,
        "grouped_vs_copy": 1.5,
        "separate_vs_copy": 1.5,
        "stacked_vs_copy": 1.25,
    }


@pytest.mark.parametrize("write_t", [True, False])
def test_pack_grouping_stacked_and_grouped_launches_do_the_separate_launches_work(write_t):
    """The stacked launch prunes every tile as the separate launches do, and the grouped launch
    writes their bytes (CPU: Triton's interpreter)."""
    from scripts.experiments.probes.probe_pack_grouping import (
        grouped_equals_separate,
        stacked_tile_bits_match,
    )

    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(32, 64, generator=gen).to(torch.bfloat16) for _ in range(3)]
    assert stacked_tile_bits_match(weights, write_t)
    assert grouped_equals_separate(weights, write_t)


def test_attention_probe_takes_the_steps_shapes_and_the_models_layout():
    """The ViT-L step's attention calls: 89 of 128 global crops and 358 of 512 local ones kept at
    drop-path 0.3 (the student, forward and backward), the teacher's 128 global crops; q, k, v the
    model's views of its qkv output; per-step sums refuse to mix in a backend that refused a case."""
    from scripts.experiments.probes.probe_attention import (
        HEAD_DIM,
        HEADS,
        per_step,
        qkv_views,
        step_cases,
    )

    cases = step_cases()
    assert [(c["seqs"], c["tokens"], c["grad"]) for c in cases] == [
        (89, 197, True),
        (358, 37, True),
        (128, 197, False),
    ]
    qkv = torch.randn(2, 5, 3 * HEADS * HEAD_DIM)
    q, k, v = qkv_views(qkv)
    assert q.shape == (2, HEADS, 5, HEAD_DIM)
    h = 3  # head 3 of token 4 of sequence 1: its slice of the qkv row
    assert torch.equal(k[1, h, 4], qkv[1, 4, HEADS * HEAD_DIM + h * HEAD_DIM :][:HEAD_DIM])
    assert torch.equal(v[0, h, 2], qkv[0, 2, 2 * HEADS * HEAD_DIM + h * HEAD_DIM :][:HEAD_DIM])
    totals = per_step([{"default": 0.1, "A": 0.05}, {"default": 0.2}], blocks=2)
    assert totals == {"A": None, "default": 0.6, "fastest_each": 0.5}


def test_block_rows_probe_pads_by_f_pad_and_slice_values_and_gradients():
    from scripts.experiments.probes.probe_block_rows import pad_by_f_pad, unpad_by_slice

    x = torch.arange(6.0).reshape(3, 2).requires_grad_()
    padded = pad_by_f_pad(x, 2)
    assert padded.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [0.0, 0.0], [0.0, 0.0]]
    y = (padded.detach() * 10).requires_grad_()
    kept = unpad_by_slice(y, 3)
    assert kept.tolist() == [[0.0, 10.0], [20.0, 30.0], [40.0, 50.0]]
    kept.sum().backward()
    assert y.grad.tolist() == [[1.0, 1.0]] * 3 + [[0.0, 0.0]] * 2  # no gradient into the pad rows


def test_block_rows_probe_groupings_compute_the_one_matrix_block_and_padding_is_restored():
    from models.vit_block import Block
    from scripts.experiments.probes import probe_block_rows as P
    from sparsity import traced

    def block():
        torch.manual_seed(0)
        return Block(16, 2, init_values=0.5).double()

    xs = [torch.randn(3, 5, 16, dtype=torch.float64), torch.randn(4, 2, 16, dtype=torch.float64)]
    want = block()(xs)
    rows = []
    for grouping in P.GROUPINGS:
        b = block()
        b.mlp.fc1.register_forward_hook(lambda m, a, out: rows.append(a[0].shape[0]))
        P.set_grouping(b, grouping)
        for got, w in zip(b(xs), want):
            torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-12)
    assert rows == [23, 23, 15, 8, 15, 8]  # the MLP on 3x5 + 4x2 rows together, or apart
    with pytest.raises(ValueError, match="unknown grouping 'per token'"):
        P.set_grouping(Block(16, 2), "per token")
    own = traced._pad_rows, traced._unpad_rows
    with pytest.raises(RuntimeError), P.padding(P.PADDINGS["F.pad + slice"]):
        assert traced._pad_rows is P.pad_by_f_pad
        raise RuntimeError
    assert (traced._pad_rows, traced._unpad_rows) == own
