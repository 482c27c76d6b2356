"""Schema fields that carry their own valid range, and the check that walks a config against them.

    base_lr: float = value(0.004, gt=0)                      # a number in a range (NaN and inf never pass)
    arch: str = value("vit_large", choices=ARCHS)            # one of a set
    global_crops_scale: List[float] = value([0.32, 1.0], gt=0, le=1, pair=True)   # [min, max] in range

`check_fields(cfg)` returns the first violation as "key=value is out of range: must be ..." (or "...
is not one of ...": the message a user reads), or None. Integers are also bounded by `INT_MAX`,
whatever their range says. Consistency between fields (warm-up shorter than training, crops
multiples of the patch, ...) is checked where the schema is loaded (`load.py`, `eval_schema.py`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# Every integer of a config (a count, a size, a step, a seed) is at most this: it then fits the
# int32/int64 of tensors, numpy seeds and arithmetic such as seed + 1_000_003 * step, which a Python
# int of any size would overflow only later, after the run directory exists.
INT_MAX = 2**31 - 1


def _too_large(v: Any) -> bool:
    if isinstance(v, list):
        return any(map(_too_large, v))
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT_MAX


@dataclass(frozen=True)
class Range:
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: Sequence[Any] | None = None
    pair: bool = False  # a list [min, max] with min <= max, each in range
    nonempty: bool = False  # a non-empty list, each element in range
    length: int | None = None  # a list of exactly this many elements, each in range

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.choices)
        parts = [
            f"{op} {bound:g}"
            for op, bound in ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le))
            if bound is not None
        ]
        what = " and ".join(parts) or "finite"
        if self.pair:
            return f"[min, max] with min <= max, each {what}"
        if self.nonempty:
            return f"a non-empty list, each {what}"
        if self.length is not None:
            return f"a list of {self.length} values, each {what}"
        return what

    def accepts(self, v: Any) -> bool:
        if self.choices is not None:
            return v in self.choices
        if self.pair:
            return (
                isinstance(v, list)
                and len(v) == 2
                and all(map(self._number_ok, v))
                and v[0] <= v[1]
            )
        if self.nonempty:
            return isinstance(v, list) and len(v) > 0 and all(map(self._number_ok, v))
        if self.length is not None:
            return isinstance(v, list) and len(v) == self.length and all(map(self._number_ok, v))
        return self._number_ok(v)

    def _number_ok(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        return (
            (self.gt is None or v > self.gt)
            and (self.ge is None or v >= self.ge)
            and (self.lt is None or v < self.lt)
            and (self.le is None or v <= self.le)
        )


LIBRARY_LIMITS = (
    "choices",
    "gt",
    "ge",
    "lt",
    "le",
)  # the Range arguments a library field's metadata may carry

# What a field may declare about itself besides its range, so that no list elsewhere has to be kept
# in step with the schema (`flagged_keys` reads them):
FLAGS = (
    # how a run executes or is observed, never what it computes: may change when a run resumes, and
    # seeds of one configuration may differ in it (configs.load.RESUMABLE_CHANGES, the tables'
    # grouping)
    "execution",
    # acts at the sparse-to-dense switch, so a sweep turns it off (to its default) in runs without
    # one (configs.sweep.SWITCH_KEYS)
    "at_switch",
)


def value(default: Any, *, execution: bool = False, at_switch: bool = False, **limits) -> Any:
    """A dataclass field with `default`, the valid range `limits` (see `Range`; none: any value of
    the type) and the `FLAGS` that apply to it."""
    meta = {"range": Range(**limits)} if limits else {}
    meta.update({flag: True for flag, on in zip(FLAGS, (execution, at_switch)) if on})
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def check_fields(cfg: Any, prefix: str = "") -> str | None:
    """The first field of `cfg` (a schema dataclass, walked recursively) outside its range, as a
    message."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            problem = check_fields(v, key + ".")
            if problem:
                return problem
            continue
        rng = field_range(f)
        if _too_large(v):
            within = f"{rng.describe()} and " if rng is not None and rng.choices is None else ""
            return (
                f"{key}={v!r} is out of range: must be {within}at most {INT_MAX} in absolute value"
            )
        if rng is not None and not rng.accepts(v):
            if rng.choices is not None:
                return f"{key}={v!r} is not one of {', '.join(str(c) for c in rng.choices)}"
            return f"{key}={v!r} is out of range: must be {rng.describe()}"
        if rng is None and isinstance(v, float) and not math.isfinite(v):
            return f"{key}={v!r} is out of range: must be finite"
    return None


def schema_fields(schema: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted key, field) of every leaf field of a schema class, its sections walked in schema
    order."""
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if factory is not None and dataclasses.is_dataclass(factory):
            yield from schema_fields(factory, key + ".")
        else:
            yield key, f


def field_range(f: dataclasses.Field) -> Range | None:
    """A field's valid range: from `value(...)`, or from the plain metadata of a field the
    `sparsity` library declares ("choices", "gt", "ge", "lt", "le":
    `sparsity.options.ConverterOptions`, which cannot import this)."""
    if "range" in f.metadata:
        return f.metadata["range"]
    limits = {key: f.metadata[key] for key in LIBRARY_LIMITS if key in f.metadata}
    return Range(**limits) if limits else None


def schema_ranges(schema: type, prefix: str = "") -> dict:
    """{key: Range} of every ranged field of a schema class (for tests and documentation)."""
    return {
        key: rng for key, f in schema_fields(schema, prefix) if (rng := field_range(f)) is not None
    }


def flagged_fields(schema: type, flag: str) -> dict:
    """{dotted key: field} of a schema class's fields that carry `flag` (one of `FLAGS`), in schema
    order."""
    if flag not in FLAGS:
        raise ValueError(f"unknown field flag {flag!r}: one of {', '.join(FLAGS)}")
    return {key: f for key, f in schema_fields(schema) if f.metadata.get(flag)}


def flagged_keys(schema: type, flag: str) -> tuple:
    """The dotted keys of a schema class's fields that carry `flag` (one of `FLAGS`), in schema
    order."""
    return tuple(flagged_fields(schema, flag))
