"""Probe (GPU): how much of `mvue_pack_t` (the MVUE 2:4 operand of the weight gradient, written
straight in cuSPARSELt's layout) is its random-number generator? Nsight Compute found the kernel
issue-bound on the integer pipe; Philox-4x32 with Triton's default 10 rounds is the largest block of
integer instructions in it.

    python -m scripts.experiments.probes.probe_mvue_philox --out results/bench/ledger_h200/mvue_philox_h200.json

A copy of the kernel's launch with the generator's rounds as a parameter, timed at fc1's and fc2's
output-gradient shapes of the ViT-L step (tokens x 4096 and tokens x 1024): 10 rounds (the kernel as
built; its bytes are checked equal to `sparsity.kernels.mvue.mvue_pack_t`'s, so the copy is
faithful), 7 rounds, and 0 (constant uniforms: the kernel without a generator, its floor). Beside
them the floor of the bytes it moves (dy read once, the compressed operand written) at the copy
bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from sparsity.kernels import mvue as M
from sparsity.kernels.pack_cusparselt import _meta_addr
from sparsity.packing import layout as L
from sparsity.pruning.reference import MVUE_EPS

VARIANTS = (10, 7, 0)  # Philox rounds; 0: constant uniforms, no generator


@triton.jit
def _feature(dy_ptr, val_ptr, seed, h, o, ok, O, G, EPS: tl.constexpr, ROUNDS: tl.constexpr,
             EXACT: tl.constexpr):  # fmt: skip
    if ROUNDS == 0:
        base = (h + o).to(tl.float32) * 0.0  # a block of the draws' shape
        r0, r1, r2, r3 = base + 0.37, base + 0.61, base + 0.13, base + 0.89
    else:
        r0, r1, r2, r3 = tl.rand4x(seed, o * (G // 2) + h, ROUNDS)
    even = M._pack_t_group(dy_ptr, val_ptr, 2 * h, o, ok, O, r0, r1, EPS, EXACT)
    odd = M._pack_t_group(dy_ptr, val_ptr, 2 * h + 1, o, ok, O, r2, r3, EPS, EXACT)
    return even, odd


@triton.jit
def _kernel(dy_ptr, val_ptr, meta_ptr, seed, O, G, NKT, EPS: tl.constexpr, BLOCK_P: tl.constexpr,
            BLOCK_H: tl.constexpr, ROUNDS: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    # the body of sparsity.kernels.mvue._mvue_pack_t_kernel (host seed), the generator's rounds free
    h = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)[:, None]
    j = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[None, :]
    o = 16 * (j // 8) + j % 8
    ok = (2 * h < G) & (o < O)
    lo_even, lo_odd = _feature(dy_ptr, val_ptr, seed, h, o, ok, O, G, EPS, ROUNDS, EXACT)
    hi_even, hi_odd = _feature(dy_ptr, val_ptr, seed, h, o + 8, ok, O, G, EPS, ROUNDS, EXACT)
    tl.store(meta_ptr + _meta_addr(o, 2 * h, NKT), (lo_even | (hi_even << 4)).to(tl.uint8), mask=ok)
    tl.store(
        meta_ptr + _meta_addr(o, 2 * h + 1, NKT), (lo_odd | (hi_odd << 4)).to(tl.uint8), mask=ok
    )


def pack(dy: torch.Tensor, seed: int, rounds: int, exact: bool = True) -> torch.Tensor:
    """`mvue_pack_t(dy, seed, exact)` with `rounds` Philox rounds (dy: tokens % 64 == 0, out % 64 ==
    0)."""
    tokens, out = dy.shape
    buf = torch.empty(L.compressed_size(out, tokens), dtype=torch.uint8, device=dy.device)
    nv = L.values_bytes(out, tokens)
    groups = tokens // 4
    grid = (triton.cdiv(groups // 2, 8), triton.cdiv(out // 2, 32))
    _kernel[grid](dy, buf[:nv].view(dy.dtype), buf[nv:], seed, out, groups, -(-tokens // 32),
                  EPS=MVUE_EPS, BLOCK_P=8, BLOCK_H=32, ROUNDS=rounds, EXACT=exact, num_warps=4,
                  enable_fp_fusion=False)  # fmt: skip
    return buf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--tokens", type=int, nargs="*", default=[30784, 44160])
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (medians of each)")
    args = ap.parse_args()

    from scripts.bench_sparse import _copy_tbps  # noqa: PLC0415
    from scripts.benchmarks.timing import graph_ms_in_turns  # noqa: PLC0415

    copy_tbps = _copy_tbps()
    res = {"device": torch.cuda.get_device_name(), "copy_TBps": round(copy_tbps, 3), "shapes": []}
    for tokens in args.tokens:
        for out in (4096, 1024):
            dys = [torch.randn(tokens, out, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
            rec = {"tokens": tokens, "out": out}
            rec["faithful"] = bool(torch.equal(pack(dys[0], 1234, 10), M.mvue_pack_t(dys[0], 1234)))
            rec["faithful_inexact"] = bool(
                torch.equal(pack(dys[0], 1234, 10, False), M.mvue_pack_t(dys[0], 1234, exact=False))
            )
            rows = {
                "built": lambda i: M.mvue_pack_t(dys[i], 1234),
                **{str(r): (lambda i, r=r: pack(dys[i], 1234, r)) for r in VARIANTS},
                "inexact": lambda i: pack(dys[i], 1234, 10, False),
                "0_inexact": lambda i: pack(dys[i], 1234, 0, False),
            }
            ms = graph_ms_in_turns(rows, 2, args.rounds)
            rec["ms"] = {name: round(t, 4) for name, t in ms.items()}
            moved = dys[0].numel() * 2 + L.compressed_size(out, tokens)
            rec["floor_ms"] = round(moved / (copy_tbps * 1e12) * 1e3, 4)
            ms10, ms0 = rec["ms"]["10"], rec["ms"]["0"]
            rec["generator_share"] = round((ms10 - ms0) / ms10, 3)
            rec["seven_rounds_saving"] = round((ms10 - rec["ms"]["7"]) / ms10, 3)
            rec["exact_division_share"] = round((ms10 - rec["ms"]["inexact"]) / ms10, 3)
            print(json.dumps(rec), flush=True)
            res["shapes"].append(rec)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
