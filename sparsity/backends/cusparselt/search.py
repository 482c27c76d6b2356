"""Which cuSPARSELt algorithm a GEMM shape runs: the search policy, and the per-thread plan cache it
fills.

`get_plan(..., mode=...)` returns this thread's cached `GemmPlan` for a GEMM; the first time a shape
is seen in the process its algorithm is chosen by `mode` (`BackendSettings.cslt_search`, whose tuple
of valid values, `CSLT_SEARCH_MODES`, is also the config's):

  "sweep"         every CONFIG_ID 0..max is built, run once on the given operands and checked against
                  `reference()` (the dense masked product, laid out like D: (n x m) for COL); wrong or failing ones
                  are skipped (pytorch/pytorch#155333 reports algorithms that give wrong results); the fastest of
                  the rest (median of 5, CUDA events) wins. Runs only where `BAD_ALGS` has an entry for (arch,
                  cuSPARSELt version, dtype); elsewhere the default algorithm is used.
  "sweep_unsafe"  the sweep also where `BAD_ALGS` has no entry (an algorithm may crash the CUDA context).
  "library"       cusparseLtMatmulSearch, then the winner is checked once; if wrong, the default algorithm.
                  (On the H100 with cuSPARSELt 0.8.0 this failed with an internal error for fp16 and left the
                  context broken, so it is not the default.)
  "none"          the library's default algorithm.

Without operands, or inside CUDA-graph capture (timing would synchronise), the default algorithm is
used and the choice is not remembered: build plans (first call per shape) outside graph capture.
Choices are shared by all threads (the result does not depend on the thread); plans and handles are
per thread.
"""

from __future__ import annotations

import logging
import threading

import torch

from ..base import BackendUnavailable
from ..cuda import rel_err
from ..settings import CSLT_SEARCH_MODES
from ..timing import median_cuda_ms
from .compressor import OperandLayout
from .library import ORDER_COL, arch_of, lib, version
from .plans import GemmPlan, d_as_tokens_major, empty_d, make_plan

log = logging.getLogger(__name__)

DEFAULT_MODE = CSLT_SEARCH_MODES[0]

# Algorithm ids that must never be run: on cuSPARSELt 0.8.0 / sm90 some fp16 algorithms die with an
# illegal instruction, which kills the CUDA context (found with
# scripts/experiments/probes/probe_algs.py; results/bench/NOTES.md). Keyed by (arch, cuSPARSELt
# version, dtype). The sweep runs only where an entry exists (bf16 and fp16 alike), or with mode
# "sweep_unsafe"; elsewhere the default algorithm is used.
BAD_ALGS: dict = {
    ("sm90", 800, torch.bfloat16): frozenset(),
    # fp16: ids >= 34 (dgrad) / >= 36 (fwd) died with "illegal instruction" at every shape probed,
    # ids below ran correctly; all ids >= 34 are kept out (results/bench/NOTES.md, "fp16
    # algorithms")
    ("sm90", 800, torch.float16): frozenset(range(34, 1024)),
    # 0.10.0 (pip nvidia-cusparselt-cu13), bf16: every id of the ViT-L MLP GEMMs probed, none
    # crashed
    ("sm90", 1000, torch.bfloat16): frozenset(),
}


def register_bad_algs(arch: str, cusparselt_version: int, dtype: torch.dtype, alg_ids) -> None:
    """Declare the algorithm ids that crash the GPU on (arch, cuSPARSELt version, dtype), as found
    by running each id in a process of its own (scripts/experiments/probes/probe_algs.py): "sweep"
    then runs there too, skipping them. Adds to what is known; choices already made in this process
    stay."""
    if not (isinstance(arch, str) and arch.startswith("sm") and arch[2:].isdigit()):
        raise ValueError(
            f"arch={arch!r}: expected 'sm' and the compute capability's digits, e.g. 'sm90'"
        )
    if not isinstance(cusparselt_version, int) or cusparselt_version <= 0:
        raise ValueError(
            f"cusparselt_version={cusparselt_version!r}: expected the library's int version, e.g. "
            f"800"
        )
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype={dtype}: cuSPARSELt runs here in torch.float16 or torch.bfloat16")
    ids = frozenset(alg_ids)
    if not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"alg_ids={sorted(ids, key=str)}: expected non-negative ints")
    key = (arch, cusparselt_version, dtype)
    BAD_ALGS[key] = BAD_ALGS.get(key, frozenset()) | ids


class _Plans(threading.local):
    def __init__(self):
        self.by_key: dict[tuple, GemmPlan] = {}


_plans = _Plans()
_alg_choice: dict[tuple, dict] = {}  # key -> record of the choice, shared across threads
_alg_lock = threading.Lock()


def sweep_blocklist(device_index: int, dtype: torch.dtype, mode: str) -> frozenset | None:
    """The algorithm ids a sweep must skip here; None where the sweep must not run at all."""
    bad = BAD_ALGS.get((arch_of(device_index), version(), dtype))
    if bad is None and mode == "sweep_unsafe":
        return frozenset()
    return bad


def get_plan(
    out_features: int,
    in_features: int,
    kind: str,
    n: int,
    dtype: torch.dtype,
    device_index: int,
    *,
    mode: str = DEFAULT_MODE,
    b_transposed: bool = True,
    has_bias: bool = False,
    d_order: int = ORDER_COL,
    search: bool = True,
    a_compressed: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    reference=None,
) -> GemmPlan:
    """The cached plan for this GEMM; built (and its algorithm chosen by `mode` and checked) on
    first use. `search=False`: the default algorithm, not remembered (as without operands)."""
    if mode not in CSLT_SEARCH_MODES:
        raise ValueError(f"cslt_search={mode!r} is not one of {', '.join(CSLT_SEARCH_MODES)}")
    key = (
        device_index,
        dtype,
        kind,
        out_features,
        in_features,
        n,
        b_transposed,
        d_order,
        has_bias,
        mode,
    )
    plan = _plans.by_key.get(key)
    if plan is not None:
        return plan
    lay = OperandLayout.for_weight(out_features, in_features, kind)
    args = (key, device_index, lay, n, dtype, b_transposed, d_order, has_bias)
    with _alg_lock:
        choice = _alg_choice.get(key)
    if choice is not None:
        plan = _plans.by_key[key] = make_plan(*args, choice["alg_id"])
        return plan
    capturing = torch.cuda.is_current_stream_capturing()
    can_search = (
        search and mode != "none" and not capturing and None not in (a_compressed, b, reference)
    )
    blocklist = sweep_blocklist(device_index, dtype, mode) if mode != "library" else frozenset()
    if blocklist is None:
        can_search = False
    plan = make_plan(*args)
    if not can_search:
        _plans.by_key[key] = plan
        return plan
    default_alg = plan.current_alg()
    record = {
        "default_alg": default_alg,
        "mode": mode,
        "kind": kind,
        "out_features": out_features,
        "in_features": in_features,
        "tokens": n,
        "dtype": str(dtype).replace("torch.", ""),
    }
    d = empty_d(plan, b.device)
    bias0 = torch.zeros(lay.rows, dtype=dtype, device=b.device) if has_bias else None
    ref = reference()
    if mode == "library":
        plan = _library_search(plan, args, a_compressed, b, d, bias0, ref, record)
    else:
        plan = _sweep(plan, args, blocklist, a_compressed, b, d, bias0, ref, record)
    record["alg_id"] = plan.current_alg()
    with _alg_lock:
        _alg_choice[key] = record
    _plans.by_key[key] = plan
    log.info("cuSPARSELt plan %s: alg %d (default %d)", key[1:], record["alg_id"], default_alg)
    return plan


def _library_search(plan, args, a_compressed, b, d, bias0, ref, record) -> GemmPlan:
    """cusparseLtMatmulSearch's winner if it is correct, else the default algorithm."""
    default_alg = record["default_alg"]
    if plan.has_bias:
        plan.bias_buf.zero_()
    plan.search(a_compressed, b, d)
    searched = plan.current_alg()
    plan.run(a_compressed, b, d, bias0)
    err = rel_err(d_as_tokens_major(plan, d), ref)
    record.update(searched_alg=searched, search_rel_err=err)
    if not err < 1e-2:
        log.warning(
            "cuSPARSELt searched alg %d gives rel err %.3g for %s: using the default alg %d",
            searched,
            err,
            plan.key,
            default_alg,
        )
        plan.destroy()
        plan = make_plan(*args, default_alg)
    return plan


def _sweep(plan, args, blocklist, a_compressed, b, d, bias0, ref, record) -> GemmPlan:
    """Every algorithm id not in `blocklist`, checked and timed: the fastest correct one (its
    plan)."""
    c = lib()
    default_alg = record["default_alg"]
    max_alg = plan.max_alg()
    timings, rejected = {}, {}
    best_plan, best_ms = None, float("inf")
    for alg in range(max_alg + 1):
        if alg in blocklist:
            rejected[alg] = "blocklisted (crashes)"
            continue
        p = plan if alg == default_alg else None
        log.debug("cuSPARSELt sweep %s: trying alg %d", plan.key[1:], alg)
        try:
            if p is None:
                p = make_plan(*args, alg)
            p.run(a_compressed, b, d, bias0)
            torch.cuda.synchronize()
            err = rel_err(d_as_tokens_major(p, d), ref)
            if not err < 1e-2:
                rejected[alg] = f"rel err {err:.3g}"
                raise _Reject()
            ms = median_cuda_ms(lambda: p.run(a_compressed, b, d, bias0), 2, 5)
            timings[alg] = round(ms, 5)
            if ms < best_ms:
                if best_plan is not None and best_plan is not p:
                    best_plan.destroy()
                best_plan, best_ms = p, ms
                continue
        except _Reject:
            pass
        except c.cuSPARSELtError as e:
            rejected[alg] = repr(e)
        if p is not None and p is not best_plan:
            p.destroy()
    if best_plan is None:
        raise BackendUnavailable(
            f"no cuSPARSELt algorithm gave a correct result for {plan.key}: {rejected}"
        )
    record.update(timings_ms=timings, rejected=rejected, best_ms=best_ms)
    if rejected:
        log.info("cuSPARSELt %s: algorithms rejected %s", plan.key, rejected)
    return best_plan


class _Reject(Exception):
    pass


def plan_records() -> dict:
    """{str(key): record} of every algorithm chosen in this process (for the run log and the
    decisions file)."""
    with _alg_lock:
        return {str(k): dict(v) for k, v in _alg_choice.items()}


def choice_record(key: tuple) -> dict | None:
    """The record of the algorithm chosen for a plan key, or None (default algorithm, not
    searched)."""
    with _alg_lock:
        rec = _alg_choice.get(key)
    return None if rec is None else dict(rec)
