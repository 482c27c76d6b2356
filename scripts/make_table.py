"""Tabulate sparse-then-dense runs: one row per run, shaped like the published 2:4 DINOv2 table.

    python scripts/make_table.py RUN_DIR_OR_PARENT... [--out DIR]       (default DIR: runs/table)

Reads each run's config.yaml, metrics.jsonl, log.txt, eval_linear.json and the baselines' results
(eval_linear_random_init.json, eval_linear_pixels.json); writes table.md, table.csv, summary.json,
top1_vs_sparsity.png and loss_curves.png into --out (and gaps_to_dense.png, each sparse
configuration's gap to its dense runs, where there are several configurations; loss_differences.png,
each run's loss minus its dense run's, a row per dense run, where there are several dense runs;
masks.png, the student's 2:4 masks over training, where runs logged them). Partial, failed or
unevaluated runs are listed with their state, never dropped. A path that does not exist is an error
(exit 2; a typo must not yield a table of nothing), unless --allow-missing lists it as a missing
run.

Runs are seeds of one configuration iff their config.yaml are equal apart from train.seed and the
keys that only say how a run executes (configs/load.py RESUMABLE_CHANGES; the per-GPU batch counts
through the global batch). Where runs differ in other keys too (architecture, learning rate,
sparsity.teacher, ...), each run is labelled by its schedule and its values of those keys ("70%
sparse · sparsity.teacher=sparse"), the CSV has a column per key, means and spreads are taken per
configuration, and the accuracy plot draws one series per configuration. Paths in the CSV and JSON
are relative to the folder holding the runs.
"""

import argparse
import re
import sys
from pathlib import Path

from configs.command_line import parse_command_line

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="run directories, or folders holding them"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/table"),
        help="output folder (default: %(default)s; the committed tables under results/ are "
        "rewritten "
        "only when named here)",
    )
    parser.add_argument(
        "--no-plots", action="store_true", help="write the table, CSV and summary only"
    )
    parser.add_argument(
        "--note", action="append", default=[], help="a line added to the table's notes (repeatable)"
    )
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="list paths that do not exist as missing runs instead of stopping",
    )
    parser.add_argument(
        "--screening",
        nargs="+",
        type=Path,
        default=[],
        metavar="RUN",
        help="runs (or folders of runs) among the table's that chose the settings under test: "
        "shown, "
        "kept out of every mean and interval",
    )
    parser.add_argument(
        "--reference",
        nargs="+",
        type=Path,
        default=[],
        metavar="RUN",
        help="runs (or folders of runs) among the table's of the sparse recipe the other sparse "
        "runs modify (one a schedule and seed): each other sparse run and configuration is also "
        "read against it, seed by seed at the same schedule (an ablation's gain over its recipe)",
    )
    parser.add_argument(
        "--eval",
        default="",
        metavar="LABEL",
        help="tabulate the probes on other data named LABEL (eval_linear_data_LABEL.json, as "
        "eval_linear.py names a probe on another data set: its folder's name) instead of the "
        "runs' own eval_linear.json",
    )
    parser.add_argument(
        "--eval-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="tabulate the record of the probe run with these eval_linear.py settings (repeatable; "
        "as slurm/launch.py's --eval-arg: the table then shows what the launcher's probe jobs "
        "wrote, whatever the files' names)",
    )
    args = parse_command_line(parser, argv)  # run folders after options too
    if args.eval and not re.fullmatch(r"[A-Za-z0-9._-]+", args.eval):
        print(
            f"error: --eval {args.eval!r}: a label as eval_linear.py names probes on other data "
            f"(letters, digits, "
            "'.', '_' and '-'; the part after eval_linear_data_ in the file name)",
            file=sys.stderr,
        )
        return 2
    if args.eval and args.eval_arg:
        print(
            "error: --eval LABEL and --eval-arg choose the probe two ways: give one",
            file=sys.stderr,
        )
        return 2
    probe = None
    if args.eval_arg:
        from configs import ConfigError, load_eval_config

        try:
            probe = load_eval_config(None, args.eval_arg)
        except ConfigError as e:
            print(f"error: --eval-arg: {e}", file=sys.stderr)
            return 2
    absent = [path for path in args.runs if not path.exists()]
    if absent and not args.allow_missing:
        for path in absent:
            print(
                f"error: {path}: no such run directory or folder of runs (--allow-missing lists it "
                f"as a missing "
                "run)",
                file=sys.stderr,
            )
        return 2

    from reporting.table import (
        make_table,
    )  # after the checks above: a wrong path is reported without importing torch
    from rundir.errors import CommandError

    try:
        written = make_table(
            args.runs,
            args.out,
            plots=not args.no_plots,
            extra_notes=args.note,
            screening=args.screening,
            reference=args.reference,
            eval_label=args.eval,
            probe=probe,
        )
    except (
        CommandError
    ) as e:  # an output that cannot be written where --out says (named in the message)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((args.out / "table.md").read_text())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
