"""Probe (GPU): which of torch's scaled-dot-product-attention kernels is fastest at the ViT-L step's
attention shapes? The ledger files 20.2 ms of the dense step under attention, paid alike by both
phases: the student's branches on their kept subsets (89 of 128 global crops at 197 tokens, 358 of
512 local crops at 37 tokens, forward and backward) and the teacher's 128 global crops (forward).
Short sequences make many small problems, where the backends differ most.

    python -m scripts.experiments.probes.probe_attention --out results/bench/ledger_h200/attention_h200.json

Each case is timed as one CUDA graph a call, per backend that accepts it (flash, memory-efficient,
cuDNN), with q, k and v laid out as the model makes them: views of one (B, N, 3, H, D) qkv tensor.
Every backend's output and input gradients are checked against the math backend's in fp32.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
import torch.nn.functional as F

from models.stochastic_depth import kept_samples

HEADS, HEAD_DIM = 16, 64  # ViT-L
BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


def step_cases(batch: int = 64, local_crops: int = 8, drop_path: float = 0.3) -> list[dict]:
    """The attention calls of one ViT-L DINOv2 step, per block: (sequences, tokens, backward?)."""
    globals_, locals_ = 2 * batch, local_crops * batch
    return [
        {"name": "student global", "seqs": kept_samples(globals_, drop_path), "tokens": 197, "grad": True},
        {"name": "student local", "seqs": kept_samples(locals_, drop_path), "tokens": 37, "grad": True},
        {"name": "teacher global", "seqs": globals_, "tokens": 197, "grad": False},
    ]  # fmt: skip


def qkv_views(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, H, N, D) as the model's Attention takes them from its qkv linear's output."""
    b, n, _ = qkv.shape
    return qkv.reshape(b, n, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4).unbind(0)


def _call(qkv, grad_out, backend: str | None, grad: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    ctx = sdpa_kernel(getattr(SDPBackend, backend)) if backend else contextlib.nullcontext()
    with ctx:
        out = F.scaled_dot_product_attention(*qkv_views(qkv))
    if grad:
        (g,) = torch.autograd.grad(out, qkv, grad_out)
        return out, g
    return out, None


def _check(case: dict, backend: str) -> float | None:
    """Largest relative error of the backend's output (and input gradient) against the math
    backend in fp32; None where the backend refuses the case."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (case["seqs"], case["tokens"], 3 * HEADS * HEAD_DIM)
    qkv = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
    grad_out = torch.randn(
        case["seqs"], HEADS, case["tokens"], HEAD_DIM, device="cuda", generator=gen
    ).to(torch.bfloat16)
    try:
        got = _call(qkv, grad_out, backend, case["grad"])
    except RuntimeError:
        return None
    ref = _call(qkv.detach().float().requires_grad_(), grad_out.float(), "MATH", case["grad"])
    errs = [((a.float() - b).norm() / b.norm()).item() for a, b in zip(got, ref) if a is not None]
    return max(errs)


def time_case(case: dict, rounds: int) -> dict:
    from scripts.benchmarks.timing import graph_ms_in_turns  # noqa: PLC0415

    shape = (case["seqs"], case["tokens"], 3 * HEADS * HEAD_DIM)
    sets = [
        torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_(case["grad"])
        for _ in range(2)
    ]
    grads = [
        torch.randn(
            case["seqs"], HEADS, case["tokens"], HEAD_DIM, device="cuda", dtype=torch.bfloat16
        )
        for _ in range(2)
    ]
    rec = {**case, "rel_err": {}, "ms": {}}
    rows = {"default": None}
    for backend in BACKENDS:
        rec["rel_err"][backend] = _check(case, backend)
        if rec["rel_err"][backend] is not None:
            rows[backend] = backend
    steps = {
        name: (lambda i, b=backend: _call(sets[i], grads[i], b, case["grad"]))
        for name, backend in rows.items()
    }
    rec["ms"] = {name: round(ms, 4) for name, ms in graph_ms_in_turns(steps, 2, rounds).items()}
    best = min((ms, name) for name, ms in rec["ms"].items())
    rec["fastest"] = best[1]
    rec["fastest_vs_default"] = round(rec["ms"]["default"] / best[0], 3)
    return rec


def per_step(case_ms: list[dict], blocks: int = 24) -> dict:
    """Milliseconds a step (`blocks` calls of each case) per backend, None for a backend that refused
    a case; and with the fastest backend of each case."""
    names = {name for ms in case_ms for name in ms}
    out = {
        name: round(blocks * sum(ms[name] for ms in case_ms), 3)
        if all(name in ms for ms in case_ms)
        else None
        for name in sorted(names)
    }
    out["fastest_each"] = round(blocks * sum(min(ms.values()) for ms in case_ms), 3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (medians of each)")
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for case in step_cases():
        rec = time_case(case, args.rounds)
        print(json.dumps(rec), flush=True)
        res["cases"].append(rec)
    res["ms_per_step"] = per_step([c["ms"] for c in res["cases"]])
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res["ms_per_step"]))


if __name__ == "__main__":
    main()
