"""Copy what a study's runs wrote into `results/`, as the committed runs are kept: the records a
table, a plot or a reader needs, never weights, checkpoints, feature caches or TensorBoard files;
the logs (metrics.jsonl, log.txt and the per-layer mask log, its statistics at 4 significant digits)
compressed as `.xz`, which every reader takes (`rundir.compressed`); and every path of the machine
that ran them replaced, so that the files name runs and data the same way on any machine.

    python -m scripts.experiments.study_import RUNS_DIR [RUNS_DIR ...] --to results/cifar10/recipe/screen \\
        --replace /tmp/runs/screen4_1/= --replace /tmp/cifar10=cifar10

A run is a folder of RUNS_DIR holding config.yaml (as `study_runs.sh` leaves them, or a
`study_collect.sh` archive unpacked). `--replace OLD=NEW` swaps the literal text OLD for NEW in
every copied text file (run names relative, the data root by its name); any `/.../site-packages/`
becomes `site-packages/`; afterwards any absolute path of the runs' machine left in them
(`--check-prefix`, default /tmp/ /opt/ /home/ /root/) is an error naming the file, and nothing is
written. A run already under --to is refused unless --overwrite.
"""

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from rundir import compressed
from rundir.run_dir import RunDir

RECORDS = (
    "config.yaml",
    "log.txt",
    "metrics.jsonl",
    "run_info.json",
    "sparsity_decisions.json",
    "status.json",
    "study.json",  # what the run was for (study_runs.sh): make_table keeps screening runs out of means
)
LOGS = ("log.txt", "metrics.jsonl")  # of RECORDS, the ones kept compressed
EVAL_RECORDS = "eval_*.json"
MASKS = "sparsity_masks.jsonl"
# The per-layer mask log is over half of the committed results' bytes at full precision; at 4
# significant digits (far finer than any of its statistics varies from step to step) it compresses
# 3.3x smaller.
MASK_DIGITS = 4
SITE_PACKAGES = re.compile(
    r"/[^\s\"'=:]*/site-packages/"
)  # an installed library's folder, whatever the machine
MACHINE_PREFIXES = ("/tmp/", "/opt/", "/home/", "/root/")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs_dirs", nargs="+", type=Path, metavar="RUNS_DIR")
    ap.add_argument("--to", type=Path, required=True, help="where each run's folder goes")
    ap.add_argument(
        "--replace",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="literal text swapped in every copied text file; any /.../site-packages/ always "
        "becomes "
        "site-packages/",
    )
    ap.add_argument(
        "--check-prefix",
        action="append",
        default=None,
        metavar="PREFIX",
        help=f"a machine path that must not be left in any file (default: "
        f"{' '.join(MACHINE_PREFIXES)})",
    )
    ap.add_argument("--overwrite", action="store_true", help="replace runs already under --to")
    args = ap.parse_args(argv)
    bad = [r for r in args.replace if "=" not in r or not r.split("=", 1)[0]]
    if bad:
        ap.error(f"--replace {bad[0]!r}: expected OLD=NEW with a non-empty OLD")
    return args


def find_runs(runs_dirs: list[Path]) -> list[Path]:
    runs = [
        d for root in runs_dirs for d in sorted(root.iterdir()) if RunDir(d).config_file.is_file()
    ]
    names = [r.name for r in runs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(
            f"study_import: runs of the same name in several RUNS_DIRs: {', '.join(twice)}"
        )
    return runs


def replaced(text: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        text = text.replace(old, new)
    return SITE_PACKAGES.sub("site-packages/", text)


def import_run(
    run: Path, staging: Path, pairs: list[tuple[str, str]], prefixes: tuple[str, ...]
) -> list[str]:
    """The run's records into `staging/<name>`; returns the problems (paths of the machine left in a
    file)."""
    dest = staging / run.name
    dest.mkdir()
    sources = [run / name for name in RECORDS if (run / name).is_file()] + sorted(
        run.glob(EVAL_RECORDS)
    )
    problems = []
    for source in sources:
        text = replaced(source.read_text(encoding="utf-8"), pairs)
        left = [p for p in prefixes if p in text]
        if left:
            problems.append(
                f"{run.name}/{source.name}: still holds {', '.join(left)} after the replacements"
            )
        if source.name in LOGS:
            compressed.write_xz(text.encode("utf-8"), dest / source.name)
        else:
            (dest / source.name).write_text(text, encoding="utf-8")
    if (
        run / MASKS
    ).is_file():  # per-layer statistics of every logged step: large, kept for whoever wants them
        compressed.write_xz(rounded_lines((run / MASKS).read_bytes()), dest / MASKS)
    return problems


def _rounded(value, digits: int):
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {key: _rounded(item, digits) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item, digits) for item in value]
    return value


def rounded_lines(data: bytes, digits: int = MASK_DIGITS) -> bytes:
    """A JSON-lines log with every float at `digits` significant digits; a line that is not a JSON
    object (one cut by a kill) is kept as it is."""
    out = []
    for line in data.decode("utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        out.append(json.dumps(_rounded(record, digits)) if isinstance(record, dict) else line)
    return ("\n".join(out) + "\n").encode("utf-8") if out else b""


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = [str(d) for d in args.runs_dirs if not d.is_dir()]
    if missing:
        raise SystemExit(f"study_import: no such folder: {', '.join(missing)}")
    runs = find_runs(args.runs_dirs)
    if not runs:
        where = ", ".join(map(str, args.runs_dirs))
        raise SystemExit(f"study_import: no run (a folder holding config.yaml) in {where}")
    existing = [r.name for r in runs if (args.to / r.name).exists()]
    if existing and not args.overwrite:
        raise SystemExit(
            f"study_import: already under {args.to}: {', '.join(existing)} (--overwrite replaces "
            f"them)"
        )
    pairs = [tuple(r.split("=", 1)) for r in args.replace]
    prefixes = tuple(args.check_prefix or MACHINE_PREFIXES)
    args.to.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        dir=args.to, prefix=".import-"
    ) as tmp:  # nothing lands until all is clean
        staging = Path(tmp)
        problems = [p for run in runs for p in import_run(run, staging, pairs, prefixes)]
        if problems:
            print("study_import: nothing written:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        for run in runs:
            if (args.to / run.name).exists():
                shutil.rmtree(args.to / run.name)
            (staging / run.name).rename(args.to / run.name)
    print(f"imported {len(runs)} runs into {args.to}: {', '.join(r.name for r in runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
