"""Dump cuSPARSELt's compressed 2:4 layout for known inputs (GPU), to reverse-engineer it on a CPU.

    python -m scripts.experiments.probes.probe_layout --out $OUT/layout_dump.pt     # from the repository root

For each accepted shape, dtype and orientation ("row": A (m x k) row-major, 2:4 along k, as W in the
forward GEMM; "col": A (m x k) column-major, 2:4 along k, as W^T in the input-gradient GEMM) the
library compressor (`cusparseLtSpMMACompress2`) is fed:
  * code trials: a random 2-of-4 mask whose kept values encode their row (one trial) and column
    (another trial) as distinct bit patterns -> where every kept value lands;
  * meta trials: random masks (2 kept per group, or any valid count 0..2) with random values -> the
    metadata bytes;
  * uniform trials (small shapes): every group with the same subset (all 11 valid ones) -> the
    nibble code of each subset and where padding zeros go;
  * a -0.0 trial: does the compressor count -0.0 as a zero?
Everything needed to regenerate the inputs is stored next to the bytes. Masks are stored per group
of 4 as a nibble (bit i = position i of the group kept), shaped (m, k/4) in logical coordinates.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sparsity.backends.cusparselt.compressor import Compressor, OperandLayout, structured_descriptor
from sparsity.backends.cusparselt.library import ORDER_COL, ORDER_ROW, handle, lib
from sparsity.backends.cusparselt.plans import GemmPlan

# a positive normal number in fp16 and bf16; base + index stays finite for index < 0x7000
CODE_BASE = 0x0400

VALID_SUBSETS = [
    0b0011,
    0b0101,
    0b1001,
    0b0110,
    0b1010,
    0b1100,
    0b0001,
    0b0010,
    0b0100,
    0b1000,
    0b0000,
]
TWO_KEPT = VALID_SUBSETS[:6]


def expand_mask(nib: torch.Tensor) -> torch.Tensor:
    """(m, k/4) nibbles -> (m, k) bool."""
    bits = (nib.to(torch.int32)[..., None] >> torch.arange(4, device=nib.device)) & 1
    return bits.reshape(nib.shape[0], -1).bool()


def to_memory(a: torch.Tensor, orient: str) -> torch.Tensor:
    """Logical (m, k) -> the contiguous buffer the descriptor describes."""
    return a.contiguous() if orient == "row" else a.t().contiguous()


def rand_nibbles(m, k, subsets, gen, device):
    tab = torch.tensor(subsets, dtype=torch.uint8)
    idx = torch.randint(0, len(subsets), (m, k // 4), generator=gen)
    return tab[idx].to(device)


def code_values(m, k, which, dtype, device):
    r = torch.arange(m, device=device)[:, None].expand(m, k)
    c = torch.arange(k, device=device)[None, :].expand(m, k)
    idx = r if which == "row" else c
    return (idx.to(torch.int32) + CODE_BASE).to(torch.int16).view(dtype)


def rand_values(m, k, dtype, gen, device):
    v = torch.randn(m, k, generator=gen)
    v = torch.where(v.abs() < 0.05, torch.full_like(v, 0.5), v)
    return v.to(dtype).to(device)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    cs = lib()
    h = handle(0)
    info = {
        "cusparselt_version": cs.get_version(h),
        "gpu": torch.cuda.get_device_name(),
        "arch": "sm{}{}".format(*torch.cuda.get_device_capability()),
    }
    # ---- which shapes does the structured descriptor accept, and how large is the compressed buffer?
    accept = {}
    trial_shapes = [
        (8, 16),
        (16, 8),
        (16, 16),
        (16, 32),
        (32, 16),
        (24, 40),
        (32, 32),
        (48, 48),
        (17, 16),
        (16, 20),
        (64, 64),
        (80, 96),
        (128, 128),
        (144, 160),
        (256, 256),
        (4096, 1024),
        (1024, 4096),
    ]
    for dtype in (torch.float16,):
        for orient in ("row", "col"):
            for m, k in trial_shapes:
                lay = OperandLayout(
                    m, k, k if orient == "row" else m, ORDER_ROW if orient == "row" else ORDER_COL
                )
                try:
                    d = structured_descriptor(h, lay, dtype)
                    sz = cs.sp_mma_compressed_size2(h, d)
                    accept[f"{orient}_{m}x{k}"] = [int(sz[0]), int(sz[1])]
                    cs.mat_descriptor_destroy(d)
                except Exception as e:  # noqa: BLE001
                    accept[f"{orient}_{m}x{k}"] = repr(e)[:120]
    info["accept"] = accept
    print(json.dumps(accept, indent=0))

    dumps = {}
    shapes = [
        (16, 16),
        (32, 64),
        (64, 32),
        (64, 64),
        (128, 128),
        (128, 256),
        (256, 128),
        (192, 320),
        (256, 512),
        (512, 256),
    ]
    gen = torch.Generator().manual_seed(1234)
    for dtype in (torch.float16, torch.bfloat16):
        for orient in ("row", "col"):
            dump = dumps[(dtype, orient)] = {"entries": {}}
            for m, k in shapes:
                key = f"{str(dtype)[6:]}_{orient}_{m}x{k}"
                lay = OperandLayout(
                    m, k, k if orient == "row" else m, ORDER_ROW if orient == "row" else ORDER_COL
                )
                try:
                    comp = Compressor(0, lay, dtype)
                except Exception as e:  # noqa: BLE001
                    dump["entries"][key] = {"error": repr(e)}
                    continue
                e = {
                    "m": m,
                    "k": k,
                    "size": int(comp.compressed_size),
                    "buffer_size": int(comp.buffer_size),
                }
                nib = rand_nibbles(m, k, TWO_KEPT, gen, dev)
                mask = expand_mask(nib)
                e["code_mask"] = nib.cpu()
                for which in ("row", "col"):
                    zero = torch.zeros((), dtype=dtype, device=dev)
                    a = torch.where(mask, code_values(m, k, which, dtype, dev), zero)
                    e[f"code_{which}"] = comp(to_memory(a, orient)).cpu()
                meta_trials = []
                for t in range(6):
                    subsets = TWO_KEPT if t < 4 else VALID_SUBSETS
                    nib = rand_nibbles(m, k, subsets, gen, dev)
                    vals = rand_values(m, k, dtype, gen, dev)
                    a = torch.where(
                        expand_mask(nib), vals, torch.zeros((), dtype=dtype, device=dev)
                    )
                    out = comp(to_memory(a, orient)).cpu()
                    small = m * k <= 128 * 256
                    meta_trials.append(
                        {
                            "nib": nib.cpu(),
                            "bytes": out if small else out[m * k :],
                            "full": small,
                            "dense": to_memory(a, orient).cpu() if small else None,
                        }
                    )
                e["meta_trials"] = meta_trials
                if m * k <= 128 * 256:
                    uni = []
                    for s in VALID_SUBSETS:
                        nib = torch.full((m, k // 4), s, dtype=torch.uint8, device=dev)
                        vals = rand_values(m, k, dtype, gen, dev)
                        a = torch.where(
                            expand_mask(nib), vals, torch.zeros((), dtype=dtype, device=dev)
                        )
                        in_memory = to_memory(a, orient)
                        uni.append(
                            {"subset": s, "dense": in_memory.cpu(), "bytes": comp(in_memory).cpu()}
                        )
                    e["uniform"] = uni
                    # -0.0 trial: some kept values replaced by -0.0
                    nib = rand_nibbles(m, k, TWO_KEPT, gen, dev)
                    vals = rand_values(m, k, dtype, gen, dev)
                    negz = (torch.rand(m, k, generator=gen) < 0.15).to(dev) & expand_mask(nib)
                    vals = torch.where(negz, torch.full((), -0.0, dtype=dtype, device=dev), vals)
                    a = torch.where(
                        expand_mask(nib), vals, torch.zeros((), dtype=dtype, device=dev)
                    )
                    e["negzero"] = {
                        "nib": nib.cpu(),
                        "negz": negz.cpu(),
                        "dense": to_memory(a, orient).cpu(),
                        "bytes": comp(to_memory(a, orient)).cpu(),
                    }
                dump["entries"][key] = e
    torch.cuda.synchronize()
    # plan-based compress vs descriptor-based compress (does the layout depend on the plan /
    # algorithm?)
    plan_check = {}
    for kind, (o, i) in (("fwd", (256, 512)), ("dgrad", (256, 512))):
        lay = OperandLayout.for_weight(o, i, kind)
        comp = Compressor(0, lay, torch.float16)
        w = rand_values(o, i, torch.float16, gen, dev)
        nib = rand_nibbles(lay.rows, lay.cols, TWO_KEPT, gen, dev)
        mask_l = expand_mask(nib)  # logical (m, k) of A
        logical = w.reshape(lay.rows, lay.cols) if kind == "fwd" else w.t()
        a_log = torch.where(mask_l, logical, torch.zeros((), dtype=torch.float16, device=dev))
        mem = to_memory(a_log, "row" if kind == "fwd" else "col")
        ref = comp(mem)
        res = {}
        for alg in (None, 1, 3, 7):
            try:
                plan = GemmPlan(
                    ("probe", kind, alg), 0, h, lay, 256, torch.float16, True, ORDER_COL, False, alg
                )
                plan.build()
                sz = cs.sp_mma_compressed_size(h, plan.plan)
                out = torch.empty(int(sz[0]), dtype=torch.uint8, device=dev)
                buf = torch.empty(max(int(sz[1]), 16), dtype=torch.uint8, device=dev)
                cs.sp_mma_compress(
                    h,
                    plan.plan,
                    mem.data_ptr(),
                    out.data_ptr(),
                    buf.data_ptr(),
                    torch.cuda.current_stream().cuda_stream,
                )
                torch.cuda.synchronize()
                res[str(alg)] = {
                    "alg": plan.current_alg(),
                    "max_alg": plan.max_alg(),
                    "size": int(sz[0]),
                    "same_bytes": bool(out.numel() == ref.numel() and torch.equal(out, ref)),
                }
            except Exception as ex:  # noqa: BLE001
                res[str(alg)] = repr(ex)[:200]
        plan_check[kind] = res
    info["plan_check"] = plan_check
    print(json.dumps(plan_check, indent=1))
    for (dtype, orient), dump in dumps.items():
        dump["info"] = info
        path = args.out.replace(".pt", f"_{str(dtype)[6:]}_{orient}.pt")
        torch.save(dump, path)
        print("layout dump written", path, time.strftime("%H:%M:%S"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
