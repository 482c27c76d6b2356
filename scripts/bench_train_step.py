"""Time whole DINOv2 training steps on one GPU, eager and compiled, dense and 2:4-sparse, in one
process.

    python -m scripts.bench_train_step --config configs/vitl16_imagenet.yaml --out results/bench/train_step.json

Rows (`--rows`): `eager-dense` (the step with train.compile=false), `compiled-dense` (the baseline
of every ratio), `compiled-cusparselt`, `compiled-auto`, and optionally `eager-cusparselt` /
`eager-auto`, and `compiled-cusparselt+teacher` / `compiled-auto+teacher`: the sparse phase with the
teacher's MLPs 2:4 too (`sparsity.teacher=sparse`; the per-step prune + pack of the EMA weights is
in the step), and `+mvue` rows (`compiled-auto+mvue`, `compiled-auto+teacher+mvue`, ...): the
student's MLP weight gradients on 2:4 as well (`sparsity.weight_grad=mvue24`: dy^T pruned by MVUE
and compressed in one pass per layer); `+mvue-fc2` on the second MLP linear alone
(`sparsity.weight_grad_modules=.*\\.fc2`, where MVUE pays at ViT-L's shapes). `--compile-modes
default reduce-overhead` repeats the compiled rows with the blocks replayed as CUDA graphs
(`graphs-dense`, ...), `step-graph` with the whole step replayed as one CUDA graph
(`train.cuda_graph=true`: `stepgraph-dense`, ...; its first three steps per row run eagerly, the
fourth captures, so `--warmup` must be at least 4). Under this step an H100 runs at its power cap
and slows as it warms, so rows run later in a fixed order run slower: `--heat-s 60` compiles every
row first and then runs 60 s of steps, so that the rows start warm, and `--rounds N` lets the rows
take turns N times (each row's steps of all rounds together); every row records the clock,
temperature and power it ended at (`gpu_state`, per round in `rounds`); `round_stats` gives each
sparse row's ratio to its mode's dense row and each ablation's saving round by round, with 95%
intervals over the rounds (`python -m scripts.bench_rounds` pools several runs'). `--ablations` adds,
beside each compiled mode's dense row (`compiled-dense`, `stepgraph-dense`, ...), that row with one of
this step's choices undone (heads and losses left eager, foreach instead of fused AdamW, the two-pass
EMA, the per-step host syncs of the earlier loop, Python's automatic garbage collection, the
stochastic-depth gather's own backward, the compiled teacher centring, the pos-embed resize as a
matrix, the student's attention linears or its MLP per crop batch) or with stochastic depth off,
each timed right after the baseline it is compared with (a step graph is captured again for it);
`--ablate all` adds them beside the sparse compiled rows too. Every row
runs with the config's train.gc_period, as training does, and records the collections that ran in
its steps (`gc`: per generation, host ms).

One synthetic multi-crop batch (the real collate's shapes and masks, random pixels) is reused, so
the data pipeline is out of the measurement: forward (student + teacher) + backward + clipping +
AdamW + EMA, bf16 autocast over fp32 master weights, exactly `Trainer.train_step`. Eager rows run
the same trainer with torch.compile's stance "force_eager". Medians of CUDA-event timings after
warm-up (the first steps of a compiled row compile, and are warm-up). `--profile N` adds, per row,
the kernel time by category over N steps, and for sparse rows the part of the step 2:4 replaces:
dense GEMM time removed (the dense row's minus the sparse row's) against the sparse GEMM and
prune/pack time added, i.e. the in-place speed-up of the GEMMs 2:4 accelerates and their share of
the dense step. `--ledger N` profiles N steps per row with host activity and files every kernel
under what it computes (student MLP forward / input gradient / weight gradient, teacher MLP forward,
attention, other linears, heads and losses, norms and elementwise, optimizer and EMA;
`scripts/benchmarks/ledger.py`); the dense row's ledger projects the sparse phase's step ratio for
each set of GEMMs 2:4 could cover. Every row has its MFU (`mfu`: nominal and executed FLOPs per
second over the bf16 GEMM rate measured on the same GPU in the same run;
`scripts/benchmarks/flops.py`).
"""

import argparse
import functools
import gc
import itertools
import json
import statistics
import sys
from pathlib import Path

from configs.command_line import parse_command_line
from configs.schema import COMPILE_MODES
from scripts.benchmarks import bad_algs

BENCH_MODES = (*COMPILE_MODES, "step-graph")
MODE_ROW_PREFIX = {
    "reduce-overhead": "graphs-",
    "max-autotune-no-cudagraphs": "autotune-",
    "step-graph": "stepgraph-",
}
ROWS = (
    "eager-dense",
    "compiled-dense",
    "compiled-cusparselt",
    "compiled-auto",
    "eager-cusparselt",
    "eager-auto",
    "compiled-cusparselt+teacher",
    "compiled-auto+teacher",
    "compiled-auto+mvue",
    "compiled-cusparselt+teacher+mvue",
    "compiled-auto+teacher+mvue",
    "compiled-auto+mvue-fc2",
    "compiled-auto+teacher+mvue-fc2",
)
ALL_MODULES, FC2_ONLY = (
    ".*",
    r".*\.fc2",
)  # sparsity.weight_grad_modules of the `+mvue` and `+mvue-fc2` rows
ABLATIONS = (
    "heads-losses-eager",
    "foreach-adamw",
    "two-pass-ema",
    "host-syncs",
    "automatic-gc",
    "autograd-gather",
    "no-stochastic-depth",
    "teacher-centering-eager",
    "pos-embed-interpolate",
    "attention-per-crop",
    "mlp-per-crop",
)
# ablations that change what the step computes: their rows get no MFU (the FLOPs counted are the
# configured step's)
ABLATIONS_CHANGING_WORK = ("no-stochastic-depth",)


def runs_ablations(row: str, ablate: str) -> bool:
    """Whether the ablations run after `row`: compiled rows only (eager rows keep the model's eager
    methods, which several ablations replace), the dense ones unless `--ablate all`."""
    if row.startswith("eager"):
        return False
    return ablate == "all" or parse_row(row)[1] == "dense"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default="configs/vitl16_imagenet.yaml")
    ap.add_argument("--rows", nargs="*", default=list(ROWS[:4]), choices=ROWS)
    ap.add_argument("--ablations", nargs="*", default=[], choices=ABLATIONS)
    ap.add_argument(
        "--ablate",
        default="dense",
        choices=("dense", "all"),
        help="the compiled rows each ablation runs after: the dense ones (default), or every "
        "compiled row, sparse ones included (what an ablation is worth in the sparse phase)",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="untimed steps per row (compiled rows compile in them)",
    )
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--profile",
        type=int,
        default=2,
        help="steps per row profiled for the kernel breakdown (0: off)",
    )
    ap.add_argument(
        "--ledger",
        type=int,
        default=0,
        help="steps per row profiled with host activity for the ledger: kernel time by what it "
        "computes, "
        "and the dense row's projections for each set of GEMMs 2:4 could cover (0: off)",
    )
    ap.add_argument(
        "--ledger-top",
        type=int,
        default=4,
        help="launching ops listed per ledger class, largest first (e.g. 30 to see what the "
        "'norms and elementwise' class is made of)",
    )
    ap.add_argument(
        "--host-profile", type=int, default=0, help="steps per row under cProfile (0: off)"
    )
    ap.add_argument(
        "--stall-profile",
        type=int,
        default=0,
        help="steps per row profiled with host activity: CUDA API calls and the GPU's longest idle "
        "gaps",
    )
    ap.add_argument(
        "--compile-modes",
        nargs="*",
        default=["default"],
        choices=list(BENCH_MODES),
        help="train.compile_mode values; rows of reduce-overhead are named graphs-<backend>, of "
        "max-autotune-no-cudagraphs autotune-<backend>; step-graph (train.cuda_graph=true, the "
        "whole step one CUDA graph) stepgraph-<backend>",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="times the rows take turns (each round --iters steps per row): rows then meet the GPU "
        "at "
        "the same temperature and clock, which a single pass in a fixed order does not give",
    )
    ap.add_argument(
        "--heat-s",
        type=float,
        default=0.0,
        help="seconds of steps before each mode's first timed row, after every row's warm-up, so "
        "that "
        "every row runs at the clock the GPU holds under this load (an H100 at its power cap slows "
        "as it warms)",
    )
    bad_algs.add_argument(ap)
    ap.add_argument(
        "overrides", nargs="*", help="config overrides, e.g. train.batch_size_per_gpu=32"
    )
    return ap


if __name__ == "__main__":  # --help and a usage error answer here, before torch is imported
    parse_command_line(build_parser())

import torch  # noqa: E402

from configs import load_config  # noqa: E402
from models import vit_block  # noqa: E402
from models.pos_embed import bicubic_resize  # noqa: E402
from scripts.benchmarks.batch import synthetic_batch  # noqa: E402
from scripts.benchmarks.crop_grouping import run_per_crop  # noqa: E402
from scripts.benchmarks.flops import gemm_rate_tflops, mfu, step_flops  # noqa: E402
from scripts.benchmarks.gpu_state import gpu_state  # noqa: E402
from scripts.benchmarks.ledger import (  # noqa: E402
    COVERAGE,
    in_place as ledger_in_place,  # noqa: E402
    profile_ledger,
    projections,
    set_step_time,
)
from scripts.benchmarks.round_stats import (  # noqa: E402
    again_label,
    dense_row_name,
    format_round_stats,
    is_dense_row,
    round_stats,
)
from scripts.benchmarks.step_profiles import host_profile, profile_steps, stall_profile  # noqa: E402
from scripts.benchmarks.timing import MID_TRAINING_STEP, GcLog, StepLog, heat, time_steps  # noqa: E402
from sparsity.pruning import is_transposable  # noqa: E402
from sparsity.swap import name_matcher  # noqa: E402
from training.compile import TEACHER_CENTERING  # noqa: E402
from training.distributed import DistContext  # noqa: E402
from training.gc_control import StepGc  # noqa: E402
from training.trainer import Trainer  # noqa: E402


# `step-graph`: compile_mode=default with train.cuda_graph=true, the whole step replayed as one CUDA
# graph
class _Ablation:
    """Undo one of the step's choices on `trainer` inside a `with` block."""

    def __init__(self, trainer: Trainer, name: str):
        self.trainer, self.name, self.undo = trainer, name, []

    def __enter__(self):
        t, m = self.trainer, self.trainer.model
        if self.name == "heads-losses-eager":
            for mod in [
                *(h for k, h in m.student.items() if k != "backbone"),
                *(h for k, h in m.teacher.items() if k != "backbone"),
                m.dino_loss,
            ]:
                saved = mod._compiled_call_impl
                mod._compiled_call_impl = None
                self.undo.append(
                    lambda mod=mod, saved=saved: setattr(mod, "_compiled_call_impl", saved)
                )
            self._uncompile(m, [("ibot_patch_loss", "forward_masked"), *TEACHER_CENTERING])
        # the teacher's centred softmax and iBOT centre statistics as eager torch ops
        elif self.name == "teacher-centering-eager":
            self._uncompile(m, TEACHER_CENTERING)
        # the student's pos-embed resized by F.interpolate's bicubic kernel, not the matrix
        elif self.name == "pos-embed-interpolate":
            backbone = m.student.backbone
            backbone.interpolate_pos_encoding = functools.partial(_pos_embed_by_op, backbone)
            self.undo.append(lambda: backbone.__dict__.pop("interpolate_pos_encoding"))
        elif self.name == "foreach-adamw":
            fused = t.optimizer
            t.optimizer = torch.optim.AdamW(
                fused.param_groups, foreach=True, betas=fused.defaults["betas"]
            )
            self.undo.append(lambda: setattr(t, "optimizer", fused))
        elif self.name == "two-pass-ema":

            def two_pass(momentum):
                s_list, t_list = m._ema_pairs()
                torch._foreach_mul_(t_list, momentum)
                torch._foreach_add_(t_list, [s.detach() for s in s_list], alpha=1 - momentum)

            m.update_teacher = two_pass
            self.undo.append(lambda: m.__dict__.pop("update_teacher"))
        # the earlier loop read the loss flag after forward and the norms after clip
        elif self.name == "host-syncs":
            forward, clip = t.forward_model, t._clip_gradients

            def forward_then_read(*a, **k):
                loss, terms = forward(*a, **k)
                torch.isfinite(loss).item()
                return loss, terms

            def clip_then_read():
                norms = clip()
                [n.item() for n in norms.values()]
                return norms

            t.forward_model, t._clip_gradients = forward_then_read, clip_then_read
            self.undo.append(lambda: setattr(t, "forward_model", forward))
            self.undo.append(lambda: t.__dict__.pop("_clip_gradients"))
        # Python's own collection schedule instead of train.gc_period's
        elif self.name == "automatic-gc":
            was = gc.isenabled()
            gc.enable()
            self.undo.append(lambda: None if was else gc.disable())
        # the stochastic-depth gather with autograd's own backward (a zero tensor of the batch with
        # the rows' gradient put in, then added) instead of take_rows's one pass over the rows
        elif self.name == "autograd-gather":
            taken = vit_block.take_rows
            vit_block.take_rows = lambda x, rows: (x, x[rows])
            self.undo.append(lambda: setattr(vit_block, "take_rows", taken))
        # every student branch on the whole batch: what the subsets cost against what they save
        elif self.name == "no-stochastic-depth":
            for block in m.student.backbone.blocks:
                rate = block.sample_drop_ratio
                block.sample_drop_ratio = 0.0
                self.undo.append(
                    lambda block=block, rate=rate: setattr(block, "sample_drop_ratio", rate)
                )
        # the student's norm1, qkv, proj and ls1 (attention, as the reference runs them) or norm2,
        # fc1, fc2 and ls2 (mlp) per crop batch instead of once on the tokens of all crop batches:
        # what one matrix is worth, in the sparse phase above all (its 2:4 GEMMs then run at each
        # crop batch's token count)
        elif self.name in ("attention-per-crop", "mlp-per-crop"):
            branch = self.name.removesuffix("-per-crop")
            for block in m.student.backbone.blocks:
                self.undo.append(run_per_crop(block, branch))
        else:
            raise ValueError(f"unknown ablation {self.name!r}; choose from {', '.join(ABLATIONS)}")
        self._drop_step_graph()
        return self

    def __exit__(self, *exc):
        for undo in reversed(self.undo):
            undo()
        self._drop_step_graph()

    def _uncompile(self, model, methods) -> None:
        """Put each (loss, method) of `model` back to its class's eager method (compile_model sets
        the compiled one on the instance)."""
        for loss, method in methods:
            obj = getattr(model, loss)
            saved = obj.__dict__.pop(method)
            self.undo.append(
                lambda obj=obj, method=method, saved=saved: setattr(obj, method, saved)
            )

    def _drop_step_graph(self) -> None:
        # a captured step graph replays the kernels it captured: with an ablation on or off, the
        # next step captures again (in the row's warm-up steps)
        graph = getattr(self.trainer, "step_graph", None)
        if graph is not None:
            graph.reset()


def _pos_embed_by_op(vit, x, h: int, w: int):
    """`interpolate_pos_encoding` with the bicubic resize done by F.interpolate itself on the
    positions (the `pos-embed-interpolate` ablation): the same values to within fp32 rounding."""
    if x.shape[1] - 1 == vit.pos_embed.shape[1] - 1 and w == h:
        return vit.pos_embed
    grid, size, scale_factor = vit.resize_target(h, w)
    pos = vit.pos_embed.float()
    maps = pos[:, 1:].reshape(1, grid, grid, -1).permute(0, 3, 1, 2)
    patches = bicubic_resize(maps, size, scale_factor, vit.interpolate_antialias)
    patches = patches.permute(0, 2, 3, 1).reshape(1, size[0] * size[1], -1)
    return torch.cat((pos[:, :1], patches), dim=1).to(x.dtype)


def parse_row(row: str) -> tuple[str, str, frozenset]:
    """(mode, backend, the row's `+` flags: "teacher", "mvue") of a row name."""
    spec, *flags = row.split("+")
    mode, backend = spec.split("-", 1)
    return mode, backend, frozenset(flags)


def teacher_sparse(trainer: Trainer, row: str) -> bool:
    """Whether the row's sparse phase runs the teacher's MLPs 2:4 (`+teacher`, or
    `sparsity.teacher=sparse`)."""
    _, backend, flags = parse_row(row)
    return backend != "dense" and ("teacher" in flags or trainer.cfg.sparsity.teacher == "sparse")


def wgrad_modules(trainer: Trainer, row: str) -> str | None:
    """The pattern of the student linears whose weight gradients run on 2:4 in the row (`+mvue`:
    all, `+mvue-fc2`: the second MLP linear alone, else the config's `sparsity.weight_grad` and
    `weight_grad_modules`); None: none."""
    _, backend, flags = parse_row(row)
    if backend == "dense":
        return None
    if "mvue-fc2" in flags:
        return FC2_ONLY
    if "mvue" in flags:
        return ALL_MODULES
    sp = trainer.cfg.sparsity
    return sp.weight_grad_modules if sp.weight_grad == "mvue24" else None


def wgrad_sparse(trainer: Trainer, row: str) -> bool:
    """Whether any of the row's student MLPs take their weight gradients on 2:4."""
    return wgrad_modules(trainer, row) is not None


def wgrad_share(trainer: Trainer, row: str) -> float:
    """The share of the student's converted linears whose weight gradient runs on 2:4 in the row (a
    ViT's fc1 and fc2 cost the same FLOPs, so it is also the share of their weight-gradient
    FLOPs)."""
    pattern = wgrad_modules(trainer, row)
    if pattern is None:
        return 0.0
    names = list(trainer.sparsity.selected_linears(trainer.model.student.backbone))
    match = name_matcher(pattern)
    return sum(map(match, names)) / max(len(names), 1)


def set_row(trainer: Trainer, row: str) -> tuple[str, str]:
    """Put the student (and with `+teacher` the teacher) in the row's phase and backend, with
    `+mvue` its weight gradients on 2:4; returns (mode, backend)."""
    mode, backend, _ = parse_row(row)
    student, teacher = trainer.model.student.backbone, trainer.model.teacher.backbone
    trainer.sparse_targets = [student, teacher]  # whatever the previous row made sparse goes dense
    trainer.enter_phase("dense")
    trainer.sparse_targets = [student, teacher] if teacher_sparse(trainer, row) else [student]
    if backend != "dense":
        trainer.sparsity.backend = backend  # the converter's next convert() uses both
        pattern = wgrad_modules(trainer, row)
        trainer.sparsity.weight_grad = "dense" if pattern is None else "mvue24"
        trainer.sparsity.weight_grad_modules = pattern or ALL_MODULES
        trainer.enter_phase("sparse")
    return mode, backend


def mode_rows(rows: list[str], mode: str) -> list[str]:
    """The rows timed in one compile mode: eager rows in the default mode only, compiled rows named
    after the mode."""
    if mode == "default":
        return list(rows)
    return [
        r.replace("compiled-", MODE_ROW_PREFIX[mode]) for r in rows if not r.startswith("eager")
    ]


def compile_then_heat(
    trainer: Trainer, batch, rows: list[str], warmup: int, seconds: float
) -> dict:
    """Every row's warm-up steps first (the compiles, during which the GPU idles and cools), then
    `seconds` of the first compiled row's steps: the timed rounds start on a GPU at the clock it
    holds under this load."""
    values = trainer.schedules.at(MID_TRAINING_STEP)
    for row in rows:
        set_row(trainer, row)
        for _ in range(warmup):
            trainer.train_step(batch, values)
    trainer.settle_checks()
    set_row(trainer, next((r for r in rows if not r.startswith("eager")), rows[0]))
    steps = heat(functools.partial(trainer.train_step, batch, values), seconds)
    trainer.settle_checks()
    return {"steps": steps, "seconds": seconds, "gpu_state": gpu_state()}


def in_place(dense_row: dict, row: dict) -> dict:
    """What the sparse phase changes in the GEMMs, from the two rows' kernel categories (ms per
    step)."""
    d, s = dense_row["profile"]["by_category_ms"], row["profile"]["by_category_ms"]
    removed = d.get("dense_gemm", 0.0) - s.get("dense_gemm", 0.0)
    added = s.get("sparse_gemm", 0.0) + s.get("prune_pack", 0.0)
    return {
        "dense_gemm_removed_ms": round(removed, 3),
        "sparse_gemm_ms": s.get("sparse_gemm", 0.0),
        "prune_pack_ms": s.get("prune_pack", 0.0),
        "in_place_speedup": round(removed / added, 3) if added else None,
        "share_of_dense_busy": round(removed / dense_row["profile"]["busy_ms"], 4),
    }


def ratio_baseline(rows: list[dict]) -> dict | None:
    """The row every ratio is against: `compiled-dense`, else the first dense row (`stepgraph-dense`
    where only that mode ran); None where the run timed no dense row, so that no sparse row is
    passed off as the baseline."""
    dense = [r for r in rows if is_dense_row(r["row"])]
    return next((r for r in dense if r["row"] == "compiled-dense"), dense[0] if dense else None)


def ratio_text(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.3f}x"


def mode_dense_row(rows: list[dict], row: dict, needs: str) -> dict | None:
    """The dense row of `row`'s compile mode (`compiled-dense` for `compiled-auto..., ablation`)
    that holds `needs`, or None where the run timed none."""
    name = dense_row_name(row["row"])
    return next((d for d in rows if d["row"] == name and needs in d), None)


def attach_gemms_2to4(rows: list[dict]) -> None:
    """Each profiled sparse row's `gemms_2to4` against its mode's profiled dense row; a run without
    that dense row (`--rows` of sparse rows alone) keeps its profiles and says why it has none."""
    for r in rows:
        if "profile" not in r or not r["sparse"]["student_gemms_2to4"]:
            continue
        dense = mode_dense_row(rows, r, "profile")
        if dense is None:
            print(
                f"  {r['row']}: no dense row of its mode in this run, so no in-place GEMM speed-up"
            )
        else:
            r["gemms_2to4"] = in_place(dense, r)


def merge_rounds(outs: list[dict]) -> dict:
    """One row from its rounds (`--rounds`: the rows take turns, so that each meets the GPU as warm
    as the others): the steps of every round together (median, min, max, times, per-step record),
    each round's median and GPU state in `rounds`, the profiles of the round that has them, the
    collections summed."""
    if len(outs) == 1:
        return outs[0]
    out = {
        k: v
        for o in outs
        for k, v in o.items()
        if k not in ("ms", "min_ms", "max_ms", "times_ms", "per_step")
    }
    times = [t for o in outs for t in o["times_ms"]]
    out.update(
        ms=statistics.median(times),
        min_ms=min(times),
        max_ms=max(times),
        times_ms=times,
        peak_gib=max(o["peak_gib"] for o in outs),
        per_step={k: [v for o in outs for v in o["per_step"][k]] for k in outs[0]["per_step"]},
        gc={
            "collections": {
                g: sum(o["gc"]["collections"][g] for o in outs) for g in ("gen0", "gen1", "gen2")
            },
            "ms": round(sum(o["gc"]["ms"] for o in outs), 3),
            "max_ms": max(o["gc"]["max_ms"] for o in outs),
        },
        rounds=[{"ms": o["ms"], "gpu_state": o.get("gpu_state")} for o in outs],
    )
    out.pop("gpu_state", None)
    return out


def run_row(trainer, batch, row, args, step_gc: StepGc, label=None, extras=True) -> dict:
    torch.cuda.reset_peak_memory_stats()
    mode = row.split("-", 1)[0]
    stance = "force_eager" if mode == "eager" else "default"
    steps = itertools.count(1)
    with torch.compiler.set_stance(stance):
        with (
            GcLog() as gc_log
        ):  # the row's steps collect as training's do (train.gc_period), and say when
            step_log = StepLog(gc_log)
            resolve = (
                trainer.checks.resolve_previous
            )  # where the step waits for the GPU (the previous step's flags)
            trainer.checks.resolve_previous = step_log.waiting(resolve)

            def after_step():
                step_gc.step(next(steps))
                step_log.mark()

            try:
                times = time_steps(trainer, batch, args.warmup, args.iters, after_step=after_step)
            finally:
                del (
                    trainer.checks.resolve_previous
                )  # the instance's wrapper: the class's method again
        out = {
            "row": label or row,
            "ms": statistics.median(times),
            "min_ms": min(times),
            "max_ms": max(times),
            "times_ms": [round(t, 2) for t in times],
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "gc": gc_log.summary(),
            "per_step": step_log.last(len(times)),
            "gpu_state": gpu_state(),
        }
        if args.profile and extras:
            out["profile"] = profile_steps(trainer, batch, args.profile)
        # a replayed graph's kernels name no host op
        if args.ledger and extras and trainer.step_graph is None:
            out["ledger"] = profile_ledger(
                trainer,
                batch,
                trainer.schedules.at(MID_TRAINING_STEP),
                args.ledger,
                mlp_dims(trainer),
                top=args.ledger_top,
            )
        if args.host_profile and extras:
            out["host_profile"] = host_profile(trainer, batch, args.host_profile)
        if args.stall_profile and extras:
            out["stalls"] = stall_profile(trainer, batch, args.stall_profile)
    print(f"  {out['row']}: {out['ms']:.1f} ms", flush=True)
    return out


def main() -> None:
    ap = build_parser()
    args = parse_command_line(ap)  # options and overrides in any order
    if not torch.cuda.is_available():
        sys.exit("bench_train_step.py needs a CUDA GPU")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1")
    if "step-graph" in args.compile_modes and args.warmup < 4:
        ap.error(
            "--compile-modes step-graph needs --warmup 4 or more (3 eager steps, then the capture)"
        )
    bad_algs.apply(args.bad_algs)
    device = torch.device("cuda")
    rows, compiled, heated, step_flop_counts = [], {}, {}, None
    for mode in args.compile_modes:
        step_graph = mode == "step-graph"
        cfg = load_config(
            args.config,
            [
                "data.dataset=digits",
                "train.compile=true",
                f"train.compile_mode={'default' if step_graph else mode}",
                f"train.cuda_graph={str(step_graph).lower()}",
                *args.overrides,
            ],
        )
        torch._dynamo.reset()  # compiled code of another mode must not be reused
        trainer = Trainer(cfg, Path("/tmp/bench_train_step"), DistContext(0, 1, 0, device))
        trainer.model.train()
        batch = synthetic_batch(cfg, device)
        compiled[mode] = trainer.compiled
        rows_here = mode_rows(args.rows, mode)
        # each mode's rows start from the clock the GPU holds under this load, not a cold one
        if args.heat_s:
            heated[mode] = compile_then_heat(trainer, batch, rows_here, args.warmup, args.heat_s)
        rounds: dict[
            str, list[dict]
        ] = {}  # row label -> its rounds, in the order the rows first ran
        with StepGc(cfg.train.gc_period) as step_gc:
            run = functools.partial(run_row, trainer, batch, args=args, step_gc=step_gc)

            def timed(row, label=None, extras=True):
                out = run(row, label=label, extras=extras)
                out["spec"] = row  # the row as set_row reads it (a label may say more)
                rounds.setdefault(out["row"], []).append(out)

            for turn in range(args.rounds):
                last = turn == args.rounds - 1  # profiles once, after the last timed round
                for row in rows_here:
                    set_row(trainer, row)
                    timed(row, extras=last)
                    if runs_ablations(row, args.ablate):
                        for name in args.ablations:
                            with _Ablation(trainer, name):
                                timed(row, label=f"{row}, {name}", extras=last)
                            timed(row, label=again_label(row, name), extras=False)
        rows += [merge_rounds(outs) for outs in rounds.values()]
        set_row(trainer, "eager-dense")
        step_flop_counts = step_flop_counts or count_step_flops(
            trainer, batch
        )  # every mode runs the same model
        mark_sparse_gemms(trainer, rows[-len(rounds) :])
        del trainer
        torch.cuda.empty_cache()
    base = ratio_baseline(rows)
    rate = gemm_rate_tflops(device)  # after the rows: the GPU as warm as they left it
    for r in rows:
        r["vs_compiled_dense"] = round(base["ms"] / r["ms"], 4) if base else None
        changes_work = r["row"].rpartition(", ")[2] in ABLATIONS_CHANGING_WORK
        r["mfu"] = (
            mfu(
                step_flop_counts,
                r["ms"],
                rate,
                r["sparse"]["student_gemms_2to4"],
                r["sparse"]["teacher"],
            )
            if step_flop_counts and not changes_work
            else None
        )
    attach_gemms_2to4(rows)
    finish_ledgers(rows)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "config": args.config,
        "cusparselt_library": _cusparselt_library(),
        "overrides": args.overrides,
        "images_per_step": cfg.train.batch_size_per_gpu,
        "step_flops": step_flop_counts,
        "gemm_rate_tflops": round(rate, 1),
        "rows": rows,
        "compiled": compiled,
        "heated": heated,
        "sparse_decisions": sparse_decisions(),
    }
    result["round_stats"] = round_stats([result])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print_table(result)


def count_step_flops(trainer: Trainer, batch) -> dict:
    """`step_flops` of one eager dense step, launched op by op also where the trainer replays a step
    graph."""
    graph, trainer.step_graph = trainer.step_graph, None
    try:
        return step_flops(trainer, batch, trainer.schedules.at(MID_TRAINING_STEP))
    finally:
        trainer.step_graph = graph


def mark_sparse_gemms(trainer: Trainer, rows: list[dict]) -> None:
    """Each row's `sparse`: how many of a student MLP linear's three GEMMs ran 2:4 (forward, and the
    input gradient where the mask is transposable) and whether the teacher's did, for the MFU's
    executed FLOPs."""
    per_linear = 2 if is_transposable(trainer.cfg.sparsity.pruning) else 1
    for r in rows:
        dense, wgrad = parse_row(r["spec"])[1] == "dense", wgrad_share(trainer, r["spec"])
        r["sparse"] = {
            "student_gemms_2to4": 0 if dense else per_linear + wgrad,
            "teacher": teacher_sparse(trainer, r["spec"]),
            "weight_grad": wgrad,
        }


def mlp_dims(trainer: Trainer) -> tuple[int, int]:
    """(embed, hidden) of the student's MLP linears: the shapes the ledger knows MLP GEMMs by."""
    fc1 = trainer.model.student.backbone.blocks[0].mlp.fc1
    return fc1.in_features, fc1.out_features


def finish_ledgers(rows: list[dict]) -> None:
    """The rows' ledgers against their merged step times (idle = step - busy); the dense rows'
    projections for each coverage set; each sparse row's in-place speed-up on the GEMMs it covers,
    against its mode's dense row."""
    for r in rows:
        if "ledger" not in r:
            continue
        led = set_step_time(r["ledger"], r["ms"])
        if not r["sparse"]["student_gemms_2to4"]:
            led["projections"] = projections(led)
            continue
        dense = mode_dense_row(rows, r, "ledger")
        if dense is not None:
            covered = COVERAGE[1][1] if r["sparse"]["teacher"] else COVERAGE[0][1]
            if r["sparse"].get("weight_grad"):
                covered = covered + ("student_mlp_weight_grad",)
            led["in_place"] = ledger_in_place(dense["ledger"], led, covered)


def _cusparselt_library() -> dict:
    """Which cuSPARSELt the sparse rows ran: its version and file (a process started with LD_PRELOAD
    runs another)."""
    from sparsity.backends.cusparselt.library import loaded_library_path, version

    try:
        return {"version": version(), "file": bad_algs.short_library_path(loaded_library_path())}
    except Exception as e:  # noqa: BLE001 - no cuSPARSELt here: the sparse rows said so already
        return {"error": repr(e)}


def sparse_decisions() -> dict:
    """What the sparse backends saw and chose: auto's per-shape decisions, cuSPARSELt's plans."""
    from sparsity.backends import get_backend

    out = {}
    for name in ("cusparselt", "auto"):
        try:
            out[name] = get_backend(name).describe()
        except Exception as e:  # noqa: BLE001
            out[name] = repr(e)
    return out


def print_table(result: dict) -> None:
    print(
        f"\n{result['gpu']}, {result['config']} {' '.join(result['overrides'])}, "
        f"batch {result['images_per_step']}/GPU"
    )
    print(
        f"{'row':44s}{'ms/step':>9s}{'min':>8s}{'max':>8s}{'GiB':>6s}{'vs compiled dense':>19s}"
        f"{'gc (gen2, max ms)':>19s}"
    )
    for r in result["rows"]:
        g = r.get("gc", {})
        gen2, longest = g.get("collections", {}).get("gen2", 0), g.get("max_ms", 0.0)
        print(
            f"{r['row']:44s}{r['ms']:9.1f}{r['min_ms']:8.1f}{r['max_ms']:8.1f}{r['peak_gib']:6.1f}"
            f"{ratio_text(r['vs_compiled_dense']):>19s}{gen2:>9d}, {longest:7.1f}"
        )
    if result.get("round_stats"):
        print("\n".join(format_round_stats(result["round_stats"])))
    for r in result["rows"]:
        if "profile" in r:
            p = r["profile"]
            print(
                f"{r['row']}: busy {p['busy_ms']} ms, idle {p['idle_ms']}, {p['kernels_per_step']} "
                f"kernels; "
                f"{p['by_category_ms']}"
            )
        if "gemms_2to4" in r:
            print(f"  2:4 GEMMs in place: {r['gemms_2to4']}")
        m = r["mfu"]
        if m:
            print(
                f"  {r['row']}: MFU {m['nominal_mfu']:.3f} nominal ({m['nominal_tflop']} TFLOP), "
                f"{m['executed_mfu']:.3f} executed ({m['executed_tflop']} TFLOP) of "
                f"{m['gemm_rate_tflops']} TFLOP/s"
            )
        if "ledger" in r:
            print_ledger(r)
        if "stalls" in r:
            st = r["stalls"]
            calls = ", ".join(
                f"{c['name']} {c['calls']:g}x {c['ms']} ms" for c in st["runtime_calls"][:6]
            )
            print(
                f"  {r['row']} under host profiling: idle {st['idle_ms']} of {st['span_ms']} ms; "
                f"API calls: {calls}"
            )
            for g in st["idle_gaps"][:5]:
                print(
                    f"    gap {g['gap_ms']} ms at {g['at_ms']} ms before "
                    f"{g['before_kernel'][:40]}: "
                    f"{g['runtime_calls'][:3]} {g['host_events'][:3]}"
                )


def print_ledger(r: dict) -> None:
    led = r["ledger"]
    classes = ", ".join(
        f"{c} {ms:.1f}" for c, ms in sorted(led["ms"].items(), key=lambda kv: -kv[1]) if ms
    )
    print(f"  ledger (ms/step): {classes}; busy {led['busy_ms']}, idle {led['idle_ms']}")
    for p in led.get("projections", []):
        ratios = ", ".join(f"{s} -> {v:.3f}x" for s, v in p["step_ratio"].items())
        ms = p["covered_ms"] + p["removed_ms"]
        print(f"    {p['coverage']:18s} {ms:6.1f} ms ({p['share_of_step']:.1%}): {ratios}")
    if "in_place" in led:
        print(f"    in place: {led['in_place']}")


if __name__ == "__main__":
    main()
