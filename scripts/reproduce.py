"""Reproduce the sparse-then-dense study end to end on the embedded default (a CPU is enough):

    python scripts/reproduce.py [--runs-dir runs/default] [--out results/default] [--fractions 0,0.4,...]
                                [--dry-run] [key=value ...] [--eval key=value ...]

Trains the seven schedules of the published table (2:4-sparse for the first 0, 40, 60, 70, 80, 90, 100% of the
steps, then dense) one after the other with `train.py`, evaluates each with `eval_linear.py` (linear probe + k-NN),
then writes the table, CSV, summary and plots with `scripts/make_table.py` into --out.

Rerunning is cheap: finished runs are skipped, interrupted ones resume from their newest checkpoint (train.py's own
resume), and a run is re-evaluated only when its eval_linear.json is missing or older than its teacher export.
A run that fails is reported and the others still run; the table shows it as failed.
Positional key=value overrides go to every train.py call; those after --eval go to every eval_linear.py call.
"""

import argparse
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from models.evaluation.run_logs import COMPLETE, read_run  # noqa: E402
from slurm.sweep import run_name  # noqa: E402  (sparse_0.70: the Slurm sweep's folder names, so tools share runs)

PUBLISHED_FRACTIONS = (0.0, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0)
TRAIN_SCRIPT, EVAL_SCRIPT = REPO / "train.py", REPO / "eval_linear.py"
log = logging.getLogger("reproduce")


@dataclass
class PlannedRun:
    fraction: float
    run_dir: Path
    train: bool  # train.py must (re)start or resume it
    evaluate: bool  # eval_linear.py must (re)evaluate it
    state: str  # the run's status before this plan, for the dry-run listing


def parse_fractions(text: str) -> list[float]:
    try:
        fractions = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fractions must be comma-separated numbers, got {text!r}") from None
    bad = [f for f in fractions if not 0.0 <= f <= 1.0]
    if not fractions or bad:
        raise argparse.ArgumentTypeError(f"--fractions must be numbers in [0, 1], got {text!r}")
    return fractions


def _eval_is_stale(run_dir: Path) -> bool:
    result, teacher = run_dir / "eval_linear.json", run_dir / "teacher_backbone.pth"
    return not result.is_file() or (teacher.is_file() and result.stat().st_mtime < teacher.stat().st_mtime)


def plan(runs_dir: Path, fractions: list[float]) -> list[PlannedRun]:
    """What each schedule still needs. A failed run is retried: train.py resumes it from its last checkpoint."""
    planned = []
    for fraction in fractions:
        run_dir = runs_dir / run_name(fraction)
        summary = read_run(run_dir)
        trained = summary.train_status == COMPLETE
        planned.append(PlannedRun(fraction, run_dir, train=not trained,
                                  evaluate=not trained or _eval_is_stale(run_dir), state=summary.status))
    return planned


def _run_logged(command: list[str], log_path: Path) -> int:
    """Run `command` from the repo root, its output appended to `log_path` (the console keeps one progress bar)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("$ %s  (output: %s)", " ".join(command), log_path)
    with open(log_path, "a") as out:
        return subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode


def train_command(item: PlannedRun, overrides: list[str]) -> list[str]:
    return [sys.executable, str(TRAIN_SCRIPT), "--output-dir", str(item.run_dir),
            f"sparsity.sparse_fraction={item.fraction}", *overrides]


def eval_command(item: PlannedRun, overrides: list[str]) -> list[str]:
    return [sys.executable, str(EVAL_SCRIPT), "--run", str(item.run_dir), *overrides]


def _train_and_evaluate(item: PlannedRun, train_overrides: list[str], eval_overrides: list[str],
                        can_evaluate: bool) -> list[str]:
    logs = item.run_dir.parent / "reproduce_logs"
    if item.train:
        code = _run_logged(train_command(item, train_overrides), logs / f"{item.run_dir.name}.train.log")
        if code != 0:
            return [f"{item.run_dir.name}: train.py exited with {code} (see {logs})"]
    if item.evaluate and can_evaluate:
        code = _run_logged(eval_command(item, eval_overrides), logs / f"{item.run_dir.name}.eval.log")
        if code != 0:
            return [f"{item.run_dir.name}: eval_linear.py exited with {code} (see {logs})"]
    return []


def execute(planned: list[PlannedRun], train_overrides: list[str], eval_overrides: list[str],
            jobs: int = 1) -> list[str]:
    """Train and evaluate what the plan says, `jobs` schedules at a time (in plan order); returns one line per
    step that failed. A failed training skips that run's evaluation only."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tqdm import tqdm

    failures = []
    can_evaluate = EVAL_SCRIPT.is_file()
    if not can_evaluate:
        failures.append(f"{EVAL_SCRIPT} not found: runs left unevaluated")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_train_and_evaluate, item, train_overrides, eval_overrides, can_evaluate)
                   for item in planned]
        for _ in tqdm(as_completed(futures), total=len(futures), desc="schedules", unit="run", dynamic_ncols=True):
            pass
    return failures + [line for future in futures for line in future.result()]


def machine_notes() -> list[str]:
    """What the training times in the table can mean on this machine."""
    import torch

    if torch.cuda.is_available():
        return [f"Trained by scripts/reproduce.py on {torch.cuda.get_device_name()}."]
    return [f"Trained by scripts/reproduce.py on a CPU ({os.cpu_count()} cores). Its times say nothing about 2:4 "
            "speed-ups: a CPU has no sparse matmul, so the sparse phase prunes and then multiplies densely (extra "
            "work); they also vary with whatever else the machine runs. GPU speed: results/bench/."]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/default"), help="where the runs go")
    parser.add_argument("--out", type=Path, default=Path("results/default"), help="where the table and plots go")
    parser.add_argument("--fractions", type=parse_fractions, default=list(PUBLISHED_FRACTIONS),
                        help="comma-separated sparse fractions (default: the published table's seven)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    parser.add_argument("--jobs", type=int, default=1,
                        help="schedules trained at once (default 1; more only pays with idle cores, and runs sharing "
                             "a machine make their training times incomparable)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="train.py config overrides")
    parser.add_argument("--eval", dest="eval_overrides", nargs="*", default=[], metavar="key=value",
                        help="eval_linear.py overrides")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    planned = plan(args.runs_dir, args.fractions)
    for item in planned:
        todo = [step for step, wanted in (("train", item.train), ("evaluate", item.evaluate)) if wanted]
        print(f"{item.run_dir}: {item.state} -> {', '.join(todo) or 'nothing to do'}")
    if args.dry_run:
        return 0
    failures = execute(planned, args.overrides, args.eval_overrides, args.jobs)
    from models.evaluation.table import make_table

    written = make_table([item.run_dir for item in planned], args.out, extra_notes=machine_notes())
    print("wrote " + ", ".join(str(p) for p in written))
    for line in failures:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
