"""Tabulate sparse-then-dense runs: one row per run, shaped like the published 2:4 DINOv2 table.

    python scripts/make_table.py RUN_DIR_OR_PARENT... [--out results/NAME]

Reads each run's config.yaml, metrics.jsonl and eval_linear.json; writes table.md, table.csv, summary.json,
top1_vs_sparsity.png and loss_curves.png into --out. Missing, partial, failed or unevaluated runs are listed with
their state, never dropped.
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, or folders holding them")
    parser.add_argument("--out", type=Path, default=Path("results/table"), help="output folder (default: %(default)s)")
    parser.add_argument("--no-plots", action="store_true", help="write the table, CSV and summary only")
    parser.add_argument("--note", action="append", default=[], help="a line added to the table's notes (repeatable)")
    args = parser.parse_args(argv)

    from models.evaluation.table import make_table

    try:
        written = make_table(args.runs, args.out, plots=not args.no_plots, extra_notes=args.note)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((args.out / "table.md").read_text())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
