"""The field types of the JSON records a run keeps (status.json, a metrics.jsonl line,
run_info.json, a jobs.json entry), checked where they are read: JSON that parses can still hold a
text where a step belongs, a number where a list does. A field of the wrong type makes the record
unreadable with one line naming the file and the field (`UnreadableRecord`), which each reader turns
into what a damaged file means there (a status unknown, a metrics line skipped), never a traceback
further on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NUMBER = (int, float, str)  # logged numbers: NaN and inf are written as strings ("nan")


class UnreadableRecord(ValueError):
    """`unreadable <file>: <field>: <why>`"""


@dataclass(frozen=True)
class Field:
    """A record's field: the JSON types it may hold (None is always allowed: absent or null), and
    for a list the type of its items."""

    name: str
    types: tuple
    items: type | None = None

    def problem(self, value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool) and bool not in self.types:  # JSON true is not a step
            return f"a boolean where {self._expected()} belongs"
        if not isinstance(value, self.types):
            return f"{type(value).__name__} {_short(value)} where {self._expected()} belongs"
        if self.items is not None:
            bad = next(
                (v for v in value if not isinstance(v, self.items) or isinstance(v, bool)), None
            )
            if bad is not None:
                return f"holds {_short(bad)} where every item is {self.items.__name__}"
        return ""

    def _expected(self) -> str:
        names = [t.__name__ for t in self.types]
        return (" or ".join(names)) + (f" of {self.items.__name__}" if self.items else "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def checked(record: Any, fields: tuple[Field, ...], file: str) -> dict:
    """`record` when it is a JSON object whose `fields` hold their types; `UnreadableRecord`
    otherwise."""
    if not isinstance(record, dict):
        raise UnreadableRecord(f"unreadable {file}: not a JSON object")
    for field in fields:
        problem = field.problem(record.get(field.name))
        if problem:
            raise UnreadableRecord(f"unreadable {file}: {field.name}: {problem}")
    return record


STATUS_FIELDS = (
    Field("state", (str,)),
    Field("step", (int,)),
    Field("reason", (str,)),
    Field("resumed_at", (list,), items=int),
    Field("time", (str,)),
    Field("run_id", (str,)),
)
METRICS_LINE_FIELDS = (
    Field("step", (int,)),
    Field("format", (int,)),
    Field("phase", (str,)),
    Field("loss", NUMBER),
    Field("images_per_s", NUMBER),
    Field("global_batch", (int,)),
    Field("time", NUMBER),
    Field("gpu_mem_outside_mb", NUMBER),
)
RUN_INFO_FIELDS = (
    Field("device", (str,)),
    Field("device_name", (str,)),
    Field("data_fingerprint", (str,)),
    Field("world_size", (int,)),
    Field("batch_size_per_gpu", (int,)),
)
JOB_FIELDS = (
    Field("kind", (str,)),
    Field("job_id", (str,)),
    Field("cluster", (str,)),
    Field("submitted", (str,)),
    Field("args", (list,), items=str),
)
