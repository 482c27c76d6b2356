"""Launch a sparse-fraction sweep on Slurm through submitit: one training job per fraction, each
followed by its linear probe (`afterok`), then a table of job ids and run directories.

    python slurm/launch.py --config configs/vitl16_imagenet.yaml --sparse-fractions 0 0.4 0.6 0.7 0.8 0.9 1.0 \\
        --nodes 4 --gpus-per-node 8 --partition gpu --timeout-min 4320 data.root=/datasets/imagenet
    python slurm/launch.py status --runs-dir runs/vitl16_imagenet-sweep

Each fraction trains in <runs-dir>/sparse_<fraction>. A job that reaches its time limit or is
preempted gets USR2, saves a checkpoint at a step boundary and requeues itself; the requeued job
resumes from that run directory. Running the same command again resumes unfinished runs and skips
finished ones (and finished probes).
"""

import argparse
import logging
import os
import sys
from pathlib import Path

if __package__ in (
    None,
    "",
):  # `python slurm/launch.py`: import the package from the repo root, not slurm/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from configs import ConfigError, as_written, scaled_lr, to_yaml  # noqa: E402
from configs.command_line import parse_command_line  # noqa: E402
from configs.eval_schema import load_eval_config  # noqa: E402
from rundir.errors import CommandError  # noqa: E402
from slurm.eval_time import FLOOR_MIN, IMAGES_PER_MIN, eval_time_min, probe_images  # noqa: E402
from slurm.status import (
    format_table,  # noqa: E402
    main as status_main,
)
from slurm.submit import Resources, SweepSubmitter, control_character_problem  # noqa: E402
from slurm.sweep import plan_sweep  # noqa: E402

REFERENCE_FRACTIONS = [0.0, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0]
FALLBACK_EVAL_MIN = 720  # a probe job's request where its data cannot be counted from here


def _key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"'{text}' is not of the form key=value")
    key, value = text.split("=", 1)
    return key, value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"sparsity.sparse_fraction={text} is out of range: must be >= 0 and <= 1"
        )
    return value + 0.0  # -0 is 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="slurm/launch.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        type=Path,
        required=True,
        help="training YAML, e.g. configs/vitl16_imagenet.yaml",
    )
    p.add_argument(
        "--sparse-fractions",
        type=_fraction,
        nargs="+",
        default=REFERENCE_FRACTIONS,
        metavar="X",
        help="one run per value of sparsity.sparse_fraction, each in [0, 1] (default: %(default)s)",
    )
    p.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="sweep folder, one run directory per fraction (default: runs/<config name>-sweep)",
    )
    slurm = p.add_argument_group("Slurm resources (training job)")
    slurm.add_argument("--nodes", type=int, default=1)
    slurm.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="also the tasks per node (0: one CPU task); default 8, or with --local the GPUs this "
        "machine has (0 without any: one CPU process)",
    )
    slurm.add_argument("--cpus-per-task", type=int, default=10)
    slurm.add_argument(
        "--cpu-tasks-per-node",
        type=int,
        default=1,
        help="training processes per node when --gpus-per-node is 0 (CPU/gloo runs)",
    )
    slurm.add_argument("--partition", default=None, help="default: the cluster's default partition")
    slurm.add_argument(
        "--timeout-min", type=int, default=4320, help="time limit of each job (it requeues itself)"
    )
    slurm.add_argument(
        "--signal-delay-s",
        type=int,
        default=120,
        help="USR2 this long before the time limit; the checkpoint must be saved within it",
    )
    slurm.add_argument(
        "--max-num-timeout",
        type=int,
        default=30,
        help="requeues after a time limit before the job gives up (preemptions are not counted)",
    )
    slurm.add_argument(
        "--mem-gb", type=int, default=None, help="memory per node (default: the cluster's default)"
    )
    slurm.add_argument(
        "--slurm-arg",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra sbatch option for every job, e.g. account=abc or constraint=h100 (repeatable)",
    )
    ev = p.add_argument_group("linear probe (eval_linear.py, chained after each training job)")
    ev.add_argument(
        "--eval-gpus", type=int, default=None, help="default: 1, or 0 when --gpus-per-node is 0"
    )
    ev.add_argument(
        "--eval-timeout-min",
        type=int,
        default=None,
        help="time limit of each probe job (default: 30 min + 1 min per 5,000 images it probes, "
        "counted "
        f"here; {FALLBACK_EVAL_MIN} min where its data is not on this machine)",
    )
    ev.add_argument(
        "--skip-eval",
        action="store_true",
        help="train only (a later launch without it adds probes)",
    )
    ev.add_argument(
        "--eval-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override for eval_linear.py, e.g. features.batch_size=128 (repeatable)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config, the global batch and peak lr, and each job's sbatch file; "
        "submit nothing",
    )
    mode.add_argument(
        "--local",
        action="store_true",
        help="run the same jobs here with submitit's local executor, one run after the other",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="training config overrides for every run"
    )
    # every key=value is an override wherever it stands, also right after --sparse-fractions' list
    args = parse_command_line(p, argv)
    for name in (
        "nodes",
        "cpus_per_task",
        "cpu_tasks_per_node",
        "timeout_min",
        "max_num_timeout",
        "eval_timeout_min",
    ):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    # submitit: min(0.8 T, T - 10 min) is then 0, so every USR2 reads as a time-out
    if args.timeout_min <= 10:
        print(
            f"warning: with --timeout-min {args.timeout_min} (<= 10) every preemption signal "
            f"counts against "
            f"--max-num-timeout ({args.max_num_timeout})",
            file=sys.stderr,
        )
    if args.local and args.nodes != 1:
        p.error("--local runs the jobs on this machine: --nodes must be 1")
    if args.gpus_per_node is None:
        args.gpus_per_node = visible_gpus() if args.local else 8
        if args.local:  # said, since it sets the global batch and so the learning rate
            print(
                f"--local: {args.gpus_per_node} GPU(s) here, so each run trains as "
                + (
                    f"{args.gpus_per_node} process(es), one per GPU"
                    if args.gpus_per_node
                    else f"{args.cpu_tasks_per_node} CPU process(es)"
                )
                + " (--gpus-per-node / --cpu-tasks-per-node choose)",
                file=sys.stderr,
            )
    if args.eval_gpus is None:
        args.eval_gpus = min(args.gpus_per_node, 1)
    if args.gpus_per_node < 0 or args.eval_gpus < 0:
        p.error("GPU counts must be >= 0")
    return args


def visible_gpus() -> int:
    """The GPUs a local job can use (CUDA_VISIBLE_DEVICES applies); 0 where torch sees none."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def dry_run_header(args: argparse.Namespace, plans: list) -> str:
    """The resolved config once (the runs differ only in sparsity.sparse_fraction), then the global
    batch and the peak lr this allocation trains with."""
    cfg = plans[0].cfg
    per_node = args.gpus_per_node or args.cpu_tasks_per_node
    world = args.nodes * per_node
    devices = "GPUs" if args.gpus_per_node else "CPU processes"
    global_batch = world * cfg.train.batch_size_per_gpu
    return "\n".join(
        [
            f"--- resolved config (shown for sparse_fraction={plans[0].fraction}; every run is "
            f"this config with its own "
            "sparsity.sparse_fraction, and the notes below it)",
            to_yaml(cfg).rstrip("\n"),
            f"--- global batch {global_batch} = {args.nodes} node(s) x {per_node} {devices} x "
            f"{cfg.train.batch_size_per_gpu} images (train.batch_size_per_gpu); peak lr "
            f"{scaled_lr(cfg, world):.6g} "
            f"(optim.base_lr {cfg.optim.base_lr:g} for 1024 images, scaled by "
            f"{cfg.optim.scaling_rule})",
            "note: the lr scaling follows the global batch: on another number of nodes x GPUs than "
            "the recipe was "
            "written for, keep its global batch by changing train.batch_size_per_gpu, or the runs "
            "train with another "
            "lr and sample order than the recipe's",
        ]
    )


def one_line_problem(args: argparse.Namespace, runs_dir: Path) -> str:
    """The first text of the command line that would reach a job's sbatch file, or its command, with
    a control character ('' if none): paths (as resolved), the partition, the extra sbatch and probe
    options, the overrides."""
    texts = [
        ("--config", str(args.config.resolve())),
        ("--runs-dir", str(runs_dir.resolve())),
        ("--partition", args.partition or ""),
    ]
    texts += [("--slurm-arg", f"{k}={v}") for k, v in args.slurm_arg] + [
        ("--eval-arg", a) for a in args.eval_arg
    ]
    texts += [("override", o) for o in args.overrides]
    return next(
        (p for p in (control_character_problem(what, text) for what, text in texts) if p), ""
    )


def data_notes(args: argparse.Namespace, cfg) -> list[str]:
    """What the launcher could tell of the data from here: a training root missing on this machine
    (the jobs need it on the nodes), and the probe jobs' time request (sets `args.eval_timeout_min`
    where not given)."""
    notes = []
    root = cfg.data.root
    if cfg.data.dataset != "digits" and not os.path.isdir(os.path.expanduser(root)):
        notes.append(
            f"data.root={as_written(cfg, 'data.root', root)} is not a folder on this machine: the "
            f"training "
            "jobs need it where they run"
        )
    if args.eval_timeout_min is not None or args.skip_eval:
        return notes
    given = load_eval_config(None, args.eval_arg).data  # checked already, by plan_sweep
    dataset = given.dataset or cfg.data.dataset
    probe_root = given.root or (root if dataset == cfg.data.dataset else "")
    splits = (given.train_split, given.val_split)
    images = probe_images(dataset, probe_root, splits)
    if images is None:
        args.eval_timeout_min = FALLBACK_EVAL_MIN
        notes.append(
            f"probe jobs ask {FALLBACK_EVAL_MIN} min: their data is not on this machine to size "
            f"the request "
            "(--eval-timeout-min sets it)"
        )
    else:
        args.eval_timeout_min = eval_time_min(images)
        notes.append(
            f"probe jobs ask {args.eval_timeout_min} min for {images:,} images ({FLOOR_MIN} min + "
            f"1 min per "
            f"{IMAGES_PER_MIN:,}; --eval-timeout-min sets it)"
        )
    return notes


def unlabelled_probe_problem(dataset: str, eval_args: list[str]) -> str:
    """Runs on unlabelled images (data.dataset=image_folder) can only be probed on a labelled set
    the probe jobs are told of; without one each probe job would fail after its training. '' if the
    probes can run."""
    if dataset != "image_folder":
        return ""
    given = load_eval_config(None, eval_args).data  # checked already, by plan_sweep
    if given.dataset == "digits" or (given.dataset == "imagenet_folder" and given.root):
        return ""
    return (
        "the runs train on unlabelled images (data.dataset=image_folder); their probes need a "
        "labelled set: add "
        "--eval-arg data.dataset=imagenet_folder --eval-arg data.root=<folder with train/<class>/ "
        "and "
        "val/<class>/>, or --skip-eval"
    )


def launch(args: argparse.Namespace) -> int:
    runs_dir = args.runs_dir or Path("runs") / f"{args.config.stem}-sweep"
    problem = one_line_problem(args, runs_dir)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        plans = plan_sweep(
            args.config, args.sparse_fractions, runs_dir, args.overrides, args.eval_arg
        )
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (
        CommandError
    ) as e:  # an existing run's entries the sweep cannot use (named in the message)
        print(f"run directory: {e}", file=sys.stderr)
        return e.exit_code
    problem = (
        "" if args.skip_eval else unlabelled_probe_problem(plans[0].cfg.data.dataset, args.eval_arg)
    )
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    for note in data_notes(args, plans[0].cfg):
        print(f"note: {note}", file=sys.stderr)
    res = Resources(
        partition=args.partition,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpus_per_task=args.cpus_per_task,
        cpu_tasks_per_node=args.cpu_tasks_per_node,
        timeout_min=args.timeout_min,
        signal_delay_s=args.signal_delay_s,
        max_num_timeout=args.max_num_timeout,
        mem_gb=args.mem_gb,
        eval_gpus=args.eval_gpus,
        eval_timeout_min=args.eval_timeout_min or FALLBACK_EVAL_MIN,
        slurm_extra=dict(args.slurm_arg),
    )
    submitter = SweepSubmitter(
        args.config, res, args.eval_arg, local=args.local, evaluate=not args.skip_eval
    )
    if args.dry_run:
        print(dry_run_header(args, plans))
        for plan in plans:
            print(
                f"=== {plan.run_dir}  sparse_fraction={plan.fraction}  training: "
                f"{plan.train_action} "
                f"(step {plan.done_steps}/{plan.last_step}), eval: "
                f"{'done' if plan.eval_done else 'todo'}"
            )
            for note in plan.notes:
                print(f"note: {note}")
            print("--- sbatch")
            print(submitter.preview(plan) or "(nothing to submit)")
        print(
            format_table(
                [
                    {
                        "fraction": f"{p.fraction:g}",
                        "run dir": str(p.run_dir),
                        "train": p.train_action,
                        "eval": "done" if p.eval_done else "todo",
                    }
                    for p in plans
                ]
            )
        )
        return 0
    for plan in plans:
        for note in plan.notes:
            print(f"note: {plan.run_dir}: {note}")
    try:
        rows = submitter.submit(plans)
    # --local: the job running here was stopped with it (SweepSubmitter._wait_local)
    except KeyboardInterrupt:
        print(
            "stopped: the local job and its processes were stopped; each run keeps its last "
            "checkpoint, and "
            "rerunning the same command resumes",
            file=sys.stderr,
        )
        return 130
    except Exception as e:  # noqa: BLE001 - sbatch refusals etc.: name them, keep what was recorded
        print(
            f"submission failed: {type(e).__name__}: {e}\n(jobs submitted before this are recorded "
            f"in each run's "
            "jobs.json; rerunning the launcher skips them)",
            file=sys.stderr,
        )
        return 1
    print(
        format_table(
            [
                {
                    "fraction": f"{r.plan.fraction:g}",
                    "train job": r.train,
                    "eval job": r.eval,
                    "run dir": str(r.plan.run_dir),
                }
                for r in rows
            ]
        )
    )
    return 1 if any("FAILED" in r.train + r.eval for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["status"]:
        return status_main(argv[1:])
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return launch(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
