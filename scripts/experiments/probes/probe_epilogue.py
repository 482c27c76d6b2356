"""Probe (GPU): which activation epilogues does this cuSPARSELt accept on a 2:4 GEMM of the ViT-L
MLP's fc1 shape? A GELU epilogue would let the EMA teacher's 2:4 fc1 write GELU(x W^T + b) directly
and drop its separate GELU pass (3.6 ms of a ViT-L step on one H200, results/bench/NOTES.md, "The
step's ledger on one H200").

    python -m scripts.experiments.probes.probe_epilogue     # from the repository root

Per dtype (bf16, fp16) and compute type, each `cusparseLtMatmulDescAttribute_t` activation is set on
a fresh matmul descriptor (GELU and ReLU on, GELU's scaling 1.0) and reported as accepted or refused
with the library's status. One H200, cuSPARSELt 0.8.0, 2026-11-30
(`results/bench/ledger_h200/gelu_epilogue_h200.log`): ReLU accepted; GELU and GELU's scaling refused
with status 3 (INVALID_VALUE) for both dtypes under every compute type the descriptor takes (32F;
16F for fp16), GELU in both output orders too (an inline run of the same calls).
"""

import numpy as np
import torch

from sparsity.backends.cusparselt.compressor import OperandLayout, structured_descriptor
from sparsity.backends.cusparselt.library import (
    ALIGN,
    CUDA_DTYPE,
    OP_N,
    OP_T,
    ORDER_COL,
    ORDER_ROW,
    handle,
    lib,
    ptr,
)

OUT, IN, TOKENS = 4096, 1024, 4096  # fc1 of ViT-L (tokens do not change what a descriptor accepts)
ACTIVATIONS = (
    ("ACTIVATION_RELU", np.ones(1, np.int32)),
    ("ACTIVATION_GELU", np.ones(1, np.int32)),
    ("ACTIVATION_GELU_SCALING", np.ones(1, np.float32)),
)


def _descriptor(c, h, dtype, compute):
    lay = OperandLayout.for_weight(OUT, IN, "fwd")
    a = structured_descriptor(h, lay, dtype)
    b = c.dense_descriptor_init(h, TOKENS, IN, IN, ALIGN, CUDA_DTYPE[dtype], ORDER_ROW)
    d = c.dense_descriptor_init(h, OUT, TOKENS, OUT, ALIGN, CUDA_DTYPE[dtype], ORDER_COL)
    return c.matmul_descriptor_init(h, OP_N, OP_T, a, b, d, d, getattr(c.ComputeType, compute))


def main():
    c, h = lib(), handle(0)
    print(f"{torch.cuda.get_device_name()}, cuSPARSELt {c.get_version(h)}")
    for dtype in (torch.bfloat16, torch.float16):
        for compute in (name for name in dir(c.ComputeType) if name.startswith("COMPUTE_")):
            try:
                desc = _descriptor(c, h, dtype, compute)
            except c.cuSPARSELtError as e:
                print(f"{dtype} {compute}: no descriptor ({e})")
                continue
            for attr, value in ACTIVATIONS:
                try:
                    c.matmul_desc_set_attribute(
                        h, desc, getattr(c.MatmulDescAttribute, attr), ptr(value), 4
                    )
                    print(f"{dtype} {compute} {attr}: accepted")
                except c.cuSPARSELtError as e:
                    print(f"{dtype} {compute} {attr}: refused ({e})")
            c.matmul_descriptor_destroy(desc)


if __name__ == "__main__":
    main()
