"""Linear-probe and k-NN evaluation of a finished run's teacher (the dinov2 logistic-regression
protocol).

    python eval_linear.py --run DIR [--config EVAL.yaml] [key=value ...]   (options and key=value in any order)
    python eval_linear.py --run runs/default-20261122-101500                      # embedded default (digits)
    python eval_linear.py --run runs/vitl16 data.root=/datasets/imagenet solver=torch
    python eval_linear.py --run DIR mode=knn          # k-NN only; features come from the cache when unchanged
    python eval_linear.py --run DIR data.dataset=imagenet_folder data.root=/data/cifar10   # another dataset
    python eval_linear.py --run DIR checkpoint=pixels # raw-pixel baseline (checkpoint=random: untrained network)
    python eval_linear.py --run DIR prune_mlp=true    # MLP weights 2:4-pruned as the run's student ran them

Reads DIR/config.yaml and DIR/teacher_backbone.pth, caches features under DIR/eval/, writes
DIR/eval_linear.json and appends a line to DIR/../eval_index.jsonl. Keys (see
configs/eval_schema.py): mode=linear|knn|both, solver=sklearn|torch|auto, device, checkpoint (a
path, random or pixels), prune_mlp=auto|true|false (auto: when the run's last step was sparse),
output, index, data.* (dataset, root, splits), features.*, linear.* (C grid, L-BFGS limits,
precision), knn.*. Exit status: 0 done, 1 bad run/checkpoint/dataset, 2 bad config.
"""

import argparse
import errno
import json
import logging
import os
import sys
from pathlib import Path

from configs import ConfigError, load_eval_config
from configs.command_line import parse_command_line

# Idle OpenMP threads sleep instead of spinning. Read once, when torch loads its OpenMP runtime, so
# it is set before anything imports torch (the imports above do not: tests/test_light_imports.py).
# On shared cores (a second torch process, two CI cores) spinning threads starve the other processes
# and wait on descheduled ones: the embedded default ran ~5x slower beside a busy neighbour without
# it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, required=True, help="run directory written by train.py")
    parser.add_argument(
        "--config", type=Path, default=None, help="optional YAML of evaluation settings"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="evaluation settings, e.g. solver=torch"
    )
    return parse_command_line(parser, argv)  # options and overrides in any order


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        eval_cfg = load_eval_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # the data and model stack (torchvision, timm) is imported only now, so a config error above is
    # reported at once
    from evaluation import evaluate_run
    from rundir.errors import CommandError

    try:
        record = evaluate_run(args.run, eval_cfg)
    except CommandError as e:  # a run, checkpoint, dataset or output that cannot be used: one line
        logging.getLogger("eval_linear").error("%s", e)
        return e.exit_code
    except KeyboardInterrupt:
        logging.getLogger("eval_linear").error(
            "interrupted (Ctrl-C): every file it wrote is whole (written "
            "atomically); rerun the same command to finish"
        )
        return 130
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        logging.getLogger("eval_linear").error(
            "no space left on the device of %s (%s%s): free some space, then "
            "rerun the same command (every file written is whole)",
            args.run,
            e.strerror or e,
            f", writing {e.filename}" if e.filename else "",
        )
        return 1
    from evaluation.evaluate import summary_line

    logging.getLogger("eval_linear").info("%s", summary_line(record))
    headline = {k: record[k] for k in ("output", "top1", "top5", "best_C", "solver", "seconds")}
    headline["knn_top1"] = {k: round(v["top1"], 2) for k, v in record["knn"].items()}
    headline["knn_top5"] = {k: round(v["top5"], 2) for k, v in record["knn"].items()}
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C while the settings or the libraries load
        print(
            "interrupted (Ctrl-C): nothing was evaluated; rerun the same command", file=sys.stderr
        )
        sys.exit(130)
