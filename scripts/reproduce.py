"""Reproduce the sparse-then-dense study end to end: the embedded default on a CPU, or a real
dataset on one GPU.

    python scripts/reproduce.py [--config FILE] [--runs-dir DIR] [--out DIR] [--fractions 0,0.4,...]
                                [--extra-seeds 1,...] [--extra-seed-fractions 0,0.7] [--parallel N]
                                [--no-baselines] [--dry-run] [key=value ...] [--eval key=value ...]

    # JPEG-q75 CIFAR-10 on one GPU, four runs at a time, a second seed for 0% and 70% (nine runs):
    python scripts/prepare_cifar10.py --npz ../shared/data/cifar10-jpeg/cifar10_jpeg_bytes.npz --out .gpudata/cifar10
    python scripts/reproduce.py --config configs/cifar10.yaml --parallel 4 --extra-seeds 1 \
        --extra-seed-fractions 0,0.7 data.root=$PWD/.gpudata/cifar10

Trains the seven schedules of the published table (2:4-sparse for the first 0, 40, 60, 70, 80, 90,
100% of the steps, then dense) with `train.py`, evaluates each with `eval_linear.py` (linear probe +
k-NN) right after its training, evaluates the baselines on the dense run (`checkpoint=random`: the
untrained network; `checkpoint=pixels`: logistic regression on raw pixels), then writes the table,
CSV, summary and plots with `scripts/make_table.py`. Runs are named as the Slurm sweep names them
(sparse_0.70); other seeds add a suffix (sparse_0.70_seed1) and get `train.seed=S`. Runs go to
runs/default (with --config: runs/<config name>), the table and plots to its table/ folder; the
committed results/ are rewritten only with an explicit --out (e.g. --out results/default).

Rerunning is cheap: finished runs are skipped, interrupted ones resume from their newest checkpoint
(train.py's own resume), a run is re-evaluated only when its eval_linear.json is missing or older
than its teacher export, and a baseline only when its result file is missing. A run that fails is
reported and the others still run; the table shows it as failed. Positional key=value overrides go
to every train.py call (a key that acts only at the switch, such as
teacher.momentum_restart_at_switch=true, only to the runs that switch: see configs/sweep.py); those
after --eval go to every eval_linear.py call.
"""

import argparse
import logging
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from configs import ConfigError
from configs.command_line import parse_command_line
from configs.eval_schema import EvalConfig, load_eval_config, protocol_suffix
from configs.sweep import refuse_fraction_override, schedule_run
from reporting.eval_records import find_probe
from reporting.published import FRACTIONS as PUBLISHED_FRACTIONS
from reporting.run_logs import COMPLETE, read_run
from rundir.layout import baseline_results
from rundir.run_dir import RunDir
from slurm.sweep import (
    run_name,
)  # (sparse_0.70: the Slurm sweep's folder names, so tools share runs)
from training.terminal import track

REPO = Path(__file__).resolve().parent.parent

TRAIN_SCRIPT, EVAL_SCRIPT = REPO / "train.py", REPO / "eval_linear.py"
BASELINE_CHECKPOINTS = {
    "random": "random_init",
    "pixels": "pixels",
}  # eval_linear.py's checkpoint= of each


def baseline_files(probe: EvalConfig) -> dict[str, str]:
    """eval_linear.py's checkpoint= value of each baseline -> the result file it writes under
    `probe`'s protocol (what run_logs reads)."""
    results = baseline_results(protocol_suffix(probe))
    return {checkpoint: results[key][0] for checkpoint, key in BASELINE_CHECKPOINTS.items()}


log = logging.getLogger("reproduce")


@dataclass
class PlannedRun:
    fraction: float
    run_dir: Path
    train: bool  # train.py must (re)start or resume it
    evaluate: bool  # eval_linear.py must (re)evaluate it
    state: str  # the run's status before this plan, for the dry-run listing
    seed: int | None = None  # None: the config's train.seed (the run named without a suffix)
    baselines: list = field(
        default_factory=list
    )  # checkpoint= values still to evaluate on this run's data


def parse_fractions(text: str) -> list[float]:
    try:
        fractions = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--fractions must be comma-separated numbers, got {text!r}"
        ) from None
    bad = [f for f in fractions if not 0.0 <= f <= 1.0]
    if not fractions or bad:
        raise argparse.ArgumentTypeError(f"--fractions must be numbers in [0, 1], got {text!r}")
    return fractions


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--extra-seeds must be comma-separated integers, got {text!r}"
        ) from None
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"--extra-seeds must be integers >= 0, got {text!r}")
    return seeds


def seeded_run_name(fraction: float, seed: int | None) -> str:
    """sparse_0.70 for the config's seed, sparse_0.70_seed1 for another."""
    return run_name(fraction) if seed is None else f"{run_name(fraction)}_seed{seed}"


def _eval_is_stale(run_dir: Path, probe: EvalConfig) -> bool:
    """No record of the probe asked (found by its settings, of the current teacher: `find_probe`),
    or one older than the teacher export."""
    found, teacher = find_probe(run_dir, probe), RunDir(run_dir).teacher
    return found is None or (
        teacher.is_file() and Path(found.path).stat().st_mtime < teacher.stat().st_mtime
    )


def plan(
    runs_dir: Path,
    fractions: list[float],
    extra_seeds=(),
    extra_seed_fractions=(),
    baselines: bool = False,
    probe: EvalConfig | None = None,
) -> list[PlannedRun]:
    """What each run still needs: every fraction with the config's seed, then each extra seed for
    the `extra_seed_fractions`. A failed run is retried: train.py resumes it from its last
    checkpoint. `baselines`: the dense run with the config's seed also evaluates the untrained
    network and raw pixels, if not done yet. `probe`: the --eval settings (their records are named
    for their protocol; default: the default probe)."""
    probe = probe or EvalConfig()
    wanted = [(f, None) for f in fractions]
    wanted += [(f, s) for s in extra_seeds for f in extra_seed_fractions]
    planned = []
    for fraction, seed in wanted:
        run_dir = runs_dir / seeded_run_name(fraction, seed)
        summary = read_run(run_dir)
        trained = summary.train_status == COMPLETE
        todo = (
            [c for c, name in baseline_files(probe).items() if not (run_dir / name).is_file()]
            if baselines and fraction == 0.0 and seed is None
            else []
        )
        evaluate = not trained or _eval_is_stale(run_dir, probe)
        planned.append(
            PlannedRun(
                fraction,
                run_dir,
                train=not trained,
                evaluate=evaluate,
                state=summary.status,
                seed=seed,
                baselines=todo,
            )
        )
    return planned


def _run_logged(command: list[str], log_path: Path) -> int:
    """Run `command` from the repo root, its output appended to `log_path` (the console keeps one
    progress bar)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("$ %s  (output: %s)", shlex.join(command), log_path)
    with open(log_path, "a") as out:
        return subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode


def train_command(item: PlannedRun, overrides: list[str], config: Path | None = None) -> list[str]:
    command = [sys.executable, str(TRAIN_SCRIPT), "--output-dir", str(item.run_dir)]
    if config is not None:
        command += ["--config", str(config)]
    command += schedule_run(
        config, overrides, item.fraction
    ).overrides  # switch-only keys off where none
    return command + ([f"train.seed={item.seed}"] if item.seed is not None else [])  # last: it wins


def eval_command(
    item: PlannedRun, overrides: list[str], checkpoint: str | None = None
) -> list[str]:
    return [
        sys.executable,
        str(EVAL_SCRIPT),
        "--run",
        str(item.run_dir),
        *overrides,
        *([f"checkpoint={checkpoint}"] if checkpoint else []),
    ]


def _train_and_evaluate(
    item: PlannedRun,
    train_overrides: list[str],
    eval_overrides: list[str],
    can_evaluate: bool,
    config: Path | None = None,
) -> list[str]:
    """Train, evaluate, then the baselines; returns the failures. A failed training skips the
    evaluations; a failed evaluation does not skip the baselines (another eval mode may still
    work)."""
    logs = item.run_dir.parent / "reproduce_logs"
    name = item.run_dir.name
    if item.train:
        code = _run_logged(train_command(item, train_overrides, config), logs / f"{name}.train.log")
        if code != 0:
            return [f"{name}: train.py exited with {code} (see {logs})"]
    if not can_evaluate:
        return []
    failures = []
    if item.evaluate:
        code = _run_logged(eval_command(item, eval_overrides), logs / f"{name}.eval.log")
        if code != 0:
            failures.append(f"{name}: eval_linear.py exited with {code} (see {logs})")
    for checkpoint in item.baselines:
        code = _run_logged(
            eval_command(item, eval_overrides, checkpoint), logs / f"{name}.eval_{checkpoint}.log"
        )
        if code != 0:
            failures.append(
                f"{name}: eval_linear.py checkpoint={checkpoint} exited with {code} (see {logs})"
            )
    return failures


def execute(
    planned: list[PlannedRun],
    train_overrides: list[str],
    eval_overrides: list[str],
    jobs: int = 1,
    config: Path | None = None,
) -> list[str]:
    """Train and evaluate what the plan says, `jobs` runs at a time (in plan order; each run's
    evaluations follow its training in the same slot); returns one line per step that failed."""
    failures = []
    can_evaluate = EVAL_SCRIPT.is_file()
    if not can_evaluate:
        failures.append(f"{EVAL_SCRIPT} not found: runs left unevaluated")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(
                _train_and_evaluate, item, train_overrides, eval_overrides, can_evaluate, config
            )
            for item in planned
        ]
        for _ in track(
            as_completed(futures),
            "runs",
            "runs done",
            total=len(futures),
            every=1 / max(1, len(futures)),
            say=log.info,
        ):
            pass
    return failures + [line for future in futures for line in future.result()]


def machine_notes(jobs: int = 1) -> list[str]:
    """What the training times in the table can mean on this machine."""
    shared = (
        f" {jobs} runs trained at a time on it, so each run's images/s was measured while sharing "
        f"the device "
        "with others: compare them between runs with care; results/bench/ measures speed alone."
        if jobs > 1
        else ""
    )
    import torch  # here, not at the top: --help and a config error answer without it

    if torch.cuda.is_available():
        return [f"Trained by scripts/reproduce.py on {torch.cuda.get_device_name()}.{shared}"]
    return [
        f"Trained by scripts/reproduce.py on a CPU ({os.cpu_count()} cores).{shared} Its times say "
        f"nothing about "
        "2:4 speed-ups: a CPU has no sparse matmul, so the sparse phase prunes and then multiplies "
        "densely (extra "
        "work); they also vary with whatever else the machine runs. GPU speed: results/bench/."
    ]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="train.py config (default: the embedded default), e.g. configs/cifar10.yaml",
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="where the runs go (default: runs/default, or runs/<config name> with --config)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the table and plots go (default: RUNS_DIR/table; the committed results/<name> "
        "only when named here)",
    )
    parser.add_argument(
        "--fractions",
        type=parse_fractions,
        default=list(PUBLISHED_FRACTIONS),
        help="comma-separated sparse fractions (default: the published table's seven)",
    )
    parser.add_argument(
        "--extra-seeds",
        type=parse_seeds,
        default=[],
        metavar="S[,S...]",
        help="comma-separated train.seed values run again for the --extra-seed-fractions only (run "
        "folders get _seedS)",
    )
    parser.add_argument(
        "--extra-seed-fractions",
        type=parse_fractions,
        default=[0.0, 0.7],
        metavar="F[,F...]",
        help="comma-separated fractions trained again with each extra seed (default: 0,0.7)",
    )
    parser.add_argument(
        "--no-baselines",
        dest="baselines",
        action="store_false",
        help="skip the random-init and raw-pixel evaluations on the dense run",
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    parser.add_argument(
        "--parallel",
        "--jobs",
        dest="jobs",
        type=int,
        default=1,
        metavar="N",
        help="runs trained at once, each a train.py process (default 1). On a GPU a small model "
        "leaves most of it idle: N runs share it (mind its memory); on a CPU more only pays "
        "with idle cores. Runs sharing a device make their images/s incomparable to a lone run",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="train.py config overrides"
    )
    parser.add_argument(
        "--eval",
        dest="eval_overrides",
        nargs="*",
        default=[],
        metavar="key=value",
        help="eval_linear.py overrides",
    )
    args = parse_command_line(
        parser, argv, key_value_options=["--eval"]
    )  # any order; --eval k=v... its own
    if args.jobs < 1:
        parser.error("--parallel must be >= 1")
    name = args.config.stem if args.config else "default"
    args.runs_dir = args.runs_dir or Path("runs") / name
    args.out = (
        args.out or args.runs_dir / "table"
    )  # user output stays under runs/, never in the committed results/
    return args


def _check_config(args) -> str | None:
    """Every fraction's config, loaded once up front: a typo or a value one schedule refuses stops
    here, not in nine failed runs."""
    try:
        load_eval_config(None, args.eval_overrides)
        refuse_fraction_override(args.overrides, "--fractions")
        runs = [
            schedule_run(args.config, args.overrides, fraction)
            for fraction in dict.fromkeys([*args.fractions, *args.extra_seed_fractions])
        ]
    except ConfigError as e:
        return str(e)
    if runs[0].cfg.train.seed in args.extra_seeds:  # its runs are the ones named without a suffix
        return f"--extra-seeds {runs[0].cfg.train.seed} is the config's own train.seed"
    return None


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    problem = _check_config(args)
    if problem:
        print(f"config error: {problem}", file=sys.stderr)
        return 2
    probe = load_eval_config(None, args.eval_overrides)  # checked by _check_config
    planned = plan(
        args.runs_dir,
        args.fractions,
        args.extra_seeds,
        args.extra_seed_fractions,
        args.baselines,
        probe,
    )
    for item in planned:
        todo = [
            step for step, wanted in (("train", item.train), ("evaluate", item.evaluate)) if wanted
        ]
        todo += [f"baseline {checkpoint}" for checkpoint in item.baselines]
        print(f"{item.run_dir}: {item.state} -> {', '.join(todo) or 'nothing to do'}")
        for note in (
            schedule_run(args.config, args.overrides, item.fraction).notes if item.train else ()
        ):
            print(f"    note: {note}")
        if args.dry_run:
            commands = (
                ([train_command(item, args.overrides, args.config)] if item.train else [])
                + ([eval_command(item, args.eval_overrides)] if item.evaluate else [])
                + [eval_command(item, args.eval_overrides, c) for c in item.baselines]
            )
            for command in commands:
                print("    $ " + shlex.join(command))
    if args.dry_run:
        print(f"{len(planned)} runs, {args.jobs} at a time; table and plots: {args.out}")
        return 0
    failures = execute(planned, args.overrides, args.eval_overrides, args.jobs, args.config)
    from reporting.table import (
        make_table,
    )  # the plots' libraries: only once there is a table to write

    written = make_table(
        [item.run_dir for item in planned],
        args.out,
        extra_notes=machine_notes(args.jobs),
        probe=probe if args.eval_overrides else None,
    )  # the records of the probe asked
    print("wrote " + ", ".join(str(p) for p in written))
    for line in failures:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
