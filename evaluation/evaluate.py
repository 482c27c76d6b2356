"""Evaluate a finished run: features of its final teacher, the logistic-regression probe and k-NN,
JSON out.

`evaluate_run(run_dir, eval_cfg)` reads `<run>/config.yaml` (the resolved training config: model,
crop size, dataset) and the teacher checkpoint, extracts (or reuses cached) train/val features, runs
the probe and/or k-NN as `eval_cfg.mode` says, writes `<run>/eval_linear.json` atomically and
appends one line to the results index. `eval_cfg.prune_mlp` 2:4-prunes the teacher's MLP linears as
the run's student ran them (`mlp_pruning.py`).
"""

import functools
import json
import logging
import os
import stat
import time
from pathlib import Path

import torch

from configs import ConfigError, load_config, to_yaml
from configs.eval_schema import protocol, protocol_changes, protocol_suffix
from configs.load import saved_value_matches
from data import build_dataset, make_eval_transform
from rundir.atomic import atomic_write_text, name_problem
from rundir.guard import eval_dir_problem
from rundir.layout import BASELINE_SUFFIXES, TEACHER, eval_result_name
from rundir.lock import lock
from rundir.run_dir import RunDir

from .data_names import data_identity, data_label, hashed_label, recorded_identity
from .features import (
    EvalInputError,
    Features,
    PixelFeatures,
    cache_key,
    dataset_settings,
    extract,
    load_cached,
    load_teacher,
    resolve_data,
    save_cached,
    transform_settings,
    weights_digest,
)
from .knn import knn_classify
from .logreg import build_solver, c_grid
from .mlp_pruning import MlpPruning, prune_teacher, resolve_mlp_pruning
from .probe import run_probe, unconverged_Cs

logger = logging.getLogger(__name__)

RESULT_FORMAT = 1
RANDOM_INIT = "random"  # checkpoint=random: the untrained backbone, the baseline a run must beat
# checkpoint=pixels: the eval transform's normalised pixels, no model (features.PixelFeatures)
PIXELS = "pixels"
# checkpoint value -> output / cache name suffix
BASELINES = {RANDOM_INIT: BASELINE_SUFFIXES["random_init"], PIXELS: BASELINE_SUFFIXES["pixels"]}
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def load_run_config(run_dir: Path):
    if not run_dir.is_dir():
        raise EvalInputError(f"run directory not found: {run_dir}")
    path = RunDir(run_dir).config_file
    if not path.is_file():
        raise EvalInputError(f"{path} not found: --run must be a directory written by train.py")
    try:
        return load_config(path)
    except ConfigError as e:
        raise EvalInputError(f"cannot read the run's config {path}: {e}") from None


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise EvalInputError(
            "device=cuda but no CUDA GPU is available (use device=auto or device=cpu)"
        )
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def append_index(path: Path, record: dict) -> None:
    """One JSON line, written with a single O_APPEND write so concurrent evaluations do not
    interleave; never through a symlink, and a FIFO never blocks (O_NONBLOCK; anything but a regular
    file is refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        raise EvalInputError(
            f"index={path}: cannot append to it ({e.strerror or e}); the result is written to "
            "the run's JSON all the same"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EvalInputError(
                f"index={path} is not a regular file; the result is in the run's JSON"
            )
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def check_target(path: Path, key: str) -> None:
    """Before any work: `path` (where `key` says a result goes) can be written as a file: a name its
    file system takes (with the temporary name it is written under), not a directory or other
    non-regular entry, its folder a directory. A bad target is reported now, not after the whole
    probe ran."""
    too_long = name_problem(path)
    if too_long:
        raise EvalInputError(f"{key}={str(path)[:80]}...: {too_long}")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise EvalInputError(f"{key}={path}: {e.strerror or e}") from None
    # the result would replace the link, or write where it points
    if mode is not None and stat.S_ISLNK(mode):
        raise EvalInputError(f"{key}={path} is a symlink: name the file itself")
    if mode is not None and stat.S_ISDIR(mode):
        raise EvalInputError(
            f"{key}={path} is a directory: name a file (e.g. {path / 'eval_linear.json'})"
        )
    if mode is not None and not stat.S_ISREG(mode):
        raise EvalInputError(
            f"{key}={path} is not a regular file (a FIFO, socket or device): name a file"
        )
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise EvalInputError(f"{key}={path}: {parent} is not a directory")
    folder = next((p for p in (parent, *parent.parents) if p.exists()), Path("."))
    if not os.access(folder, os.W_OK):
        raise EvalInputError(
            f"{key}={path}: {folder} is not writable (a read-only file system or folder)"
        )


def check_two_classes(labels: torch.Tensor, split: str) -> None:
    """A probe or k-NN over one class measures nothing (every prediction is right): refused with the
    count."""
    present = int(torch.unique(labels).numel())
    if present < 2:
        raise EvalInputError(
            f"the {split} split has images of {present} class{'es' if present != 1 else ''}: a "
            "linear probe and k-NN need at least 2 (check data.root and the split's class folders)"
        )


def _cached_or_extracted(
    path: Path, key: str, dataset, teacher, eval_cfg, device, amp, split: str
) -> Features:
    feats = load_cached(path, key, rows=len(dataset)) if eval_cfg.features.cache else None
    if feats is not None:
        logger.info("%s features: %s (cached)", split, path)
        return feats
    backbone, step = teacher()
    feats = extract(
        backbone,
        dataset,
        batch_size=eval_cfg.features.batch_size,
        step=step,
        device=device,
        num_workers=eval_cfg.features.num_workers,
        amp_dtype=amp,
        desc=f"{split} features",
    )
    if eval_cfg.features.cache:
        save_cached(path, key, feats)
    return feats


def _teacher(run_cfg, checkpoint: Path | None, mlp: MlpPruning | None):
    backbone, step = load_teacher(run_cfg, checkpoint)
    if mlp is not None and mlp.prune:
        prune_teacher(backbone, run_cfg)
    return backbone, step


def extract_run_features(
    run_dir: Path,
    run_cfg,
    eval_cfg,
    checkpoint: Path | None,
    device: torch.device,
    pixels: bool = False,
    mlp: MlpPruning | None = None,
) -> dict:
    """Train and val features of the run's teacher (`checkpoint` None: its random initialisation;
    `pixels`: the normalised pixels, no model; `mlp`: whether its MLP linears are 2:4-pruned, None =
    dense) and what they were computed from, on the run's dataset or the one `eval_cfg.data` names.
    Cached per split under `<run>/eval/`; the model is built only on a cache miss."""
    digest = PIXELS if pixels else weights_digest(run_cfg, checkpoint)
    data_cfg = resolve_data(run_cfg, eval_cfg.data)
    tsettings = transform_settings(run_cfg, eval_cfg.features)
    transform = make_eval_transform(tsettings["resize"], tsettings["crop"])
    amp = AMP_DTYPES[eval_cfg.features.amp_dtype] if device.type == "cuda" and not pixels else None
    precision = f"{device.type}-{eval_cfg.features.amp_dtype if amp is not None else 'fp32'}"
    if pixels:
        teacher = functools.cache(lambda: (PixelFeatures(), None))
    else:  # (backbone, step), built at most once
        teacher = functools.cache(lambda: _teacher(run_cfg, checkpoint, mlp))
    suffix = BASELINES[PIXELS] if pixels else BASELINES[RANDOM_INIT] if checkpoint is None else ""
    suffix += mlp.cache_suffix if mlp is not None else ""
    root = dataset_settings(data_cfg, "").get("root", "")  # resolved path; "" for digits
    dataset = {
        "name": data_cfg.dataset,
        "root": root,
        "from": "eval" if eval_cfg.data.dataset or eval_cfg.data.root else "run",
    }
    out = {
        "checkpoint_sha256": digest,
        "transform": tsettings,
        "precision": precision,
        "dataset": dataset,
    }
    splits = {"train": eval_cfg.data.train_split, "val": eval_cfg.data.val_split}
    datasets = {
        role: build_dataset(
            data_cfg, split=split, transform=transform, split_key=f"data.{role}_split"
        )
        for role, split in splits.items()
    }
    classes = {role: list(getattr(ds, "classes", [])) for role, ds in datasets.items()}
    if classes["train"] != classes["val"]:  # checked before any extraction
        raise EvalInputError(
            f"the {splits['train']} and {splits['val']} splits have different class folders "
            f"({len(classes['train'])} vs {len(classes['val'])}): labels would differ"
        )
    if hasattr(datasets["train"], "classes") and len(classes["train"]) < 2:
        raise EvalInputError(
            f"the {splits['train']} split has {len(classes['train'])} class folder(s): a linear "
            "probe and k-NN need at least 2 (check data.root)"
        )
    for role, split in splits.items():
        dsettings = {
            **dataset_settings(data_cfg, split),
            "n_images": len(datasets[role]),
            "classes": classes[role],
        }
        key = cache_key(
            digest,
            tsettings,
            dsettings,
            run_cfg.student,
            precision,
            mlp.cache_tag if mlp is not None else "dense",
        )
        path = RunDir(run_dir).eval_dir / f"features_{split}{suffix}.pt"
        out[role] = _cached_or_extracted(
            path, key, datasets[role], teacher, eval_cfg, device, amp, split
        )
        out[f"{role}_dataset"] = {
            "root": root,
            **{k: v for k, v in dsettings.items() if k != "classes"},
        }
    check_two_classes(out["train"].y, splits["train"])
    out["checkpoint_step"] = out["train"].step
    out["n_classes"] = (
        len(classes["train"]) or int(max(out["train"].y.max(), out["val"].y.max())) + 1
    )
    return out


def linear_probe(
    train: Features,
    val: Features,
    n_classes: int,
    eval_cfg,
    device: torch.device,
    every_fit: bool = False,
) -> dict:
    lin = eval_cfg.linear
    solver = build_solver(eval_cfg.solver, lin.max_iter, lin.tol, lin.history_size, lin.precision)
    probe_device = device if solver.name == "torch" else torch.device("cpu")
    Cs = c_grid(lin.c_min_power, lin.c_max_power, lin.n_c)
    result = run_probe(
        solver,
        train.x.to(probe_device),
        train.y.to(probe_device),
        val.x.to(probe_device),
        val.y.to(probe_device),
        n_classes=n_classes,
        Cs=Cs,
        holdout_fraction=lin.holdout_fraction,
        seed=lin.seed,
        every_fit=every_fit,
    )
    return {
        "top1": result.top1,
        "top5": result.top5,
        "best_C": result.best_C,
        "C_curve": result.C_curve,
        "final_loss": result.final.loss,
        "final_n_iter": result.final.n_iter,
        "final_converged": result.final.converged,
        "unconverged_C": unconverged_Cs(result.C_curve),
        "solver": solver.name,
        "linear_precision": result.final.precision,
        "linear_seconds": round(result.seconds, 3),
    }


def pixel_probe_note(train: Features, val: Features, eval_cfg) -> str:
    """What a raw-pixel probe is about to do, and why it takes long: many more features than a
    network's, and the weakly regularised fits (large C) of raw pixels run up to the iteration
    limit."""
    lin = eval_cfg.linear
    return (
        f"probing raw pixels: {train.x.shape[1]} features per image (3 x crop x crop), "
        f"{len(train.y)} train and "
        f"{len(val.y)} val images, {lin.n_c} values of C then one refit, each fit up to "
        f"linear.max_iter="
        f"{lin.max_iter} iterations: far longer than a network's features (on a CPU, the weakly "
        f"regularised fits "
        "of large C take minutes each); a line per fit follows"
    )


DEFAULT_VAL_SPLIT = (
    "val"  # where a run's probe reports, by convention (configs.eval_schema.EvalDataConfig)
)


def other_data(run_dir: Path, run_cfg, eval_cfg) -> str:
    """'' when the probe runs on the run's own data: its dataset, the data.root it was trained with
    (for a root given as an interpolation, the fingerprint of the value it resolved to then, so that
    an environment pointing elsewhere now is noticed), the training split as train_split and the
    default val split; else why not, in words. Only a probe of the run's own data is the run's
    record (`eval_linear.json`)."""
    data_cfg = resolve_data(run_cfg, eval_cfg.data)
    if data_cfg.dataset != run_cfg.data.dataset:
        return f"data.dataset={data_cfg.dataset}, the run trained on {run_cfg.data.dataset}"
    if data_cfg.dataset == "imagenet_folder":
        try:
            same_root = saved_value_matches(
                RunDir(run_dir).config_file.read_text(),
                "data.root",
                data_cfg.root,
                same=lambda old, new: _real(old) == _real(new),
            )
        except (OSError, ConfigError):
            same_root = False
        if not same_root:
            return f"data.root={data_cfg.root} is not the root the run was trained with"
    if eval_cfg.data.train_split != run_cfg.data.split:
        return (
            f"data.train_split={eval_cfg.data.train_split}, the run trained on {run_cfg.data.split}"
        )
    if eval_cfg.data.val_split != DEFAULT_VAL_SPLIT:
        return f"data.val_split={eval_cfg.data.val_split}, not {DEFAULT_VAL_SPLIT}"
    return ""


def _real(path) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def other_data_label(run_cfg, eval_cfg) -> tuple[str, list]:
    """The readable label of a probe's data (`data_names.data_label`) and what identifies that
    data."""
    data_cfg = resolve_data(run_cfg, eval_cfg.data)
    parts = (data_cfg.dataset, data_cfg.root, eval_cfg.data.train_split, eval_cfg.data.val_split)
    return data_label(*parts), data_identity(*parts)


def writes_in_run_dir(run_dir: Path, eval_cfg) -> bool:
    """Whether this evaluation writes into the run directory (its result, or the feature cache under
    eval/)."""
    if eval_cfg.features.cache or not eval_cfg.output:
        return True
    return run_dir.resolve() in Path(eval_cfg.output).resolve().parents


def evaluate_run(run_dir: Path, eval_cfg) -> dict:
    """Evaluate `run_dir` as `eval_cfg` (`configs.EvalConfig`) says; returns the record written to
    the JSON. An evaluation that writes into the run directory holds its lock (`rundir.lock.lock`)
    throughout, as the trainer does: one writer at a time, so a trainer still running there, or a
    second evaluation, is refused (`RunDirInUse`, naming the directory) before anything is read or
    written."""
    start = time.perf_counter()
    run_dir = Path(run_dir)
    run_cfg = load_run_config(
        run_dir
    )  # a directory that is not a run is reported as such, before any lock file
    if not writes_in_run_dir(run_dir, eval_cfg):
        return _evaluate(run_dir, run_cfg, eval_cfg, start)
    held = lock(
        run_dir, otherwise=""
    )  # RunDirInUse / RunDirProblem: a CommandError, one line, exit 1
    try:
        return _evaluate(run_dir, run_cfg, eval_cfg, start)
    finally:
        held.release()


def _evaluate(run_dir: Path, run_cfg, eval_cfg, start: float) -> dict:
    if eval_cfg.output:
        check_target(Path(eval_cfg.output), "output")
    index_target = index_path(run_dir, eval_cfg.index)
    if index_target is not None:
        check_target(index_target, "index")
    problem = eval_dir_problem(run_dir) if eval_cfg.features.cache else ""
    if problem:  # the feature cache goes there
        raise EvalInputError(problem)
    baseline = eval_cfg.checkpoint if eval_cfg.checkpoint in BASELINES else None
    checkpoint = None if baseline else Path(eval_cfg.checkpoint or RunDir(run_dir).teacher)
    device = resolve_device(eval_cfg.device)
    mlp = resolve_mlp_pruning(eval_cfg.prune_mlp, run_cfg, has_model=baseline != PIXELS)
    elsewhere = other_data(run_dir, run_cfg, eval_cfg)
    label, identity = other_data_label(run_cfg, eval_cfg) if elsewhere else ("", [])
    if elsewhere:
        logger.warning(
            "evaluating other data than the run's own (%s): the result is named apart (_data_%s), "
            "never "
            "the run's record; `make_table.py --eval %s` tabulates such probes",
            elsewhere,
            label,
            label,
        )
    what = {"random": "the untrained backbone (baseline)", "pixels": "raw pixels (baseline)"}.get(
        baseline, f"checkpoint {checkpoint}"
    )
    logger.info(
        "evaluating %s of run %s: %s on %s, MLP weights %s (%s)",
        what,
        run_dir,
        {"both": "linear probe and k-NN", "linear": "linear probe", "knn": "k-NN"}[eval_cfg.mode],
        device.type,
        mlp.weights,
        mlp.reason,
    )
    feats = extract_run_features(
        run_dir, run_cfg, eval_cfg, checkpoint, device, pixels=baseline == PIXELS, mlp=mlp
    )
    train, val = feats["train"], feats["val"]
    record: dict = {
        "format": RESULT_FORMAT,
        "run": str(run_dir),
        "checkpoint": baseline or str(checkpoint),
        "checkpoint_step": feats["checkpoint_step"],
        "checkpoint_sha256": feats["checkpoint_sha256"],
        "mlp_weights": mlp.weights,
        "mode": eval_cfg.mode,
        "device": device.type,
        "precision": feats["precision"],
        "transform": feats["transform"],
        "dataset": {
            **feats["dataset"],
            "own": not elsewhere,
            **({"other_because": elsewhere} if elsewhere else {}),
        },
        "train_dataset": feats["train_dataset"],
        "val_dataset": feats["val_dataset"],
        "n_train": len(train.y),
        "n_val": len(val.y),
        "n_classes": feats["n_classes"],
        "feature_dim": int(train.x.shape[1]),
        "features_cached": {"train": train.from_cache, "val": val.from_cache},
        "extraction_seconds": round(time.perf_counter() - start, 3),
        "top1": None,
        "top5": None,
        "best_C": None,
        "C_curve": [],
        "solver": None,
        "knn": {},
        # what the numbers depend on beyond the data: the tables compare only probes under one
        # protocol
        "protocol": protocol(eval_cfg),
        "protocol_changes": protocol_changes(eval_cfg),
    }
    if eval_cfg.mode in ("linear", "both"):
        if baseline == PIXELS:
            logger.info(pixel_probe_note(train, val, eval_cfg))
        record.update(
            linear_probe(
                train, val, feats["n_classes"], eval_cfg, device, every_fit=baseline == PIXELS
            )
        )
    if eval_cfg.mode in ("knn", "both"):
        knn = knn_classify(
            train.x.to(device),
            train.y,
            val.x,
            val.y,
            eval_cfg.knn.ks,
            eval_cfg.knn.temperature,
            n_classes=feats["n_classes"],
            batch_size=eval_cfg.knn.batch_size,
        )
        record["knn"] = {str(k): v for k, v in knn.items()}
        record["knn_temperature"] = eval_cfg.knn.temperature
    record["seconds"] = round(time.perf_counter() - start, 3)
    record["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record["eval_config"] = to_yaml(eval_cfg)
    output = Path(eval_cfg.output) if eval_cfg.output else None
    if output is None:
        changed = protocol_suffix(eval_cfg)

        def named(data_suffix: str) -> Path:
            suffix = data_suffix + changed + mlp.output_suffix
            return run_dir / default_output_name(
                eval_cfg.mode, baseline, checkpoint, run_dir, record["checkpoint_step"], suffix
            )

        output = named(f"_data_{label}" if elsewhere else "")
        if elsewhere and recorded_identity(output) not in (
            None,
            identity,
        ):  # another set's folder of that name
            label = hashed_label(identity, label)
            logger.warning(
                "%s holds a probe of other data under the same folder name: this one is written as "
                "%s (set output= to choose a name)",
                output.name,
                named(f"_data_{label}").name,
            )
            output = named(f"_data_{label}")
        if changed:
            logger.info(
                "a probe under another protocol than the default one (%s): written as %s, never "
                "the record "
                "the tables read by default; `make_table.py --eval-arg KEY=VALUE ...` with these "
                "settings "
                "tabulates it",
                " ".join(record["protocol_changes"]),
                output.name,
            )
    if elsewhere:
        record["dataset"]["label"] = label
    atomic_write_text(output, json.dumps(record, indent=1) + "\n")
    record["output"] = str(output)
    index = index_path(run_dir, eval_cfg.index)
    if index is not None:
        append_index(index, summary(record))
    return record


def default_output_name(
    mode: str,
    baseline: str | None,
    checkpoint: Path | None,
    run_dir: Path,
    step: int | None,
    suffix: str = "",
) -> str:
    """`eval_linear.json` is the record of the final teacher's linear probe (what tables read); any
    other evaluation gets a name of its own, so it never replaces that record: `eval_knn*.json` for
    mode=knn, `*_random_init.json` for the untrained baseline (`baseline` "random"), `*_pixels.json`
    for the raw-pixel one, `*_step_XXXXXXXX.json` for a teacher export
    (`eval/step_XXXXXXXX/teacher_backbone.pth`), `*_<file stem>_step_X...` (or `*_<file stem>.json`
    without a recorded step) for any other checkpoint, so the final student and a teacher export of
    the same step never share a record; `suffix` last (`_data_<label>` for other data than the run's
    own, `other_data`; then `_protocol_<hash>` under another protocol than the default,
    `configs.eval_schema.protocol_suffix`; then `_pruned_mlp` / `_dense_mlp` when the MLPs are
    probed otherwise than the run's last step ran them: `MlpPruning.output_suffix`)."""
    knn_only = mode == "knn"
    if baseline:
        return eval_result_name(knn_only, BASELINES[baseline] + suffix)
    if checkpoint is not None and checkpoint.resolve() != RunDir(run_dir).teacher.resolve():
        which = f"_step_{step:08d}" if step is not None else ""
        # not a teacher export (or no step to tell it by): its name too
        if checkpoint.name != TEACHER or not which:
            which = f"_{checkpoint.stem}{which}"
        return eval_result_name(knn_only, which + suffix)
    return eval_result_name(knn_only, suffix)


def index_path(run_dir: Path, setting: str) -> Path | None:
    if setting == "none":
        return None
    return Path(setting) if setting else run_dir.resolve().parent / "eval_index.jsonl"


def summary_line(record: dict, k: str = "20") -> str:
    """The result in one line: `linear top-1 73.21 / top-5 98.10 (C=0.316); k-NN k=20 top-1 76.76 /
    top-5 97.20; eval_linear.json` (the k shown: 20, else the nearest evaluated)."""
    parts = []
    if record.get("top1") is not None:
        parts.append(
            f"linear top-1 {record['top1']:.2f} / top-5 {record['top5']:.2f} "
            f"(C={record['best_C']:.3g})"
        )
    knn = record.get("knn") or {}
    if knn:
        shown = k if k in knn else min(knn, key=lambda key: (abs(int(key) - int(k)), int(key)))
        parts.append(
            f"k-NN k={shown} top-1 {knn[shown]['top1']:.2f} / top-5 {knn[shown]['top5']:.2f}"
        )
    return "; ".join(parts + [Path(record.get("output", "")).name])


def summary(record: dict) -> dict:
    """The results-index line: where the full record is and its headline numbers."""
    keys = (
        "run",
        "output",
        "created",
        "checkpoint",
        "checkpoint_step",
        "mlp_weights",
        "mode",
        "solver",
        "top1",
        "top5",
        "best_C",
        "feature_dim",
        "n_train",
        "n_val",
        "seconds",
    )
    line = {k: record.get(k) for k in keys}
    line["knn_top1"] = {k: v["top1"] for k, v in record.get("knn", {}).items()}
    return line
