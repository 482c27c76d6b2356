"""DINOv2 pre-training with sparse-then-dense 2:4 MLP schedules.

    python train.py [--config FILE] [--output-dir DIR] [key=value ...]   (options and key=value in any order)
    torchrun --nproc_per_node=8 train.py --config configs/vitl16_imagenet.yaml data.root=/datasets/imagenet

Without --config it runs the embedded default (a small ViT on scikit-learn's digits, a few minutes
on a CPU). Rerunning with the same --output-dir resumes from its newest checkpoint.
"""

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from configs import DEFAULT_CONFIG, ConfigError, load_config
from configs.command_line import parse_command_line
from rundir.metrics import open_append
from rundir.run_dir import RunDir
from rundir.status import DISK_FULL
from training.closing_lines import closing_lines

# Idle OpenMP threads sleep instead of spinning. Read once, when torch loads its OpenMP runtime, so
# it is set before anything imports torch (the imports above do not: tests/test_light_imports.py).
# On shared cores (a second torch process, two CI cores) spinning threads starve the other processes
# and wait on descheduled ones: the embedded default ran ~5x slower beside a busy neighbour without
# it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

EVAL_SCRIPT = Path(__file__).resolve().with_name("eval_linear.py")  # the next command after a run


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help="YAML config (default: %(default)s)"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="run directory (default: runs/<config name>-<date>-<time>)",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.seed=1"
    )
    return parse_command_line(parser, argv)  # options and overrides in any order


def output_dir_problem(output_dir: Path) -> str:
    """Why a run cannot write into `output_dir` ("" if it can): a file in the way, no permission, a
    read-only file system. Checked before anything is created, with a real write (permissions alone
    say nothing for root)."""
    if output_dir.exists() and not output_dir.is_dir():
        return "exists and is not a directory"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except OSError as e:
        return f"cannot write there ({e.strerror or e})"
    return ""


class _RunLogHandler(logging.FileHandler):
    """log.txt, never opened through a symlink planted in its place (`open_append` refuses one)."""

    def _open(self):
        return open_append(Path(self.baseFilename))


def setup_logging(output_dir: Path, is_main: bool) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(_RunLogHandler(RunDir(output_dir).log_file))
    logging.basicConfig(
        level=logging.INFO if is_main else logging.WARNING,
        handlers=handlers,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def refuse(prefix: str, error: Exception, exit_code: int = 0) -> int:
    """A refusal before the run's log exists: one line on stderr; the error's exit code unless one
    is given."""
    print(f"{prefix}: {error}", file=sys.stderr)
    return exit_code or getattr(error, "exit_code", 1)


def main(argv=None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        return refuse("config error", e)

    # the data and model stack (torchvision, timm) is imported only now, so a config error above is
    # reported at once
    from data import build_training_dataset
    from rundir.claim import claim
    from rundir.errors import CommandError, UsageError
    from rundir.guard import resolve_run_dir
    from training.distributed import detect_launch, init_distributed, shutdown
    from training.preflight import check_model
    from training.trainer import Trainer

    try:
        launch = detect_launch(os.environ)
    except CommandError as e:
        return refuse("launch error", e)
    if args.output_dir is None and launch.world_size > 1:
        # A time-stamped default would differ between ranks that start in different seconds.
        print(
            "--output-dir is required when training on several processes (a directory all nodes "
            "share)",
            file=sys.stderr,
        )
        return 2
    try:
        dataset = build_training_dataset(
            cfg
        )  # a wrong data.root is reported now, before the run directory exists
    except CommandError as e:
        return refuse("data error", e)
    try:
        check_model(
            cfg
        )  # sparsity options and pretrained weights the model cannot take: before the run directory
    except CommandError as e:
        return refuse("config error", e)
    output_dir = (
        args.output_dir or Path("runs") / f"{args.config.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    try:
        output_dir = resolve_run_dir(output_dir)  # once: a link re-pointed mid-run moves nothing
    except CommandError as e:
        return refuse("--output-dir", e, exit_code=2)
    problem = output_dir_problem(output_dir)
    if problem:
        print(f"--output-dir {output_dir}: {problem}", file=sys.stderr)
        return 2
    # Rank 0 holds the run directory until it exits, whatever the command (a finished run with
    # nothing to do, or train.resume=false, included): a second trainer there would remove its
    # temporary files and overwrite its checkpoints and metrics (the rules: rundir/guard.py).
    try:
        claimed = claim(output_dir, resume=cfg.train.resume) if launch.rank == 0 else None
    except CommandError as e:
        return refuse("--output-dir", e)
    ctx = init_distributed(start_timeout_s=cfg.train.dist_start_timeout_s)
    try:
        setup_logging(output_dir, ctx.is_main)
    except CommandError as e:
        shutdown(ctx)
        if claimed is not None:
            claimed.release()
        return refuse("--output-dir", e)
    log = logging.getLogger("train")
    if claimed is not None and not claimed.held:
        log.warning(
            "cannot lock the run directory (%s): make sure no other trainer writes into it (stray "
            "temporary files are left in place)",
            claimed.unsupported,
        )
    elif claimed is not None:  # the lock holder's alone: no one else writes these now
        claimed.remove_strays()
    try:
        Trainer(cfg, output_dir, ctx, dataset=dataset).train()
        if ctx.is_main:  # the final loss, this command's time and the next command to type
            for line in closing_lines(output_dir, cfg, time.monotonic() - started, EVAL_SCRIPT):
                log.info("%s", line)
    # Ctrl-C outside the loop, or a second one in it (the first stops at a checkpoint)
    except KeyboardInterrupt:
        log.error(
            "interrupted (Ctrl-C): stopped at once, without a new checkpoint; rerun the same "
            "command to resume "
            "from the last one"
        )
        return 130
    except (
        CommandError
    ) as e:  # a diverged run, a checkpoint or dataset that cannot be used, a config refused late
        log.error("%s: %s", "config error" if isinstance(e, UsageError) else type(e).__name__, e)
        return e.exit_code
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        # every write is atomic: the last checkpoint is whole, the half-written file was removed
        log.error(
            "no space left on the device of %s (%s%s): free some space, then rerun the same "
            "command; it "
            "resumes from the last checkpoint",
            output_dir,
            e.strerror or e,
            f", writing {e.filename}" if e.filename else "",
        )
        return 1
    finally:
        shutdown(ctx)
        if claimed is not None:
            claimed.release()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C before the run directory's log exists
        print(
            "interrupted (Ctrl-C) during start-up: nothing was trained; rerun the same command",
            file=sys.stderr,
        )
        sys.exit(130)
