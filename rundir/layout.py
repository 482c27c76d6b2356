"""The run directory's layout: the names of its files and folders, and the writers of its small
records.

A run directory (`train.py --output-dir`) holds:

    config.yaml                     the resolved config (rewritten at each (re)start; resuming requires the same one)
    run_info.json                   the start-up summary of the latest (re)start (`progress.run_info`)
    status.json                     what the run is doing or how it ended: running | finished | preempted | failed,
                                    at which step, why, and the steps it was resumed at (`rundir.status`)
    metrics.jsonl                   one JSON object per logged step, rank 0 (`rundir.metrics`; `step` = steps done)
    sparsity_masks.jsonl            per logged step, each 2:4 layer's mask flip rate, pruned share of |W| and
                                    gradient-to-weight ratio of the pruned entries (`training.sparsity_monitor`)
    log.txt                         the log of every (re)start, for people (read only for runs older than status.json)
    sparsity_decisions.json         what the sparse backends decided by timing (`sparsity.decisions()`: auto's choice
                                    per GEMM shape, cuSPARSELt algorithms, weight-gradient path), rank 0
    checkpoints/step_XXXXXXXX.pt    resumable checkpoints (+ `.sha256`; `.corrupt` once set aside as unreadable)
    eval/step_XXXXXXXX/teacher_backbone.pth   the periodic teacher exports
    teacher_backbone.pth            the final teacher, once trained to the end
    student_backbone.pth            the final student backbone as well, with train.export_student=true (probe it with
                                    eval_linear.py checkpoint=<run>/student_backbone.pth)
    eval_linear.json                its linear probe (`eval_linear.py`); the baselines in eval_linear_<name>.json
    jobs.json                       the Slurm launcher's job record (`slurm/sweep.py`), for launched runs
    .lock                           held (flock) by the training process of rank 0 while it runs (`rundir.lock`),
                                    whatever the command (a finished run, `train.resume=false`), and by eval_linear.py
                                    while it writes here: see `rundir.guard`

Steps are counted as steps done everywhere: a checkpoint's number, the teacher export's and status's
`step`, and (since metrics format 2) a metrics line's `step`; a run's last line says `"step":
total_steps`. Lines written before carry no `format` key and counted from 0;
`rundir.metrics.steps_done` reads both, so older run directories stay readable (`results/` holds
some), and so does their status, inferred from `log.txt` where no `status.json` exists.

Torch-free: the tables (`reporting`) and `slurm/launch.py status` read run directories without
importing torch. Every write is atomic (`rundir.atomic`), except the metrics line appended per
logged step (a line cut by a kill mid-write is skipped by the readers and dropped on resume).
"""

import json
import re
from pathlib import Path

from . import compressed
from .atomic import atomic_write_text
from .json_files import read_json
from .typed_records import RUN_INFO_FIELDS, UnreadableRecord, checked

CONFIG = "config.yaml"
RUN_INFO = "run_info.json"
STATUS = "status.json"
METRICS = "metrics.jsonl"
# per-layer mask statistics, one line per logged step (like metrics.jsonl)
SPARSITY_MASKS = "sparsity_masks.jsonl"
LOG = "log.txt"
CHECKPOINTS = "checkpoints"
TEACHER = "teacher_backbone.pth"
STUDENT = "student_backbone.pth"  # the final student backbone, with train.export_student=true
SPARSITY_DECISIONS = "sparsity_decisions.json"  # what the sparse backends decided by timing
EVAL_DIR = "eval"
LOCK = ".lock"

CHECKPOINT_NAME = re.compile(r"^step_(\d{8})\.pt$")
CORRUPT_SUFFIX = (
    ".corrupt"  # an unreadable checkpoint set aside: out of the rotation, never deleted
)


def eval_result_name(knn_only: bool = False, suffix: str = "") -> str:
    """An eval_linear.py result file: `eval_linear<suffix>.json`, or `eval_knn<suffix>.json` for a
    k-NN-only one (suffix: a baseline's, or `_step_XXXXXXXX` for another checkpoint than the final
    teacher)."""
    return f"{'eval_knn' if knn_only else 'eval_linear'}{suffix}.json"


def is_eval_result_name(name: str) -> bool:
    """Whether `name` is one of the names `eval_result_name` gives."""
    return name.startswith(("eval_linear", "eval_knn")) and name.endswith(".json")


EVAL_RESULT = eval_result_name()  # the final teacher's linear probe: what the tables read
# the suffixes of a probe with the MLPs the other way than the run's last step ran them
# (evaluation/mlp_pruning.py): pruned 2:4 after a dense end, dense after a sparse one
PRUNED_MLP_SUFFIX, DENSE_MLP_SUFFIX = "_pruned_mlp", "_dense_mlp"
BASELINE_SUFFIXES = {
    "random_init": "_random_init",
    "pixels": "_pixels",
}  # the untrained network, raw pixels


def baseline_results(suffix: str = "") -> dict[str, tuple[str, str]]:
    """Baseline key -> its result files, first found wins; `suffix`: a probe protocol's
    (`_protocol_<hash>`)."""
    return {
        key: (eval_result_name(False, own + suffix), eval_result_name(True, own + suffix))
        for key, own in BASELINE_SUFFIXES.items()
    }


BASELINE_RESULTS = baseline_results()  # under the default protocol


def is_run_dir(path: Path) -> bool:
    return (Path(path) / CONFIG).is_file() or compressed.exists(Path(path) / METRICS)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}.pt"


def checkpoint_step(path: Path, suffix: str = "") -> int | None:
    """The step of a checkpoint file name (`step_XXXXXXXX.pt` + `suffix`), None for anything else
    (digests, `.tmp`, strays, and `.corrupt` ones unless that is the suffix asked for)."""
    name = Path(path).name
    if suffix:
        if not name.endswith(suffix):
            return None
        name = name[: -len(suffix)]
    match = CHECKPOINT_NAME.match(name)
    return int(match.group(1)) if match else None


def list_checkpoints(directory: Path, suffix: str = "") -> list[tuple[int, Path]]:
    """(step, path) of the checkpoints in a checkpoints folder, oldest first; [] if there is no such
    folder. `suffix=CORRUPT_SUFFIX`: those set aside as unreadable instead. Only regular files (or
    links to them): a FIFO or a device named like a checkpoint is none, since opening it would block
    its reader."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(
        (step, p)
        for p in directory.iterdir()
        if (step := checkpoint_step(p, suffix)) is not None and p.is_file()
    )


def newest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(checkpoint_dir(run_dir))
    return found[-1] if found else None


def teacher_export_path(run_dir: Path, step: int) -> Path:
    """Where the teacher of `step` is exported during training (the final one is
    `<run>/teacher_backbone.pth`)."""
    return Path(run_dir) / EVAL_DIR / f"step_{step:08d}" / TEACHER


# ----------------------------------------------------------------- the run's small records
def write_config(run_dir: Path, yaml_text: str) -> None:
    atomic_write_text(Path(run_dir) / CONFIG, yaml_text)


def write_run_info(run_dir: Path, info: dict) -> None:
    atomic_write_text(Path(run_dir) / RUN_INFO, json.dumps(info, indent=1) + "\n")


def read_run_info(run_dir: Path) -> dict:
    """run_info.json with its typed fields checked; {} where it is absent or unreadable (a field of
    the wrong type included: the readers then go by the config alone, as for a run that never wrote
    one)."""
    try:
        return checked(read_json(Path(run_dir) / RUN_INFO), RUN_INFO_FIELDS, RUN_INFO)
    except UnreadableRecord:
        return {}


def write_sparsity_decisions(run_dir: Path, decisions: dict, unless: str = "") -> str:
    """sparsity_decisions.json, unless its text would be `unless` (what was last written); returns
    the text."""
    text = json.dumps(decisions, indent=1, default=str) + "\n"
    if text != unless:
        atomic_write_text(Path(run_dir) / SPARSITY_DECISIONS, text)
    return text


# room for the longest path a run writes inside its directory (an export's digest, a probe record
# with suffixes): what a run directory's name is checked with (guard.resolve_run_dir)
RUN_FILE_ROOM = Path("eval", "step_00000000", "x" * 80)
