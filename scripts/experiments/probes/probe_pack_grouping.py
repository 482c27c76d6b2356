"""Probe (GPU): would one launch that prunes and packs all of a ViT-L's MLP weights beat one launch a
weight? The step's prune + pack (our fused kernel, W and W^T) costs about 29 us a weight on one H200
in the step, 1.4 ms for the student's 48 weights (1.0 ms more for the 2:4 teacher's, W alone), where
the instruction floor of one weight is about 7.5 us: one weight's 256 programs fill the GPU's 132 SMs
once, at about two programs an SM, too few warps to hide the latency of the kernel's integer work.

    python -m scripts.experiments.probes.probe_pack_grouping --out results/bench/ledger_h200/pack_grouping_h200.json

For each MLP shape, 24 weights (one ViT-L's fc1s or fc2s), each row replayed as one CUDA graph:
- `separate`: 24 launches of `prune_pack`, one a weight (what the step does today);
- `grouped`: one launch of `prune_pack_group` over the 24 weights where they lie, each weight's
  outputs those of `prune_pack` (checked here, byte for byte where the layout uses them);
- `stacked`: one launch of `prune_pack` over the 24 weights stacked along their rows, the same tiles
  and bytes in one tensor (the ceiling of grouping: no address tables);
- `copy_separate` / `copy_stacked`: plain copies moving the same bytes, 24 of one weight's traffic
  or one of all of it (the issue's yardstick: prune + pack within 1.2x of a copy of its bytes);
each with W^T packed too (the student) and without (the teacher).
"""

from __future__ import annotations

import argparse
import json

import torch

from sparsity.kernels.pack_cusparselt import prune_pack
from sparsity.kernels.pack_cusparselt_group import prune_pack_group
from sparsity.packing import layout as L

SHAPES = ((4096, 1024), (1024, 4096))  # (out, in) of fc1 and fc2 in ViT-L
LAYERS = 24


def traffic_bytes(out_f: int, in_f: int, write_t: bool) -> int:
    """Bytes one prune + pack of a bf16 (out, in) weight moves: W read once, the compressed operand
    written once (twice with W^T), the int16 kept mask of every 4x4 tile written."""
    packed = L.compressed_size(out_f, in_f) * (2 if write_t else 1)
    return out_f * in_f * 2 + packed + (out_f // 4) * (in_f // 4) * 2


def stacked_tile_bits_match(weights: list[torch.Tensor], write_t: bool = True) -> bool:
    """Whether packing the weights stacked along their rows prunes every tile as packing each alone
    does (the stacked row times the same decisions): the tile masks concatenate."""
    alone = torch.cat([prune_pack(w, write_t=write_t).tile_bits for w in weights])
    return torch.equal(prune_pack(torch.cat(weights), write_t=write_t).tile_bits, alone)


def grouped_equals_separate(weights: list[torch.Tensor], write_t: bool = True) -> bool:
    """Whether one grouped launch writes every byte the layout uses, and every tile mask, as one
    launch a weight does."""
    R, C = weights[0].shape
    valid = {
        "fwd": L.valid_byte_mask(R, C, weights[0].device),
        "dgrad": L.valid_byte_mask(C, R, weights[0].device),
    }
    for g, s in zip(
        prune_pack_group(weights, write_t=write_t),
        [prune_pack(w, write_t=write_t) for w in weights],
    ):
        if not torch.equal(g.tile_bits, s.tile_bits) or not torch.equal(
            g.fwd[valid["fwd"]], s.fwd[valid["fwd"]]
        ):
            return False
        if write_t and not torch.equal(g.dgrad[valid["dgrad"]], s.dgrad[valid["dgrad"]]):
            return False
    return True


def ratios(us: dict) -> dict:
    """Speed-ups of the grouped and stacked launches over separate ones, and each against its copy
    (>1: slower than the copy)."""
    return {
        "grouped_speedup": round(us["separate"] / us["grouped"], 3),
        "stacked_speedup": round(us["separate"] / us["stacked"], 3),
        "grouped_vs_copy": round(us["grouped"] / us["copy_stacked"], 3),
        "separate_vs_copy": round(us["separate"] / us["copy_separate"], 3),
        "stacked_vs_copy": round(us["stacked"] / us["copy_stacked"], 3),
    }


def _time_shape(out_f: int, in_f: int, write_t: bool, rounds: int) -> dict:
    from scripts.benchmarks.timing import graph_ms_in_turns  # noqa: PLC0415

    sets = [
        [torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        for _ in range(2)
    ]
    stacks = [torch.cat(ws) for ws in sets]
    outs = [prune_pack(w, write_t=write_t) for w in sets[0]]  # preallocated, as the layers keep
    group_outs = prune_pack_group(sets[0], write_t=write_t)
    big = prune_pack(stacks[0], write_t=write_t)
    nbytes = traffic_bytes(out_f, in_f, write_t) // 2  # a copy reads n bytes and writes n
    src = [torch.empty(LAYERS, nbytes, dtype=torch.uint8, device="cuda") for _ in range(2)]
    dst = torch.empty_like(src[0])

    def separate(i):
        for w, o in zip(sets[i], outs):
            prune_pack(w, write_t=write_t, out=o)

    rows = {
        "separate": separate,
        "grouped": lambda i: prune_pack_group(sets[i], write_t=write_t, out=group_outs),
        "stacked": lambda i: prune_pack(stacks[i], write_t=write_t, out=big),
        "copy_separate": lambda i: [d.copy_(s) for d, s in zip(dst, src[i])],
        "copy_stacked": lambda i: dst.copy_(src[i]),
    }
    us = {name: round(ms * 1e3, 2) for name, ms in graph_ms_in_turns(rows, 2, rounds).items()}
    return {
        "out": out_f,
        "in": in_f,
        "write_t": write_t,
        "layers": LAYERS,
        "bytes_per_weight": traffic_bytes(out_f, in_f, write_t),
        "stacked_tile_bits_match": stacked_tile_bits_match(sets[0][:3], write_t),
        "grouped_equals_separate": grouped_equals_separate(sets[1], write_t),
        "us": us,
        "us_per_weight": {k: round(v / LAYERS, 2) for k, v in us.items()},
        **ratios(us),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (medians of each)")
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "shapes": []}
    for out_f, in_f in SHAPES:
        for write_t in (True, False):
            rec = _time_shape(out_f, in_f, write_t, args.rounds)
            print(json.dumps(rec), flush=True)
            res["shapes"].append(rec)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
