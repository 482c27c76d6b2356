"""Do two runs train the same? Their smoothed loss curves against the spread between two seeds.

    python scripts/compare_losses.py CANDIDATE BASELINE [--spread OTHER_SEED_OF_BASELINE] [--window 10] [--out F]
        [--plot PNG [--more-seeds RUN ...]]

CANDIDATE and BASELINE start from one state (same config and seed, one setting changed, e.g.
`train.residual_dtype=amp` against `fp32`); --spread is the baseline's setting with another
`train.seed`. Both are checked in the runs' config.yaml (keys that only say how a run executed, as
for a resume, may differ), and what the candidate changes is printed first. Then one line per loss
term (the mean absolute difference of the smoothed curves, its maximum, the seeds' spread, and
whether the difference is within it), also written as JSON to --out. Exit 0 when every term is
within the spread (or no spread run was given), 1 when one is not, 2 for runs that cannot be
compared (no metrics, no readable config, a candidate with another seed, a spread run that differs
in more than its seed). --plot draws every term of the runs (with --more-seeds: more seeds of the
baseline, drawn only) and each run's difference to the baseline.
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
    parser.add_argument("candidate", type=Path)
    parser.add_argument("baseline", type=Path)
    parser.add_argument(
        "--spread", type=Path, default=None, help="the baseline's setting with another seed"
    )
    parser.add_argument(
        "--window", type=int, default=10, help="logged points per moving average (default 10)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the comparison")
    parser.add_argument(
        "--plot", type=Path, default=None, help="PNG of the curves and their differences"
    )
    parser.add_argument(
        "--more-seeds",
        type=Path,
        nargs="+",
        default=[],
        help="more seeds of the baseline, drawn in --plot beside --spread (not in the verdict)",
    )
    args = parse_command_line(parser, argv)  # options before or after the runs
    from configs import ConfigError
    from reporting.compare import as_json, compare_runs, setting_changes
    from rundir.atomic import atomic_write_text
    from rundir.run_dir import RunDir

    if args.more_seeds and args.plot is None:
        parser.error("--more-seeds is only drawn: it needs --plot")
    for path in (args.candidate, args.baseline, args.spread, *args.more_seeds):
        if path is not None and not RunDir(path).has_metrics():
            print(
                f"{path}: no metrics.jsonl (not a run directory written by train.py)",
                file=sys.stderr,
            )
            return 2
    try:
        changed, problems = setting_changes(args.candidate, args.baseline, args.spread)
    except ConfigError as e:
        print(f"cannot compare the runs' settings: {e}", file=sys.stderr)
        return 2
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    print(
        "compared: "
        + ("; ".join(changed) if changed else "the same config (apart from how the runs executed)")
    )
    try:
        comparisons = compare_runs(args.candidate, args.baseline, args.spread, args.window)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    for c in comparisons:
        spread = (
            ""
            if c.spread is None
            else (f", seeds' spread {c.spread:.4f}: {'within' if c.within_spread else 'OUTSIDE'}")
        )
        print(
            f"{c.term}: mean |difference| {c.difference:.4f} (max {c.max_difference:.4f}) over "
            f"{c.steps} logged "
            f"steps{spread}"
        )
    if args.out is not None:
        atomic_write_text(
            args.out,
            json.dumps(
                {
                    "candidate": str(args.candidate),
                    "baseline": str(args.baseline),
                    "spread": str(args.spread) if args.spread else None,
                    "window": args.window,
                    "changed": changed,
                    "terms": as_json(comparisons),
                },
                indent=1,
            )
            + "\n",
        )
    if args.plot is not None:
        from reporting.compare_plot import plot_comparison

        drawn = [p for p in (args.spread, *args.more_seeds) if p is not None]
        plot_comparison(args.candidate, args.baseline, drawn, args.window, args.plot)
        print(f"wrote {args.plot}")
    return 1 if any(c.within_spread is False for c in comparisons) else 0


if __name__ == "__main__":
    sys.exit(main())
