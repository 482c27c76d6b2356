"""Read one training run directory (as written by `train.py`) into a `RunSummary`: its schedule, how
far it got, how long each phase took, and its evaluation.

The files and their readers are `rundir`'s (config.yaml, metrics.jsonl, checkpoints, status.json,
teacher_backbone.pth, eval_linear.json and the baselines' results: the untrained network and raw
pixels). Anything may be missing or cut short: the summary then says so in `status` instead of
raising, so a table of many runs always shows every run.
"""

import dataclasses
import math
import os
import statistics
from dataclasses import dataclass, field, fields
from pathlib import Path

from configs import ConfigError, load_config
from configs.eval_schema import PROTOCOL_PREFIX, protocol_suffix
from rundir.json_files import read_json
from rundir.layout import (
    CONFIG,
    METRICS,
    PRUNED_MLP_SUFFIX,
    TEACHER,
    baseline_results,
    eval_result_name,
    is_run_dir,
)
from rundir.run_dir import RunDir
from rundir.status import FAILED as RUN_FAILED, FINISHED as RUN_FINISHED, PREEMPTED

from .eval_records import (  # noqa: F401  (re-exported: the table's modules read them here)
    COMPLETE,
    FAILED,
    KNN_SHOWN_K,
    MISSING,
    PARTIAL,
    STALE,
    UNREADABLE,
    EvalRecord,
    EvalResults,
    as_float,
    find_probe,
    probe_arguments,
    read_eval_record,
    short_text,
    shown_k,
    stale_reason,
)

# The evaluation side lives in eval_records.py; its names are re-exported, since the table's modules
# read them here.

# a copy of another run directory of the table (the same run id): never a second seed
DUPLICATE = "duplicate"
# total first, then the terms ssl_meta_arch logs; any other "*_loss" key found follows these
LOSS_TERMS = ("loss", "dino_local_crops_loss", "dino_global_crops_loss", "koleo_loss", "ibot_loss")


# what a study's driver records about each run it trained (scripts/experiments/study_runs.sh)
STUDY_FILE = "study.json"
STUDY_ROLES = ("screening", "confirmatory")


@dataclass(kw_only=True)
class RunSummary(EvalResults):
    """A run directory read back; its evaluation's numbers are the inherited `EvalResults`
    fields."""

    name: str
    path: str
    train_status: str = MISSING  # complete | partial | failed | missing | unreadable
    reason: str = ""  # why a run is failed / partial / unreadable
    eval_status: str = MISSING  # complete | missing | unreadable
    eval_reason: str = ""
    # schedule (from config.yaml)
    arch: str = ""
    patch_size: int | None = None
    dataset: str = ""
    data_root: str = ""
    sparse_fraction: float | None = None
    total_steps: int | None = None
    sparse_steps: int | None = (
        None  # the step of the switch to dense: the steps before it are sparse ...
    )
    dense_warmup_steps: int = 0  # ... but these first ones (sparsity.dense_warmup_fraction)
    global_batch: int | None = None
    processes: int | None = None  # data-parallel processes (GPUs) the run trained on
    seed: int | None = None
    run_id: str = (
        ""  # status.json's: made at the run's fresh start, kept by every copy of the directory
    )
    # every key of the resolved config, flattened ({"student.arch": "vit_small", ...}); None if
    # unreadable
    config: dict | None = field(default=None, repr=False)
    # progress and timing (from metrics.jsonl and the checkpoints)
    steps_done: int = 0
    time_s: float | None = (
        None  # summed step time of the logged windows (excludes start-up and evaluation)
    )
    sparse_time_s: float | None = None
    dense_time_s: float | None = None
    timed_steps: int = 0  # steps covered by time_s
    images_per_s: float | None = None  # over all timed steps, time-weighted
    # per phase: median of the logged windows' images/s, without each phase's first window after a
    # (re)start (torch.compile and warm-up; the dense phase recompiles), so the phases' steady
    # speeds compare
    sparse_images_per_s: float | None = None
    dense_images_per_s: float | None = None
    # where it trained (run_info.json: "cuda:0", "NVIDIA H200"; "" where not recorded) and the most
    # memory its GPU had in use outside the run's allocator at a logged window (MB; None where the
    # run did not log it): whether it had the GPU to itself (speed_columns.py)
    device: str = ""
    device_name: str = ""
    data_fingerprint: str = (
        ""  # run_info.json's: which images it trained on ("" where not recorded)
    )
    gpu_mem_outside_mb: float | None = None
    # a run that chose settings, kept out of every mean: recorded by the study's driver (STUDY_FILE)
    # or named by the table's maker (make_table.py --screening)
    screening: bool = False
    study_role: str = ""  # STUDY_FILE's role ("" where the run has none)
    # the sparse recipe the table's other sparse runs are read against (make_table.py --reference)
    reference: bool = False
    final_loss: float | None = None
    loss_terms: dict = field(
        default_factory=dict, repr=False
    )  # {term: [(step, value)]}, LOSS_TERMS order
    # evaluation (from eval_linear.json; top1, top5, knn, best_C, solver, n_val from EvalResults)
    eval_seconds: float | None = None
    baselines: dict = field(
        default_factory=dict
    )  # {"random_init" | "pixels": EvalRecord}, those found
    # the final teacher probed with its MLPs pruned 2:4 (eval_linear.py prune_mlp=true), complete and
    # of the current teacher, else None: for a dense run, its one-shot floor (reporting/floor.py)
    pruned_once: EvalRecord | None = None

    @property
    def loss_curve(self) -> list:
        """[(step, total loss)]"""
        return self.loss_terms.get("loss", [])

    @property
    def dense_steps(self) -> int | None:
        """The steps after the switch (the dense warm-up's are not among them)."""
        if self.total_steps is None or self.sparse_steps is None:
            return None
        return self.total_steps - self.sparse_steps

    @property
    def steady_seconds_per_step(self) -> float | None:
        """Seconds a step at each phase's steady speed (its median images/s), weighted by the steps
        done in each phase. The summed window times also hold compilation, whose length depends on
        what the compiler's cache held at the start, not on the schedule: a run with a warm cache
        would look faster than its dense reference by a minute of compilation. None where a phase
        with steps done has no steady speed."""
        if not self.steps_done or not self.global_batch:
            return None
        sparse = 0
        if self.sparse_steps is not None:
            sparse = max(0, min(self.steps_done, self.sparse_steps) - self.dense_warmup_steps)
        seconds = 0.0
        for steps, rate in (
            (sparse, self.sparse_images_per_s),
            (self.steps_done - sparse, self.dense_images_per_s),
        ):
            if steps:
                if not rate:
                    return None
                seconds += steps * self.global_batch / rate
        return seconds / self.steps_done

    @property
    def status(self) -> str:
        """One human-readable word or phrase: complete, no eval, partial (step x of y), failed
        (reason), ..."""
        if self.train_status == COMPLETE:
            if self.eval_status == COMPLETE:
                return COMPLETE
            if self.eval_status == STALE:
                return f"eval stale ({self.eval_reason})"
            if self.eval_status == MISSING:
                return f"no eval ({self.eval_reason})" if self.eval_reason else "no eval"
            return f"eval unreadable ({self.eval_reason})"
        if self.train_status == PARTIAL:
            detail = f"step {self.steps_done} of {self.total_steps}"
            return f"partial ({detail}{', ' + self.reason if self.reason else ''})"
        return f"{self.train_status} ({self.reason})" if self.reason else self.train_status


def _read_config(run: RunSummary, run_dir: RunDir) -> bool:
    path = run_dir.config_file
    if not path.is_file():
        there = os.path.lexists(path)  # a FIFO, a directory or a dangling link: never opened
        run.train_status, run.reason = (
            UNREADABLE,
            f"{CONFIG} is not a regular file" if there else f"no {CONFIG}",
        )
        return False
    try:
        cfg = load_config(path)
    except (
        ConfigError,
        OSError,
        ValueError,
    ) as e:  # the message without the machine's path to the file
        message = str(e).replace(f"{path}: ", "").replace(str(path), CONFIG)
        run.train_status, run.reason = UNREADABLE, short_text(f"{CONFIG}: {message}")
        return False
    run.arch, run.patch_size, run.dataset = (
        cfg.student.arch,
        cfg.student.patch_size,
        cfg.data.dataset,
    )
    run.data_root = cfg.data.root
    run.sparse_fraction = cfg.sparsity.sparse_fraction
    run.total_steps, run.sparse_steps = cfg.total_steps, cfg.sparse_steps
    run.dense_warmup_steps = cfg.dense_warmup_steps
    run.processes, per_process = _batch_layout(run_dir, cfg.train.batch_size_per_gpu)
    run.global_batch = run.processes * per_process
    run.seed = cfg.train.seed
    run.config = flatten_config(dataclasses.asdict(cfg))
    info = run_dir.read_run_info()
    run.device, run.device_name, run.data_fingerprint = (
        info.get(k) or "" for k in ("device", "device_name", "data_fingerprint")
    )
    return _read_study_role(run, run_dir)


def _read_study_role(run: RunSummary, run_dir: RunDir) -> bool:
    """The role its study gave the run (STUDY_FILE, written by scripts/experiments/study_runs.sh):
    a screening run is kept out of every mean. A file there that does not say one of STUDY_ROLES
    makes the run unreadable: a role the table cannot read could let a screening run into a mean."""
    path = run_dir.path / STUDY_FILE
    if not os.path.lexists(path):
        return True
    role = (read_json(path) or {}).get("role")
    if role not in STUDY_ROLES:
        run.train_status = UNREADABLE
        run.reason = f"{STUDY_FILE}: no role among {', '.join(STUDY_ROLES)}"
        return False
    run.study_role, run.screening = role, role == "screening"
    return True


def flatten_config(node: dict, prefix: str = "") -> dict:
    """{"section.key": value} of a nested config; lists stay values."""
    out = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        out.update(flatten_config(value, name + ".") if isinstance(value, dict) else {name: value})
    return out


def _batch_layout(run_dir: RunDir, batch_size_per_gpu: int) -> tuple[int, int]:
    """(processes, per-GPU batch) of the run: its images per step are their product (metrics'
    images/s are global). From the newest readable checkpoint, memory-mapped so a ViT-L checkpoint
    costs no more than its header; else from run_info.json (written at every start, and kept where
    checkpoints are not, as in committed results); else the config's per-GPU batch on one
    process."""
    checkpoints = run_dir.checkpoints()
    if checkpoints:
        # only where there are checkpoints to read: tables of committed runs and --help go without
        # it
        import torch
    for _, path in reversed(checkpoints):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            return int(state["world_size"]), int(
                state.get("batch_size_per_gpu", batch_size_per_gpu)
            )
        except Exception:  # noqa: BLE001 - an unreadable checkpoint: try the previous one
            continue
    info = run_dir.read_run_info()
    if info.get("world_size") and info.get("batch_size_per_gpu"):
        return info["world_size"], info["batch_size_per_gpu"]
    return 1, batch_size_per_gpu  # missing, unreadable or older: the config alone


def _read_metrics(run: RunSummary, run_dir: RunDir) -> None:
    """Progress, loss curve and phase times. Each record's images/s covers the steps since the
    previous record, so a window took steps * global_batch / images_per_s seconds; a window
    straddling the sparse->dense switch is split between the phases by its step count."""
    records = run_dir.read_metrics()
    checkpoint_steps = [step for step, _ in run_dir.checkpoints()]
    run.steps_done = max([r["step"] for r in records] + checkpoint_steps + [0])
    terms = list(LOSS_TERMS) + sorted(
        {k for r in records for k in r if k.endswith("_loss")} - set(LOSS_TERMS)
    )
    for term in terms:
        curve = [(r["step"], v) for r in records if (v := as_float(r.get(term))) is not None]
        if curve:
            run.loss_terms[term] = curve
    if run.loss_curve:
        run.final_loss = run.loss_curve[-1][1]
    run.sparse_images_per_s, run.dense_images_per_s = _phase_rates(
        records, run.sparse_steps, run_dir.read_status().resumed_at
    )
    outside = [v for r in records if (v := as_float(r.get("gpu_mem_outside_mb"))) is not None]
    run.gpu_mem_outside_mb = max(outside) if outside else None
    if not run.global_batch:
        return
    sparse_time = dense_time = 0.0
    timed = images = sparse_images = 0
    previous_end = 0  # first step not yet covered by a window
    for record in records:
        end = record["step"]
        rate = as_float(record.get("images_per_s"))
        steps = end - previous_end
        previous_end = end
        # "nan"/"inf" logged: no time
        if not rate or not math.isfinite(rate) or rate <= 0 or steps <= 0:
            continue
        batch = (
            record.get("global_batch") or run.global_batch
        )  # a logged batch size wins over the inferred one
        seconds = steps * batch / rate
        start = (
            end - steps
        )  # the window's steps: start .. end - 1; the sparse ones: dense_warmup_steps .. switch - 1
        sparse_part = (
            max(0, min(end, run.sparse_steps) - max(start, run.dense_warmup_steps))
            if run.sparse_steps is not None
            else 0
        )
        images += steps * batch
        sparse_images += sparse_part * batch
        sparse_time += seconds * sparse_part / steps
        dense_time += seconds * (steps - sparse_part) / steps
        timed += steps
    if timed:
        run.sparse_time_s, run.dense_time_s = sparse_time, dense_time
        run.time_s, run.timed_steps = sparse_time + dense_time, timed
        run.images_per_s = images / run.time_s


def _phase_rates(records: list[dict], sparse_steps: int | None, restarts: list[int]) -> tuple:
    """(sparse, dense) median images/s over each phase's logged windows, leaving out the first
    window of a phase and the first window after each restart (both include compilation and
    warm-up). None where nothing is left."""
    rates: dict[str, list[float]] = {"sparse": [], "dense": []}
    previous_phase, previous_end = None, 0
    for record in records:
        phase = record.get("phase")
        if phase not in rates:  # older logs: the phase from the schedule
            phase = "sparse" if sparse_steps and record["step"] <= sparse_steps else "dense"
        restarted = any(previous_end <= step < record["step"] for step in restarts)
        rate = as_float(record.get("images_per_s"))
        if phase == previous_phase and not restarted and rate and rate > 0 and math.isfinite(rate):
            rates[phase].append(rate)
        previous_phase, previous_end = phase, record["step"]
    return tuple(statistics.median(rates[p]) if rates[p] else None for p in ("sparse", "dense"))


def _training_status(run: RunSummary, run_dir: RunDir) -> None:
    """Complete when trained to the end with the teacher exported (the export itself, or
    status.json's "finished", written after it: published results carry no weights); otherwise what
    status.json (or, for older runs, their log) recorded: failed with its reason, or partial
    (preempted, or still running / killed)."""
    finished = run.total_steps is not None and run.steps_done >= run.total_steps
    status = run_dir.read_status()
    run.run_id = status.run_id  # what a copy of the directory keeps: `mark_duplicates`
    if finished and (run_dir.teacher.is_file() or status.state == RUN_FINISHED):
        run.train_status = COMPLETE
        return
    if status.state == RUN_FAILED:
        run.train_status, run.reason = FAILED, short_text(status.reason)
    elif run.steps_done == 0 and not run_dir.has_metrics():
        run.train_status, run.reason = PARTIAL, "no steps logged"
    elif run.steps_done == 0:  # the file is there, yet not one line of it reads as a step
        run.train_status, run.reason = PARTIAL, f"no readable step line in {METRICS}"
    else:
        run.train_status = PARTIAL
        if finished:
            run.reason = f"no {TEACHER}"
        elif status.state == PREEMPTED:
            run.reason = "preempted"


def _other_protocols(run_dir: RunDir, data_suffix: str) -> str:
    """Why a run without the default protocol's record may still have probes: their names, and how
    to see them."""
    others = sorted(
        p.name
        for p in run_dir.path.glob(eval_result_name(False, f"{data_suffix}_{PROTOCOL_PREFIX}*"))
    )
    if not others:
        return ""
    return (
        f"no probe under the default protocol; under others: {', '.join(others[:3])} "
        f"(make_table.py --eval-arg "
        "with a probe's settings tabulates it)"
    )


def _read_eval(run: RunSummary, run_dir: RunDir, eval_label: str = "", probe=None) -> None:
    # the record of the probe asked, found by its settings (as the launcher's done)
    if probe is not None:
        own = find_probe(run_dir.path, probe, stale_too=True) or EvalRecord(
            path=str(run_dir.eval_result()),
            status=MISSING,
            reason=f"no readable record of the probe asked "
            f"({' '.join(probe_arguments(probe)) or 'default'})",
        )
    else:
        data_suffix = f"_data_{eval_label}" if eval_label else ""
        own = read_eval_record(run_dir.eval_result(suffix=data_suffix), other_data=bool(eval_label))
        if own.status == MISSING:
            own.reason = _other_protocols(run_dir, data_suffix)
    if own.status == COMPLETE and (reason := stale_reason(own, run_dir.path)):
        own = EvalRecord(
            path=own.path, status=STALE, reason=reason
        )  # its numbers are never shown as the run's
    run.eval_status, run.eval_reason, run.eval_seconds = own.status, own.reason, own.seconds
    for f in fields(EvalResults):
        setattr(run, f.name, getattr(own, f.name))
    changed = protocol_suffix(probe) if probe is not None else ""
    for key, names in baseline_results(changed).items():  # under the probe's protocol
        for name in names:
            record = read_eval_record(run_dir.path / name)
            if record.status == COMPLETE:
                run.baselines[key] = record
                break
    if probe is None and not eval_label:
        run.pruned_once = _pruned_once(run_dir)


def _pruned_once(run_dir: RunDir) -> EvalRecord | None:
    """The record of the final teacher probed with its MLPs pruned 2:4 under the default protocol,
    complete and of the current teacher: the linear probe's (with its k-NN), else a k-NN-only
    probe's (top-1 None); None where neither is there."""
    for knn_only in (False, True):
        record = read_eval_record(run_dir.eval_result(knn_only, suffix=PRUNED_MLP_SUFFIX))
        if record.status == COMPLETE and not stale_reason(record, run_dir.path):
            return record
    return None


def read_run(
    run_dir: Path, name: str | None = None, eval_label: str = "", probe=None
) -> RunSummary:
    """Everything the tables need about one run directory; never raises for a damaged or absent run.
    `eval_label`: the probe on other data to read (`eval_linear_data_<label>.json`) instead of the
    run's own `eval_linear.json`; `probe` (an `EvalConfig`): the record of the probe run with those
    settings, whatever its name (`eval_records.find_probe`)."""
    run_dir = RunDir(run_dir)
    run = RunSummary(name=name or run_dir.path.name, path=str(run_dir))
    if not run_dir.path.is_dir():
        run.train_status, run.reason = MISSING, "no run directory"
        return run
    if not _read_config(run, run_dir):
        return run
    _read_metrics(run, run_dir)
    _training_status(run, run_dir)
    _read_eval(run, run_dir, eval_label, probe)
    return run


def mark_duplicates(runs: list[RunSummary]) -> list[RunSummary]:
    """A run directory copied (or restored twice) carries its original's run id: the first by name
    stays, every other copy becomes a `DUPLICATE` row naming it, so that one training run is never
    averaged as two seeds. Runs written before run ids existed carry none and are not compared."""
    first: dict[str, RunSummary] = {}
    for run in sorted(runs, key=lambda r: (r.name, r.path)):
        if not run.run_id:
            continue
        original = first.setdefault(run.run_id, run)
        if original is not run:
            run.train_status = DUPLICATE
            run.reason = f"a copy of {original.name} (run id {run.run_id}): counted once"
    return runs


def find_run_dirs(paths: list[Path], max_depth: int = 3) -> list[Path]:
    """Run directories among `paths`: each path is a run, or a folder holding runs (searched
    `max_depth` deep). A path that does not exist is kept, so it shows as a missing run rather than
    vanishing."""
    found: list[Path] = []

    def walk(path: Path, depth: int) -> None:
        if is_run_dir(path):
            found.append(path)
        elif depth < max_depth:
            for child in sorted(p for p in path.iterdir() if p.is_dir()):
                walk(child, depth + 1)

    for path in map(Path, paths):
        if not path.exists() or is_run_dir(path):
            found.append(path)
            continue
        before = len(found)
        walk(path, 0)
        if len(found) == before:
            raise FileNotFoundError(
                f"{path}: neither a run directory (no config.yaml or metrics.jsonl) nor a "
                f"folder containing runs"
            )
    unique: dict[Path, Path] = {}
    for (
        path
    ) in found:  # the same run named twice (e.g. as itself and through its parent) is read once
        unique.setdefault(path.resolve(), path)
    return list(unique.values())
