"""The rounds of one or more `bench_train_step` results, pooled: each sparse row's speed ratio against
its mode's dense row and each ablation's saving, with 95% intervals over the rounds.

    python -m scripts.bench_rounds results/bench/ledger_h200/concat_attn24_5r_h200.json \
        results/bench/ledger_h200/concat_attn24_5r_gpu0_h200.json

Files pool only where they ran the same config, overrides and kind of GPU: rounds of another
coverage or another GPU would be a different quantity under the same row name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scripts.benchmarks.round_stats import format_round_stats, round_stats

SAME_IN_EVERY_FILE = ("gpu", "config", "overrides")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("results", nargs="+", type=Path, help="bench_train_step JSON files")
    ap.add_argument("--out", type=Path, default=None, help="write the statistics as JSON here")
    return ap


def load_results(paths: list[Path]) -> list[dict]:
    """The results, checked before any statistic: each a readable bench_train_step JSON, all of one
    config, overrides and GPU."""
    results = []
    for path in paths:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: not a readable JSON file ({e})") from None
        missing = [k for k in (*SAME_IN_EVERY_FILE, "rows") if k not in result]
        if missing:
            raise SystemExit(f"{path}: not a bench_train_step result (no {', '.join(missing)})")
        for key in SAME_IN_EVERY_FILE:
            if results and result[key] != results[0][key]:
                raise SystemExit(
                    f"{path}: {key} {result[key]!r} differs from {paths[0]}'s "
                    f"{results[0][key]!r}; pool only runs of one config, overrides and GPU"
                )
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict]]:
    args = build_parser().parse_args(argv)
    results = load_results(args.results)
    stats = round_stats(results)
    first = results[0]
    print(
        f"{first['gpu']}, {first['config']} {' '.join(first['overrides'])}: {len(results)} file(s)"
    )
    print("\n".join(format_round_stats(stats)))
    if args.out:
        args.out.write_text(json.dumps(stats, indent=1))
    return stats


if __name__ == "__main__":
    main(sys.argv[1:])
