"""Probe (GPU): what one matrix for the tokens of all crop batches saves or costs around a ViT-L
block's 2:4 linears, and whether the way rows are padded to cuSPARSELt's multiple of 8 is the cost.

    python -m scripts.experiments.probes.probe_block_rows --out results/bench/ledger_h200/block_rows_h200.json

In the sparse step replayed as one graph, the student's attention per crop batch ran 2.5 ms faster
than on one matrix, though cuSPARSELt's own timings favour one matrix (results/bench/NOTES.md,
"What the concatenated attention is worth in the sparse phase: measured"). The hypothesis: a 2:4
layer padded its input with `F.pad` and unpadded its output with a slice, whose gradient pads the
output gradient. On one matrix that gradient is the concatenation of the crop batches' gradients,
which the compiler writes out before the padded copy; per crop batch the pad fuses into the kernel
that produces the gradient. Padding by concatenating zero rows (and unpadding by a split) lets the
concatenations nest, with no copy in between. This probe measured it (0.22 ms a block with the
attention on 2:4), and `sparsity.traced` now pads so; `F.pad + slice` stays here to be timed
against it.

One student block (1024 wide, 16 heads, MLP 4096, LayerScale at 1, no stochastic depth), compiled as
training compiles it (`dynamic=False, fullgraph=True`, bf16 autocast over fp32 weights), forward and
backward on the step's two crop batches of kept tokens (89 x 197 and 358 x 37: 30,779 rows), each
call one CUDA graph, the cases taking turns. Cases: the linears dense, the MLP's on 2:4, the MLP's
and the attention's on 2:4 (cuSPARSELt, `tile_greedy`); each with the block's four groupings
(everything on one matrix as today, the attention's linears per crop batch, the MLP per crop batch,
everything per crop batch) and, for the 2:4 cases, both paddings. Every case's outputs and input
gradients are checked against its set's case on one matrix with `F.pad + slice` (the same weights,
pruned alike).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

CROPS = ((89, 197), (358, 37))  # kept subsets of 128 global and 512 local crops at rate 0.3
DIM, HEADS = 1024, 16
SETS = {
    "dense": None,
    "mlp 2:4": r"mlp\.fc[12]",
    "mlp+attention 2:4": r"mlp\.fc[12]|attn\.(qkv|proj)",
}
GROUPINGS = ("one matrix", "attention per crop", "mlp per crop", "all per crop")
# (set, grouping, padding); each set's first case is the one its others are checked against
CASES = (
    ("dense", "one matrix", None),  # dense linears pad nothing
    ("dense", "all per crop", None),
    ("mlp 2:4", "one matrix", "F.pad + slice"),
    ("mlp 2:4", "mlp per crop", "F.pad + slice"),
    ("mlp 2:4", "one matrix", "cat + split"),
    ("mlp+attention 2:4", "one matrix", "F.pad + slice"),
    ("mlp+attention 2:4", "attention per crop", "F.pad + slice"),
    ("mlp+attention 2:4", "all per crop", "F.pad + slice"),
    ("mlp+attention 2:4", "one matrix", "cat + split"),
    ("mlp+attention 2:4", "attention per crop", "cat + split"),
)


def pad_by_f_pad(x2: torch.Tensor, pad: int) -> torch.Tensor:
    """Zero rows appended by `F.pad`, `sparsity.traced`'s padding before this probe."""
    return F.pad(x2, (0, 0, 0, pad))


def unpad_by_slice(y: torch.Tensor, tokens: int) -> torch.Tensor:
    """The first `tokens` rows by a slice (its gradient: a `slice_scatter` into zeros)."""
    return y[:tokens]


PADDINGS = {
    "F.pad + slice": (pad_by_f_pad, unpad_by_slice),
    "cat + split": None,  # sparsity.traced's own since this probe
}


def set_grouping(block, grouping: str) -> None:
    """Run the block's attention linears and/or MLP per crop batch, as the step benchmark's
    ablations do."""
    from scripts.benchmarks.crop_grouping import run_per_crop

    if grouping not in GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}; choose from {', '.join(GROUPINGS)}")
    if grouping in ("attention per crop", "all per crop"):
        run_per_crop(block, "attention")
    if grouping in ("mlp per crop", "all per crop"):
        run_per_crop(block, "mlp")


@contextlib.contextmanager
def padding(functions: tuple[Callable, Callable] | None):
    """`sparsity.traced` pads and unpads rows with `functions` (None: its own) inside the context."""
    from sparsity import traced

    saved = traced._pad_rows, traced._unpad_rows
    if functions:
        traced._pad_rows, traced._unpad_rows = functions
    try:
        yield
    finally:
        traced._pad_rows, traced._unpad_rows = saved


def make_block(pattern: str | None):
    from models.vit_block import Block
    from sparsity import swap_linear_modules

    torch.manual_seed(0)
    # LayerScale at 1, not ViT-L's 1e-5: the timing is the same, and the branches then show in the
    # outputs and gradients the cases are checked by
    block = Block(DIM, HEADS, init_values=1.0).cuda()
    if pattern:
        swap_linear_modules(block, pattern=pattern, backend="cusparselt", pruning="tile_greedy")
    return block


def inputs(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    xs = [torch.randn(b, n, DIM, device="cuda", generator=gen).requires_grad_() for b, n in CROPS]
    grads = [torch.randn(b, n, DIM, device="cuda", generator=gen) for b, n in CROPS]
    return xs, grads


def forward_backward(block, xs, grads) -> list[torch.Tensor]:
    for x in xs:
        x.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outs = block(xs)
    torch.autograd.backward([o.float() for o in outs], grads)
    return [o.detach() for o in outs] + [x.grad for x in xs]


def rel_err(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(
        ((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(got, want)
    )


def build_case(pattern: str | None, grouping: str, functions) -> tuple[list, Callable]:
    """The case's compiled block: its first call's outputs and input gradients, and a step(i) on
    input set i. Every call runs under the case's padding, so that no guard sees another one."""
    block = make_block(pattern)
    set_grouping(block, grouping)
    block.compile(dynamic=False, fullgraph=True)
    sets = [inputs(seed) for seed in (0, 1)]

    def step(i: int) -> list[torch.Tensor]:
        with padding(functions):
            return forward_backward(block, *sets[i])

    return step(0), step


def case_name(set_name: str, grouping: str, pad_name: str | None) -> str:
    return " | ".join(p for p in (set_name, grouping, pad_name) if p)


def main() -> None:
    from scripts.benchmarks.timing import graph_ms_in_turns

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--rounds", type=int, default=5, help="turns the cases take (medians of each)")
    ap.add_argument(
        "--sets", nargs="*", default=list(SETS), choices=list(SETS), help="which linears on 2:4"
    )
    args = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 64  # one compiled block per case
    steps, errors, reference = {}, {}, {}
    for set_name, grouping, pad_name in CASES:
        if set_name not in args.sets:
            continue
        name = case_name(set_name, grouping, pad_name)
        functions = PADDINGS[pad_name] if pad_name else None
        out, steps[name] = build_case(SETS[set_name], grouping, functions)
        reference.setdefault(set_name, out)
        errors[name] = round(rel_err(out, reference[set_name]), 5)
        print(f"{name}: compiled; against its set's first case, relative error {errors[name]}")
    ms = graph_ms_in_turns(steps, 2, args.rounds)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "crops": CROPS,
        "rows": sum(b * n for b, n in CROPS),
        "rounds": args.rounds,
        "rel_err": errors,
        "ms": {k: round(v, 4) for k, v in ms.items()},
    }
    for name, v in result["ms"].items():
        print(f"{name:62s} {v:8.3f} ms a block ({24 * v:7.1f} ms for 24)", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
