"""The evaluation side of a run's summary: one eval_linear.py result file read into an `EvalRecord`
(its numbers checked: a text, NaN or a value outside 0-100 is never tabulated), and whether it
evaluated the run's current teacher.
"""

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from configs import ConfigError
from configs.eval_schema import EvalConfig, protocol, protocol_changes
from configs.load import load_structured_text
from rundir.digests import recorded_digest
from rundir.json_files import parse_json
from rundir.layout import EVAL_RESULT
from rundir.run_dir import RunDir

COMPLETE, PARTIAL, FAILED, MISSING, UNREADABLE = (
    "complete",
    "partial",
    "failed",
    "missing",
    "unreadable",
)
# an evaluation of another teacher than the run's current one (the run was trained again since)
STALE = "stale"
KNN_SHOWN_K = 20  # the k-NN column of the table; dinov2's usual headline k (all k stay in the CSV)


def short_text(text: str, limit: int = 120) -> str:
    """`text` on one line, cut to `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def as_float(value) -> float | None:
    try:
        return float(value)  # NaN/inf are logged as strings ("nan"); float() reads them back
    except (TypeError, ValueError):
        return None


def shown_k(knn: dict) -> int | None:
    """The k of the table's k-NN column: KNN_SHOWN_K if evaluated, else the nearest k evaluated."""
    if not knn:
        return None
    return KNN_SHOWN_K if KNN_SHOWN_K in knn else min(knn, key=lambda k: (abs(k - KNN_SHOWN_K), k))


@dataclass
class EvalResults:
    """The numbers of one eval_linear.py result: shared by a result file's record and a run's
    summary."""

    top1: float | None = None
    top5: float | None = None
    knn: dict = field(default_factory=dict)  # {k: top-1 %}
    best_C: float | None = None
    solver: str = ""
    n_val: int | None = None  # validation images behind top-1
    # where the probe's protocol differs from the default one ("knn.temperature=0.1", ...): () for
    # the default
    protocol_changes: tuple = ()
    # C values of the sweep whose fit stopped at linear.max_iter, and whether the final refit
    # converged (records written before these were recorded: unknown, () and None)
    unconverged_C: tuple = ()
    final_converged: bool | None = None

    @property
    def knn_k(self) -> int | None:
        return shown_k(self.knn)

    @property
    def knn_top1(self) -> float | None:
        return self.knn.get(self.knn_k)


@dataclass(kw_only=True)
class EvalRecord(EvalResults):
    """One eval_linear.py result file: the run's own evaluation or a baseline's."""

    path: str
    status: str = MISSING  # complete | missing | unreadable | stale
    reason: str = ""
    seconds: float | None = None
    checkpoint_sha256: str = ""  # what it evaluated


def _percentage(value, key: str) -> float | None:
    """`value` (the result's `key`) as a top-k accuracy: None when absent or null (not measured,
    e.g. a k-NN-only result); ValueError for anything else that is not a finite number from 0 to 100
    (a text, NaN, inf: never tabulated)."""
    if value is None:
        return None
    number = as_float(value) if not isinstance(value, bool) else None
    if number is None or not math.isfinite(number) or not 0.0 <= number <= 100.0:
        raise ValueError(f"{key} is {short_text(repr(value), 24)}, not a percentage")
    return number


def _knn_top1(value) -> float | None:
    """eval_linear.py writes {k: {"top1": .., "top5": ..}}; a bare number per k is read as top-1. A
    k whose value is not a number (null, "nan") has no result and is left out; a number outside
    0-100 is a ValueError."""
    top1 = as_float(value.get("top1")) if isinstance(value, dict) else as_float(value)
    if top1 is None or not math.isfinite(top1):
        return None
    return _percentage(top1, "top1")


def read_eval_record(path: Path, other_data: bool = False) -> EvalRecord:
    """One result file of eval_linear.py; status says whether it was there and readable. A probe of
    other data than the run's own is read only when asked for (`other_data`: `make_table.py --eval
    LABEL`), never as the run's."""
    record = EvalRecord(path=str(path))
    if not path.is_file():
        if os.path.lexists(path):  # a FIFO (whose read would block), a directory, a dangling link
            record.status, record.reason = UNREADABLE, f"{path.name}: not a regular file"
        return record
    try:
        result = parse_json(path.read_bytes())
    except (OSError, ValueError) as e:
        record.status, record.reason = UNREADABLE, short_text(f"{path.name}: {e}", 80)
        return record
    return eval_record_of(result, path, other_data)


def eval_record_of(result, path: Path, other_data: bool = False) -> EvalRecord:
    """`read_eval_record` of the parsed contents `result` of the file at `path`."""
    record = EvalRecord(path=str(path))
    try:
        if not isinstance(result, dict):
            raise ValueError("not a JSON object")
        dataset = result.get("dataset")
        # through output=
        if isinstance(dataset, dict) and dataset.get("own") is False and not other_data:
            raise ValueError(
                f"a probe of other data ({dataset.get('other_because', 'not the run data')}), not "
                f"the "
                "run's record"
            )
        changes = result.get("protocol_changes")
        changes = (
            changes
            if isinstance(changes, list)
            else _older_protocol_changes(result.get("eval_config"))
        )
        record.protocol_changes = tuple(str(change) for change in changes)
        record.top1, record.top5 = (
            _percentage(result.get("top1"), "top1"),
            _percentage(result.get("top5"), "top5"),
        )
        record.knn = {
            int(k): top1
            for k, v in (result.get("knn") or {}).items()
            if (top1 := _knn_top1(v)) is not None
        }
    except (ValueError, TypeError, AttributeError) as e:
        record.status, record.reason = UNREADABLE, short_text(f"{path.name}: {e}", 80)
        return record
    record.best_C, record.seconds = as_float(result.get("best_C")), as_float(result.get("seconds"))
    record.solver = str(result.get("solver", ""))
    record.checkpoint_sha256 = str(result.get("checkpoint_sha256") or "")
    record.n_val = int(result["n_val"]) if isinstance(result.get("n_val"), int) else None
    capped = result.get("unconverged_C")
    record.unconverged_C = (
        tuple(c for c in map(as_float, capped) if c is not None) if isinstance(capped, list) else ()
    )
    converged = result.get("final_converged")
    record.final_converged = converged if isinstance(converged, bool) else None
    record.status = COMPLETE
    return record


def _older_protocol_changes(eval_config) -> list:
    """The protocol changes of a record written before records listed them, from its eval_config
    text; [] where that cannot be read (the record is then taken as the default protocol's)."""
    if not isinstance(eval_config, str):
        return []
    try:
        return protocol_changes(load_structured_text(EvalConfig, eval_config))
    except (ConfigError, ValueError, TypeError):
        return []


def stale_reason(record: EvalRecord, run_dir: Path) -> str:
    """Why the run's own evaluation is not of its current teacher ("" when it is, or when nothing
    tells: a run published without weights keeps the teacher's digest file, one of an older version
    may have none)."""
    try:
        current = recorded_digest(RunDir(run_dir).teacher)
    except (OSError, ValueError):  # an unreadable digest file tells nothing
        return ""
    if not current or not record.checkpoint_sha256 or record.checkpoint_sha256 == current:
        return ""
    return (
        f"of an earlier teacher (sha256 {record.checkpoint_sha256[:12]}, now {current[:12]}): the "
        f"run was "
        "trained again since; rerun eval_linear.py"
    )


OWN_DATA = "the run's own"


def _asked_settings(cfg: EvalConfig, own: bool = False) -> dict:
    """What a probe's record depends on beyond the run: its data (`OWN_DATA` for the run's own,
    however it was spelled: no data setting, or a root that is the training root's), its protocol,
    which weights and MLPs it probed (not how it ran: device, solver, workers, caching, where it
    wrote its index)."""
    data = OWN_DATA if own or cfg.data == EvalConfig().data else vars(cfg.data)
    return {
        "data": data,
        "protocol": protocol(cfg),
        "checkpoint": cfg.checkpoint,
        "prune_mlp": cfg.prune_mlp,
    }


def probe_arguments(cfg: EvalConfig) -> list[str]:
    """The settings of `cfg` a probe's record depends on that differ from the default probe's, as
    key=value."""
    default = EvalConfig()
    data = [f"data.{k}={v}" for k, v in vars(cfg.data).items() if v != getattr(default.data, k)]
    others = [
        f"{k}={getattr(cfg, k)}"
        for k in ("checkpoint", "prune_mlp")
        if getattr(cfg, k) != getattr(default, k)
    ]
    return data + protocol_changes(cfg) + others


def _recorded_config(result: dict) -> EvalConfig | None:
    try:
        return load_structured_text(EvalConfig, result["eval_config"])
    except (KeyError, ConfigError, ValueError, TypeError):
        return None


def find_probe(run_dir: Path, asked: EvalConfig, stale_too: bool = False) -> EvalRecord | None:
    """The run's probe record that an `eval_linear.py --run RUN` with the settings `asked` wrote,
    readable and of the run's current teacher, or None. Found by what each record says it probed
    (its eval_config), not by its file name: a probe of other data is named after that data, and two
    probes of one run never share a name. A k-NN-only record does not answer a probe that asked for
    the linear probe too; one of mode=both answers either. `stale_too`: where no record is of the
    current teacher, the first of an earlier one (the tables show it as stale, never its
    numbers)."""
    stale = None
    wanted = _asked_settings(asked)
    modes = {asked.mode, "both"}
    for path in sorted(RunDir(run_dir).path.glob("eval_*.json")):
        if not path.is_file():  # a FIFO (whose read would block), a directory, a dangling link
            continue
        try:
            result = parse_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        recorded = _recorded_config(result) if isinstance(result, dict) else None
        older = (
            recorded is None and path.name == EVAL_RESULT
        )  # a record that kept no settings: the usual probe's
        recorded = EvalConfig() if older else recorded
        dataset = result.get("dataset") if isinstance(result, dict) else None
        own = (
            isinstance(dataset, dict) and dataset.get("own") is True
        )  # eval_linear.py's own verdict on its data
        if (
            recorded is None
            or recorded.mode not in modes
            or _asked_settings(recorded, own) != wanted
        ):
            continue
        record = eval_record_of(result, path, other_data=not older)
        if record.status != COMPLETE:
            continue
        if not stale_reason(record, run_dir):
            return record
        stale = stale or record
    return stale if stale_too else None
