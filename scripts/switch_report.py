"""What the sparse -> dense switch leaves in the probed teacher, per run (reporting/switch.py says
what each column is).

    python scripts/switch_report.py RUN_DIR_OR_PARENT... [--out results/cifar10/switch]

Prints a Markdown table: the switch step and `sparsity.switch_weights`, the share of the switch-time
EMA teacher still in the final teacher, the k-NN of the teacher exported at the switch probed dense
and 2:4-pruned, and the final teacher's linear / k-NN as trained and its k-NN in the other mode
(scripts/experiments/study_runs.sh writes all these probes). With --out, also OUT.md and OUT.json.
Exit 2 when no run can be read.
"""

import argparse
import json
import sys
from pathlib import Path

from configs.command_line import parse_command_line  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="run directories, or folders holding them"
    )
    parser.add_argument("--out", type=Path, default=None, help="write OUT.md and OUT.json too")
    args = parse_command_line(parser, argv)  # run folders after options too
    from reporting.run_logs import find_run_dirs
    from reporting.switch import as_json, markdown, switch_rows
    from rundir.atomic import atomic_write_text

    missing = [p for p in args.runs if not p.exists()]
    if missing:
        print(f"not found: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    rows, problems = switch_rows(find_run_dirs(args.runs))
    for line in problems:
        print(f"skipped {line}", file=sys.stderr)
    if not rows:
        print("no readable run", file=sys.stderr)
        return 2
    table = markdown(rows)
    print(table, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out.with_suffix(".md"), table)
        atomic_write_text(args.out.with_suffix(".json"), json.dumps(as_json(rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
