"""Probe (GPU): does cuSPARSELt accept bf16 A/B with an fp32 C/D, i.e. could the input-gradient GEMM
write dx in fp32 and save the cast of fc1's dx (0.067 ms at 32k tokens, results/bench/NOTES.md,
"Fused weight gradient, host path, complete re-run (runs 10-14, 2026-11-23)")?

    python -m scripts.experiments.probes.probe_cslt_fp32_out     # from the repository root

H100, cuSPARSELt 0.8.0 (run 12): "D=fp32: refused: cuSPARSELtError (10)" (NOT_SUPPORTED), bf16 D
fine.
"""

import numpy as np
import torch

from scripts.benchmarks.timing import wall_ms
from sparsity.backends import get_backend
from sparsity.backends.cusparselt.compressor import OperandLayout, structured_descriptor
from sparsity.backends.cusparselt.library import OP_N, OP_T, ORDER_COL, ORDER_ROW, handle, lib


def main():
    c = lib()
    h = handle(0)
    out_f, in_f, n = 4096, 1024, 32768
    dt = torch.bfloat16
    w = torch.randn(out_f, in_f, device="cuda", dtype=dt)
    sw = get_backend("cusparselt").sparsify(w, "tile_greedy")
    wp = sw.to_dense()
    dy = torch.randn(n, out_f, device="cuda", dtype=dt)
    lay = OperandLayout.for_weight(out_f, in_f, "dgrad")
    m, k = lay.rows, lay.cols
    for d_type, name in ((0, "fp32"), (14, "bf16")):
        try:
            a = structured_descriptor(h, lay, dt)
            b = c.dense_descriptor_init(h, n, k, k, 16, 14, ORDER_ROW)
            d = c.dense_descriptor_init(h, m, n, m, 16, d_type, ORDER_COL)
            md = c.matmul_descriptor_init(h, OP_N, OP_T, a, b, d, d, c.ComputeType.COMPUTE_32F)
            sel = c.matmul_alg_selection_init(h, md, c.MatmulAlg.DEFAULT)
            plan = c.matmul_plan_init(h, md, sel)
            ws = torch.empty(
                max(int(c.matmul_get_workspace(h, plan)), 16), dtype=torch.uint8, device="cuda"
            )
            out = torch.empty(n, m, device="cuda", dtype=torch.float32 if d_type == 0 else dt)
            al, be = np.ones(1, np.float32), np.zeros(1, np.float32)
            st = np.array([torch.cuda.current_stream().cuda_stream], np.uint64)

            def run():
                c.matmul(
                    h,
                    plan,
                    al.ctypes.data,
                    sw.packed_t.data_ptr(),
                    dy.data_ptr(),
                    be.ctypes.data,
                    out.data_ptr(),
                    out.data_ptr(),
                    ws.data_ptr(),
                    st.ctypes.data,
                    1,
                )

            run()
            torch.cuda.synchronize()
            ref = dy.float() @ wp.float()
            err = float((out.float() - ref).norm() / ref.norm())
            ms = wall_ms(run, 3, 20)
            print(f"D={name}: OK rel err {err:.2e}, {ms:.4f} ms (default alg)")
        except Exception as e:  # noqa: BLE001 -- report whatever the library says
            print(f"D={name}: refused: {e!r}")


if __name__ == "__main__":
    main()
