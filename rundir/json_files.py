"""One parser for the JSON files a run directory holds (metrics.jsonl lines, status.json, eval
results, jobs.json), torch-free, for every reader: whatever the text, it returns a value or raises
`ValueError` saying why, so a reader turns any damaged or hostile file into "unreadable <file>:
<why>" instead of a traceback.

Beyond malformed text, `json.loads` fails in ways that are not `JSONDecodeError`: an integer of more
digits than Python converts (a ValueError of its own), nesting deeper than the interpreter's
recursion (RecursionError), and an integer that parses but overflows every float it later meets
(OverflowError in the reader). Integers are therefore bounded to 64 bits here, where the text is
read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_INT_DIGITS = 19  # |n| < 10**19 covers every int64: steps, job ids, sizes


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are read)")
    return int(text)


def parse_json(data: str | bytes) -> Any:
    """`json.loads(data)` with integers bounded to 19 digits; ValueError (one line, why) for
    anything it cannot read: malformed text, bytes that are not UTF-8, nesting too deep, an integer
    too long."""
    try:
        return json.loads(data, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    except (
        ValueError
    ) as e:  # JSONDecodeError, UnicodeDecodeError and the integer bound are ValueErrors
        raise ValueError(str(e).splitlines()[0][:200]) from None


def read_json(path: Path) -> dict | None:
    """A JSON object file of the run directory; None if absent or unreadable (a table never raises
    for one). Only a regular file is opened: a FIFO planted there would block the reader."""
    if not Path(path).is_file():
        return None
    try:
        value = parse_json(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
