"""CPU tests of the benchmarks' kernel-time summary (scripts/benchmarks/profiling.py)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: scripts.benchmarks

from scripts.benchmarks.profiling import categorize, kernel_summary  # noqa: E402


def _event(name, start, end, device="DeviceType.CUDA"):
    return SimpleNamespace(name=name, device_type=device,
                           time_range=SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start))


class _FakeProf:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


@pytest.mark.parametrize("name, cat", [
    ("sm90_xmma_sparse_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "sparse_gemm"),
    ("_prune_pack_kernel", "prune_pack"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "dense_gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda", "cast_copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "fill"),
    ("void at::native::GeluCUDAKernelImpl", "other"),
])
def test_categorize(name, cat):
    assert categorize(name) == cat


def test_kernel_summary_busy_idle_and_categories():
    prof = _FakeProf([
        _event("nvjet_gemm", 0.0, 100.0),
        _event("sm90_xmma_sparse_gemm", 50.0, 150.0),  # overlaps the first: busy is the union
        _event("_prune_pack_kernel", 400.0, 420.0),  # 250 us idle before it
        _event("cpu_op", 0.0, 5000.0, device="DeviceType.CPU"),  # host events are ignored
    ])
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
