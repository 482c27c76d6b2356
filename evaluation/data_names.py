"""The names a probe of other data than the run's own is written under:
`eval_linear_data_<label>.json`, the label read off the data (the folder's name, `digits`, and the
splits where they are not train/val), so that a table can be asked for it by that name
(`make_table.py --eval <label>`). Two data sets whose folders share a name keep apart: the second
gets the label plus a hash of its dataset, root and splits, and a warning says so."""

import hashlib
import json
import os
import re
from pathlib import Path

from rundir.json_files import parse_json

DEFAULT_SPLITS = ("train", "val")


def data_label(dataset: str, root: str, train_split: str, val_split: str) -> str:
    """`cifar10`, `digits`, `my_set_train-test`: letters, digits, `.`, `_` and `-` only (a file name
    anywhere)."""
    base = (
        "digits"
        if dataset == "digits"
        else os.path.basename(os.path.realpath(os.path.expanduser(root)) or "")
    )
    label = (
        base if (train_split, val_split) == DEFAULT_SPLITS else f"{base}_{train_split}-{val_split}"
    )
    label = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip(".-")[:80]
    return label or "data"


def data_identity(dataset: str, root: str, train_split: str, val_split: str) -> list:
    """What makes two probes' data the same: the kind, the resolved root and the two splits."""
    real = os.path.realpath(os.path.expanduser(root)) if root else ""
    return [dataset, real, train_split, val_split]


def hashed_label(identity: list, label: str) -> str:
    return f"{label}-{hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:8]}"


def recorded_identity(path: Path) -> list | None:
    """The data identity of the probe record at `path`; None where there is none to read (absent,
    unreadable, or written before records held one)."""
    try:
        record = parse_json(path.read_bytes())
        dataset, train, val = record["dataset"], record["train_dataset"], record["val_dataset"]
        return data_identity(dataset["name"], dataset["root"], train["split"], val["split"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
