// One CUTLASS 3 (sm90a) 2:4 sparse GEMM at the orientation of the project's 2:4 linear layers, timed
// against CUTLASS's dense GEMM of the same pruned operand: D (m x n, column-major) = A (m x k, row-major,
// 2:4 along k) . B (k x n, column-major), bf16 in and out, fp32 accumulation. With m = out features,
// k = in features and n = tokens, A is the weight W, B is x (tokens x in) row-major and D is
// y (tokens x out) row-major: the "fwd" GEMM of sparsity/backends/cusparselt/compressor.py.
//
// Tile and cluster shapes are compile-time (TILE_M/N/K, CLUSTER_M/N; build.sh builds a few). Prints
// one JSON line: the shape, the build's tile, ms of the sparse GEMM, the dense GEMM and CUTLASS's
// compressor (the prune is random 2:4 on the host, outside the timing), and the relative Frobenius
// error of the sparse result against the dense one.
//
//   sparse_gemm_bench --m=4096 --n=44160 --k=1024 [--iterations=50] [--warmup=20]

#include <cstdio>
#include <vector>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/transform/device/transform_universal_adapter.hpp"
#include "cutlass/transform/kernel/sparse_gemm_compressor.hpp"
#include "cutlass/util/command_line.h"
#include "cutlass/util/device_memory.h"
#include "cutlass/util/packed_stride.hpp"

#ifndef TILE_M
#define TILE_M 128
#endif
#ifndef TILE_N
#define TILE_N 128
#endif
#ifndef TILE_K
#define TILE_K 128
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1
#endif
#ifndef CLUSTER_N
#define CLUSTER_N 2
#endif

using namespace cute;

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("{\"error\": \"%s at line %d\"}\n", cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define CHECK_CUTLASS(x)                                                               \
  do {                                                                                 \
    cutlass::Status s_ = (x);                                                          \
    if (s_ != cutlass::Status::kSuccess) {                                             \
      std::printf("{\"error\": \"%s at line %d\"}\n", cutlassGetStatusString(s_), __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

using Bf16 = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::ColumnMajor;
constexpr int kAlign = 8;  // 16 bytes of bf16
using SparseTileShape = Shape<Int<TILE_M>, Int<TILE_N>, Int<TILE_K>>;
using DenseTileShape = Shape<Int<TILE_M>, Int<TILE_N>, Int<TILE_K / 2>>;  // the same output tile, dense k
using ClusterShapeMNK = Shape<Int<CLUSTER_M>, Int<CLUSTER_N>, _1>;
using Problem = Shape<int, int, int, int>;

template <class OpClass, class TileShape>
struct Build {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, OpClass, TileShape, ClusterShapeMNK,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Bf16, LayoutD, kAlign, Bf16,
      LayoutD, kAlign, cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, OpClass, Bf16, LayoutA, kAlign, Bf16, LayoutB, kAlign, float, TileShape,
      ClusterShapeMNK,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

using Sparse = Build<cutlass::arch::OpClassSparseTensorOp, SparseTileShape>;
using Dense = Build<cutlass::arch::OpClassTensorOp, DenseTileShape>;
using SparseConfig = typename Sparse::Gemm::GemmKernel::CollectiveMainloop::SparseConfig;
using ElementE = typename Sparse::Gemm::GemmKernel::CollectiveMainloop::ElementE;
using StrideA = cutlass::gemm::TagToStrideA_t<LayoutA>;
using CompressorUtility =
    cutlass::transform::kernel::StructuredSparseCompressorUtility<Problem, Bf16, LayoutA, SparseConfig>;
using Compressor = cutlass::transform::device::TransformUniversalAdapter<
    cutlass::transform::kernel::StructuredSparseCompressor<Problem, Bf16, LayoutA, SparseConfig,
                                                           cutlass::arch::Sm90>>;

// x[i] uniform in [-1, 1] in steps of 1/1024 (a 32-bit integer hash of i and the seed): exact in bf16
__global__ void fill_uniform(Bf16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ (uint32_t(i >> 32) + seed) * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = Bf16(float(int(h % 2049u) - 1024) / 1024.f);
  }
}

// sum |a - b|^2 and |b|^2 over n elements, in double (one atomic pair per block)
__global__ void squared_error(Bf16 const* a, Bf16 const* b, size_t n, double* sums) {
  double diff = 0, ref = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    double x = float(a[i]), y = float(b[i]);
    diff += (x - y) * (x - y);
    ref += y * y;
  }
  __shared__ double s_diff[256], s_ref[256];
  s_diff[threadIdx.x] = diff;
  s_ref[threadIdx.x] = ref;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      s_diff[threadIdx.x] += s_diff[threadIdx.x + w];
      s_ref[threadIdx.x] += s_ref[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&sums[0], s_diff[0]);
    atomicAdd(&sums[1], s_ref[0]);
  }
}

// median-free mean ms of `iterations` calls after `warmup`, CUDA events around the whole loop
template <class Fn>
float mean_ms(Fn fn, int warmup, int iterations) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iterations; ++i) fn();
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  return ms / iterations;
}

template <class Gemm>
struct Prepared {
  Gemm gemm;
  cutlass::device_memory::allocation<uint8_t> workspace;
  explicit Prepared(typename Gemm::Arguments const& args)
      : workspace(Gemm::get_workspace_size(args)) {
    CHECK_CUTLASS(gemm.can_implement(args));
    CHECK_CUTLASS(gemm.initialize(args, workspace.get()));
  }
  void run() { CHECK_CUTLASS(gemm.run()); }
};

int main(int argc, char const** argv) {
  cutlass::CommandLine cmd(argc, argv);
  int m = 4096, n = 44160, k = 1024, iterations = 50, warmup = 20;
  cmd.get_cmd_line_argument("m", m);
  cmd.get_cmd_line_argument("n", n);
  cmd.get_cmd_line_argument("k", k);
  cmd.get_cmd_line_argument("iterations", iterations);
  cmd.get_cmd_line_argument("warmup", warmup);

  Problem problem = make_tuple(m, n, k, 1);
  auto stride_a = cutlass::make_cute_packed_stride(StrideA{}, make_shape(m, k, 1));
  auto stride_b = cutlass::make_cute_packed_stride(typename Sparse::Gemm::GemmKernel::StrideB{},
                                                   make_shape(n, k, 1));
  auto stride_d = cutlass::make_cute_packed_stride(typename Sparse::Gemm::GemmKernel::StrideD{},
                                                   make_shape(m, n, 1));

  cutlass::DeviceAllocation<Bf16> a(size_t(m) * k), b(size_t(n) * k), d(size_t(m) * n),
      d_dense(size_t(m) * n);
  fill_uniform<<<1024, 256>>>(a.get(), a.size(), 2024);
  fill_uniform<<<1024, 256>>>(b.get(), b.size(), 2025);

  // random 2:4 zeros on the host (CUTLASS's own utility), then its compressor on the GPU
  CompressorUtility util(problem, stride_a);
  {
    std::vector<Bf16> host(a.size());
    cutlass::device_memory::copy_to_host(host.data(), a.get(), a.size());
    util.structure_sparse_zero_mask_fill(host.data(), 7);
    cutlass::device_memory::copy_to_device(a.get(), host.data(), a.size());
  }
  cutlass::DeviceAllocation<Bf16> a_comp(size_t(util.get_tensorA_m_physical()) *
                                         util.get_tensorA_k_physical());
  cutlass::DeviceAllocation<ElementE> meta(size_t(util.get_metadata_m_physical()) *
                                           util.get_metadata_k_physical());
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
  typename Compressor::Arguments comp_args{problem, {a.get(), stride_a, a_comp.get(), meta.get()},
                                           {hw}};
  Compressor compressor;
  cutlass::device_memory::allocation<uint8_t> comp_ws(Compressor::get_workspace_size(comp_args));
  CHECK_CUTLASS(compressor.can_implement(comp_args));
  CHECK_CUTLASS(compressor.initialize(comp_args, comp_ws.get()));
  float compress_ms = mean_ms([&] { CHECK_CUTLASS(compressor.run()); }, 3, 10);

  typename Sparse::Gemm::Arguments sparse_args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      problem,
      {a_comp.get(), SparseConfig::fill_layoutA(problem), b.get(), stride_b, meta.get(),
       SparseConfig::fill_layoutE(problem)},
      {{1.f, 0.f}, d.get(), stride_d, d.get(), stride_d}};
  typename Dense::Gemm::Arguments dense_args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      problem,
      {a.get(), stride_a, b.get(), stride_b},
      {{1.f, 0.f}, d_dense.get(), stride_d, d_dense.get(), stride_d}};
  Prepared<typename Sparse::Gemm> sparse(sparse_args);
  Prepared<typename Dense::Gemm> dense(dense_args);

  sparse.run();
  dense.run();
  CHECK_CUDA(cudaDeviceSynchronize());
  cutlass::DeviceAllocation<double> sums(2);
  CHECK_CUDA(cudaMemset(sums.get(), 0, 2 * sizeof(double)));
  squared_error<<<1024, 256>>>(d.get(), d_dense.get(), d.size(), sums.get());
  double host_sums[2];
  CHECK_CUDA(cudaMemcpy(host_sums, sums.get(), sizeof(host_sums), cudaMemcpyDeviceToHost));
  double rel_err = host_sums[1] > 0 ? std::sqrt(host_sums[0] / host_sums[1]) : -1.0;

  float sparse_ms = mean_ms([&] { sparse.run(); }, warmup, iterations);
  float dense_ms = mean_ms([&] { dense.run(); }, warmup, iterations);
  std::printf(
      "{\"m\": %d, \"n\": %d, \"k\": %d, \"tile\": [%d, %d, %d], \"cluster\": [%d, %d], "
      "\"sparse_ms\": %.5f, \"dense_cutlass_ms\": %.5f, \"compress_ms\": %.5f, "
      "\"rel_err_vs_dense\": %.3g, \"iterations\": %d}\n",
      m, n, k, TILE_M, TILE_N, TILE_K, CLUSTER_M, CLUSTER_N, sparse_ms, dense_ms, compress_ms,
      rel_err, iterations);
  return 0;
}
