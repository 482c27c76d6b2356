"""Another process holding a run directory's lock, as a trainer or an evaluation would (shared by
tests/training and tests/evaluation): a deterministic stand-in for "a second writer is running
there"."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOLD = (
    "import sys, time; sys.path.insert(0, sys.argv[2]); from rundir import lock as run_lock; "
    "held = run_lock.lock(sys.argv[1]); print('held', held.held, flush=True); time.sleep(600)"
)


def hold_lock(run: Path) -> subprocess.Popen:
    """Start a process that holds `run`'s lock until killed; returns once it holds it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run), str(REPO)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held True"
    return holder
