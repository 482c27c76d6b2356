"""`metrics.jsonl`: one JSON object per logged step, written by rank 0 only. A line's `step` is the number of steps
done (see `metrics_format`: lines of older runs counted from 0, and `steps_done` reads both).

On resume, lines for steps the checkpoint does not cover are dropped first: the resumed run logs them again, so an
interrupted-then-resumed run leaves the same file as an uninterrupted one.
"""

import json
import math
from pathlib import Path
from typing import Any

from models.safe_io import atomic_write_text

from .metrics_format import steps_done

# Fields that measure the machine rather than the computation; they differ between otherwise identical runs.
TIMING_FIELDS = ("images_per_s", "step_time_s", "data_time_s", "time", "max_mem_mb")


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible as strings
    return value


class MetricsLog:
    def __init__(self, path: Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """Keep only lines logged with at most `step` steps done (those a run resumed at `step` will not log
        again); 0 empties the file."""
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if steps_done(json.loads(line)) <= step:
                    kept.append(line)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):  # a line cut by a kill mid-write
                break
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))  # a kill here keeps the old file

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps({k: _plain(v) for k, v in record.items()})
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]
