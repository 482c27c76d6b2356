"""The seconds each test file took on two cores, which the test session uses to start the longest files first.

With three workers and one file per worker at a time (`--dist loadfile`), the files' order decides how long the last
worker runs alone: collected by name, the long training tests came last. `tests/conftest.py` sorts the files by
`file_seconds.json` (longest first; a file not listed counts as short, so stale numbers only cost time). Refresh:

    python -m pytest --durations=0 -p no:cacheprovider > durations.log; python tests/file_seconds.py durations.log
"""

import collections
import json
import re
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
MIN_SECONDS = 10  # shorter files keep their collected order


def read_table() -> dict[str, float]:
    try:
        return json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return {}


def from_durations(log: str) -> dict[str, int]:
    """Per-file sums of pytest's `--durations=0` lines (setup, call and teardown)."""
    seconds = collections.Counter()
    for line in log.splitlines():
        found = re.match(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+?)::", line)
        if found:
            seconds[found.group(2)] += float(found.group(1))
    return {name: round(s) for name, s in seconds.most_common() if s >= MIN_SECONDS}


if __name__ == "__main__":
    table = from_durations(Path(sys.argv[1]).read_text())
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE}: {len(table)} files, {sum(table.values())} s")
