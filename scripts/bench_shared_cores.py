"""The embedded default on CPU cores it shares with another torch process, against the same run on
idle cores.

    python scripts/bench_shared_cores.py [--steps 40] [--out runs/bench_shared_cores.json]

Four short runs of `train.py` (the embedded default, `train.max_steps=STEPS`), one after the other:
idle and beside a neighbour (a torch matmul loop with torch's default threads and OpenMP settings,
as another user's job would run), each with OpenMP's idle threads sleeping
(`OMP_WAIT_POLICY=PASSIVE`, what train.py sets unless told otherwise) and with the OpenMP runtime's
default (spinning a while before sleeping). Prints each run's wall time and median images/s and the
ratios to the idle run of the same policy; writes them as JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rundir.run_dir import RunDir

REPO = Path(__file__).resolve().parents[1]
NEIGHBOUR = "import torch\na = torch.randn(1500, 1500)\nwhile True:\n    a @ a\n"
POLICIES = {
    "passive": "PASSIVE",
    "runtime default": "",
}  # "" : unset for libgomp (train.py's setdefault keeps it)


def one_run(steps: int, policy: str, beside_neighbour: bool, folder: Path) -> dict:
    neighbour = None
    if beside_neighbour:
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=env)
        time.sleep(3)  # its threads busy before the run starts
    run = folder / f"{'loaded' if beside_neighbour else 'idle'}_{policy or 'default'}"
    start = time.perf_counter()
    try:
        subprocess.run(
            [
                sys.executable,
                str(REPO / "train.py"),
                "--output-dir",
                str(run),
                f"train.max_steps={steps}",
            ],
            env={**os.environ, "OMP_WAIT_POLICY": policy},
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    wall = time.perf_counter() - start
    rates = [record["images_per_s"] for record in RunDir(run).read_metrics()][2:]
    return {"wall_s": round(wall, 1), "median_images_per_s": round(statistics.median(rates), 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=40, help="training steps per run (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench_shared_cores.json"))
    args = parser.parse_args(argv)
    if args.steps < 15:
        parser.error("--steps must be at least 15 (the first two logged windows are start-up)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, policy in POLICIES.items():
            idle = one_run(args.steps, policy, False, Path(tmp))
            loaded = one_run(args.steps, policy, True, Path(tmp))
            row = {
                "policy": name,
                "idle": idle,
                "beside_neighbour": loaded,
                "wall_ratio": round(loaded["wall_s"] / idle["wall_s"], 2),
            }
            rows.append(row)
            print(
                f"{name:>16}: idle {idle['wall_s']:.0f} s ({idle['median_images_per_s']} "
                f"images/s), beside a "
                f"neighbour {loaded['wall_s']:.0f} s ({loaded['median_images_per_s']} images/s): "
                f"{row['wall_ratio']:.2f}x",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"steps": args.steps, "cores": os.cpu_count(), "rows": rows}, indent=1) + "\n"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
