"""CPU tests of the benchmarks' kernel-time summary (scripts/benchmarks/profiling.py)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # the repository root: scripts.benchmarks

from scripts.benchmarks.profiling import (  # noqa: E402
    categorize,
    communication_overlap,
    idle_gaps,
    kernel_summary,
    runtime_calls,
)


def _event(name, start, end, device="DeviceType.CUDA"):
    return SimpleNamespace(
        name=name,
        device_type=device,
        time_range=SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start),
    )


class _FakeProf:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


@pytest.mark.parametrize(
    "name, cat",
    [
        ("sm90_xmma_sparse_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "sparse_gemm"),
        ("_prune_pack_kernel", "prune_pack"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "dense_gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda",
            "cast_copy",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            "fill",
        ),
        ("void at::native::GeluCUDAKernelImpl", "other"),
    ],
)
def test_categorize(name, cat):
    assert categorize(name) == cat


def test_kernel_summary_busy_idle_and_categories():
    prof = _FakeProf(
        [
            _event("nvjet_gemm", 0.0, 100.0),
            _event("sm90_xmma_sparse_gemm", 50.0, 150.0),  # overlaps the first: busy is the union
            _event("_prune_pack_kernel", 400.0, 420.0),  # 250 us idle before it
            _event("cpu_op", 0.0, 5000.0, device="DeviceType.CPU"),  # host events are ignored
        ]
    )
    s = kernel_summary(prof, steps=2)
    assert s["kernels_per_step"] == 1.5
    assert s["span_ms"] == pytest.approx(0.42 / 2)
    assert s["busy_ms"] == pytest.approx(0.17 / 2)
    assert s["idle_ms"] == pytest.approx(0.25 / 2)
    assert s["by_category_ms"] == {"dense_gemm": 0.05, "sparse_gemm": 0.05, "prune_pack": 0.01}
    assert s["top_kernels"][0]["calls"] == 0.5


def test_compiled_kernels_have_their_own_category():
    assert categorize("triton_poi_fused_add_native_layer_norm_3") == "fused"
    assert categorize("triton_red_fused__log_softmax_sum_1") == "fused"
    assert categorize("triton_tem_fused_mm_0") == "dense_gemm"  # inductor's GEMM templates
    assert categorize("_prune_pack_kernel") == "prune_pack"


def test_kernel_summary_without_kernels():
    assert kernel_summary(_FakeProf([]))["kernels"] == 0


def test_runtime_calls_per_step_by_host_time_with_the_blocking_ones_marked():
    prof = _FakeProf(
        [
            _event("cudaLaunchKernel", 0.0, 5.0, device="DeviceType.CPU"),
            _event("cudaLaunchKernel", 10.0, 15.0, device="DeviceType.CPU"),
            _event("cudaStreamSynchronize", 20.0, 420.0, device="DeviceType.CPU"),
            _event("cudaMalloc", 500.0, 600.0, device="DeviceType.CPU"),
            _event("cuLaunchKernel", 700.0, 702.0, device="DeviceType.CPU"),
            _event("aten::add", 0.0, 50.0, device="DeviceType.CPU"),  # an op, not an API call
            _event(
                "cudaStreamSynchronize", 0.0, 999.0
            ),  # a device event of that name: not a host call
        ]
    )
    calls = runtime_calls(prof, steps=2)
    # 400 us of synchronisation over 2 steps = 0.2 ms per step; cudaMalloc 0.05; launches 5 us each
    assert [c["name"] for c in calls] == [
        "cudaStreamSynchronize",
        "cudaMalloc",
        "cudaLaunchKernel",
        "cuLaunchKernel",
    ]
    assert calls[0] == {"name": "cudaStreamSynchronize", "calls": 0.5, "ms": 0.2, "blocking": True}
    assert calls[1]["blocking"] and not calls[2]["blocking"] and not calls[3]["blocking"]
    assert calls[2] == {"name": "cudaLaunchKernel", "calls": 1.0, "ms": 0.005, "blocking": False}


def test_idle_gaps_longest_first_with_what_the_host_did_meanwhile():
    prof = _FakeProf(
        [
            _event("gemm_a", 0.0, 100.0),
            _event("gemm_b", 50.0, 300.0),  # overlaps a: the GPU is busy until 300
            _event("prune_kernel", 450.0, 500.0),  # a 150 us gap after gemm_b
            _event("fused_c", 520.0, 600.0),  # 20 us: below min_us
            _event("fused_d", 1100.0, 1200.0),  # a 500 us gap after fused_c
            _event(
                "train_step", 0.0, 1300.0, device="DeviceType.CPU"
            ),  # covers everything: outermost
            _event(
                "aten::item", 610.0, 1090.0, device="DeviceType.CPU"
            ),  # the host waits on a value
            _event("cudaStreamSynchronize", 620.0, 1080.0, device="DeviceType.CPU"),
            _event("aten::empty", 310.0, 330.0, device="DeviceType.CPU"),
            _event("cudaMalloc", 312.0, 440.0, device="DeviceType.CPU"),
        ]
    )
    gaps = idle_gaps(prof, min_us=100.0)
    assert [g["gap_ms"] for g in gaps] == [0.5, 0.15]
    first, second = gaps
    assert (
        first["at_ms"] == 0.6
        and first["after_kernel"] == "fused_c"
        and first["before_kernel"] == "fused_d"
    )
    assert first["runtime_calls"] == ["cudaStreamSynchronize"]
    # aten::item covers 480 of the 500 us, train_step all of it: both more than half, the shorter
    # (inner) first
    assert first["host_events"] == ["aten::item", "train_step"]
    assert second["after_kernel"] == "gemm_b" and second["before_kernel"] == "prune_kernel"
    assert second["runtime_calls"] == ["cudaMalloc"]
    # train_step covers the 150 us gap, aten::empty 20 us of it (less than half): after it
    assert second["host_events"] == ["train_step", "aten::empty"]
    assert idle_gaps(_FakeProf([])) == []


@pytest.mark.gpu
def test_a_real_profile_shows_the_synchronisation_and_the_gap_the_host_made():
    """On a CUDA GPU: a sleep of the host between two matmuls is the longest gap, and `.item()`'s
    synchronisation is a blocking runtime call."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(2048, 2048, device="cuda")
    (a @ a).sum().item()  # warm-up: cuBLAS handles, allocations
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        b = a @ a
        b.sum().item()  # the host waits for the GPU
        time.sleep(0.02)  # then the GPU waits 20 ms for the host
        c = b @ a
        torch.cuda.synchronize()
    assert torch.isfinite(c).all()
    calls = runtime_calls(prof)
    assert any(c["blocking"] and "ynchronize" in c["name"] for c in calls), calls
    longest = idle_gaps(prof, top=1)[0]
    assert 19.0 < longest["gap_ms"] < 200.0, longest
    assert categorize(longest["before_kernel"]) == "dense_gemm", longest


def test_collectives_have_their_own_category():
    assert (
        categorize("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
        == "communication"
    )
    assert categorize("ncclKernel_AllReduce_RING_LL_Sum_float") == "communication"
    assert categorize("void at::native::reduce_kernel<512, 1>") == "reduce"


def test_communication_overlap_by_hand():
    """Compute runs 0-100 and 150-300 us; collectives run 80-120 (20 us beside compute, 20 alone),
    140-160 (10 alone, 10 beside), 280-330 (20 beside, 30 alone); two steps."""
    prof = _FakeProf(
        [
            _event("nvjet_gemm", 0.0, 100.0),
            _event("triton_poi_fused_add_0", 150.0, 300.0),
            _event("sm90_xmma_sparse_gemm", 200.0, 250.0),  # inside the compute union already
            _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 80.0, 120.0),
            _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 140.0, 160.0),
            _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 280.0, 330.0),
            _event("cpu_op", 0.0, 5000.0, device="DeviceType.CPU"),
        ]
    )
    c = communication_overlap(prof, steps=2)
    assert c["communication_ms"] == pytest.approx(0.110 / 2)
    assert c["overlapped_ms"] == pytest.approx(0.050 / 2)
    assert c["exposed_ms"] == pytest.approx(0.060 / 2)
    assert c["compute_busy_ms"] == pytest.approx(0.250 / 2)


def test_communication_overlap_without_collectives():
    c = communication_overlap(_FakeProf([_event("nvjet_gemm", 0.0, 100.0)]))
    assert c == {
        "communication_ms": 0.0,
        "overlapped_ms": 0.0,
        "exposed_ms": 0.0,
        "compute_busy_ms": 0.1,
    }


def test_a_rank_that_does_not_record_runs_the_same_steps(monkeypatch):
    """`profiled_steps(record=False)`: a data-parallel rank beside the recording one takes as many
    steps and settles their checks (else rank 0's collectives would wait for it), and returns no
    profiler."""
    from scripts.benchmarks import step_profiles

    calls = []
    trainer = SimpleNamespace(
        train_step=lambda batch, values: calls.append(("step", values)),
        settle_checks=lambda: calls.append(("settle", None)),
    )
    monkeypatch.setattr(
        step_profiles.torch.cuda, "synchronize", lambda: calls.append(("sync", None))
    )
    assert step_profiles.profiled_steps(trainer, {}, {"lr": 1.0}, 3, record=False) is None
    assert calls == [("sync", None), *[("step", {"lr": 1.0})] * 3, ("settle", None), ("sync", None)]
