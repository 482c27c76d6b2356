"""How the figures name what they draw, as a paper would: models as "ViT-Ti/4, 80 epochs", sparsity
options as phrases ("2:4-sparse teacher"), never as config keys (student.arch=vit_tiny). A key
without a phrase here is shown as "key=value", so a new option is still named, if less politely.

A configuration's name has two parts: its model (architecture, patch size, epochs; the dense run it
is compared with shares them) and its options (the non-model keys whose value is not the most common
one in the study).
"""

from dataclasses import dataclass
from pathlib import Path

from .table_format import config_value

ARCH_NAMES = {
    "vit_tiny": "ViT-Ti",
    "vit_small": "ViT-S",
    "vit_base": "ViT-B",
    "vit_large": "ViT-L",
    "vit_giant2": "ViT-g",
}
DATASET_NAMES = {"cifar10": "JPEG-q75 CIFAR-10", "imagenet": "ImageNet-1k", "digits": "8x8 digits"}
MODEL_KEYS = (
    "student.arch",
    "student.patch_size",
    "optim.epochs",
    "optim.warmup_epochs",
    "train.total_steps",
)
PUBLISHED_NAME = "ViT-L/16, ImageNet-1k (published)"

# {key: {value: phrase}}; "{}" in a phrase takes the value (numbers)
OPTION_PHRASES = {
    "sparsity.teacher": {"sparse": "2:4-sparse teacher", "dense": "dense teacher"},
    "sparsity.switch_weights": {
        "pruned": "pruned entries zeroed at the switch",
        "dense": "dense weights restored at the switch",
    },
    "sparsity.pruning": {
        "tile_greedy": "tile-greedy pruning",
        "tile_greedy_signed": "signed tile-greedy pruning",
        "tile_optimal": "tile-optimal pruning",
        "rowwise": "row-wise pruning",
        "soft_threshold": "soft-threshold pruning",
    },
    "sparsity.pruned_grad": {
        "ste": "straight-through gradient",
        "masked": "no gradient to pruned weights",
    },
    "sparsity.pruned_decay": {"0.0": "no masked decay", "*": "masked decay {}"},
    "sparsity.pruned_decay_ramp": {
        "0.0": "masked decay at full strength throughout",
        "*": "masked decay ramped over the first {} of the sparse phase",
    },
    "sparsity.pruned_decay_fade": {
        "0.0": "masked decay to the switch",
        "*": "masked decay faded over the sparse phase's last {}",
    },
    "sparsity.dense_warmup_fraction": {
        "0.0": "sparse from the first step",
        "*": "dense for the first {} of the steps",
    },
    "sparsity.weight_grad": {
        "dense": "dense weight gradient",
        "mvue24": "MVUE 2:4 weight gradient",
    },
    "sparsity.kind": {
        "weight": "2:4 weights",
        "activation": "2:4 activations",
        "block": "block-sparse weights",
    },
    "teacher.momentum_restart_at_switch": {
        "true": "teacher momentum restarted at the switch",
        "false": "teacher momentum over the whole run",
    },
    "teacher.momentum_restart_fraction": {
        "0.0": "no teacher momentum restart",
        "*": "teacher momentum restarted at {} of the steps",
    },
    "optim.lr_restart_at_switch": {
        "true": "learning rate restarted at the switch",
        "false": "one learning-rate cosine",
    },
    "optim.lr_restart_fraction": {
        "0.0": "no learning-rate restart",
        "*": "learning rate restarted at {} of the steps",
    },
    "optim.lr_restart_peak": {"*": "restarted learning rate from {} of its peak"},
    "teacher.momentum_reference_steps": {
        "0": "dinov2's teacher momentum",
        "*": "teacher horizon matched to a {}-step run",
    },
}


def option_phrase(key: str, value) -> str:
    """ "2:4-sparse teacher" for ("sparsity.teacher", "sparse"); "key=value" (last dotted part) for
    unknown ones."""
    text = config_value(value)
    phrases = OPTION_PHRASES.get(key, {})
    phrase = phrases.get(text, phrases.get("*"))
    return phrase.format(text) if phrase else f"{key.rsplit('.', 1)[-1]}={text}"


def model_name(config: dict | None) -> str:
    """ "ViT-Ti/4, 80 epochs" from a run's flattened config ("" where it was not read)."""
    if not config:
        return ""
    arch = config.get("student.arch", "")
    name = f"{ARCH_NAMES.get(arch, arch)}/{config.get('student.patch_size', '?')}"
    epochs = config.get("optim.epochs")
    return f"{name}, {epochs:g} epochs" if isinstance(epochs, (int, float)) else name


def dataset_name(root: str, dataset: str) -> str:
    """ "JPEG-q75 CIFAR-10" for a data root named cifar10; the folder's own name where unknown."""
    if dataset == "digits":
        return DATASET_NAMES["digits"]
    folder = Path(root.rstrip("/")).name or dataset
    return DATASET_NAMES.get(folder.lower(), folder)


@dataclass(frozen=True)
class PaperName:
    """A configuration's name in two parts (`model`, `options`); `full` joins those the figure
    needs."""

    model: str
    options: str
    show_model: bool = (
        True  # False where every configuration has the same model (the title names it)
    )

    @property
    def full(self) -> str:
        parts = [self.model if self.show_model else "", self.options]
        return " · ".join(p for p in parts if p) or "most common options"


def paper_names(configs: dict) -> tuple[dict, str]:
    """{config label: PaperName} for {config label: (the run's whole flattened config, its differing
    keys)}, and the caption line naming the most common option values that unnamed options stand for
    ("" where no option differs)."""
    labels = list(configs)
    options = [
        {k: v for k, v in differing.items() if k not in MODEL_KEYS}
        for _, differing in configs.values()
    ]
    models = [model_name(config) for config, _ in configs.values()]
    show_model = len(set(models)) > 1 or len(labels) == 1
    names, common = {}, {}
    keys = list(dict.fromkeys(k for o in options for k in o))
    for key in keys:
        values = [config_value(o.get(key)) for o in options]
        common[key] = max(
            dict.fromkeys(values), key=values.count
        )  # most common, first seen wins a tie
    for label, option, model in zip(labels, options, models):
        # every option off its most common value is named, also one that always changes with
        # another: the caption says the unnamed ones are the common values, so none may be left out
        named = [k for k in option if config_value(option[k]) != common[k]]
        names[label] = PaperName(
            model, ", ".join(option_phrase(k, option[k]) for k in named), show_model
        )
    note = (
        (
            "Options not named are the most common ones: "
            + ", ".join(option_phrase(k, v) for k, v in common.items())
            + "."
        )
        if common
        else ""
    )
    return names, note


def study_setting(runs) -> str:
    """What every run shares, for a title: "ViT-Ti/4, 80 epochs (7,760 steps) on JPEG-q75 CIFAR-10",
    the dataset alone where models differ ("" where neither is shared). Runs are duck-typed
    (run_logs.RunSummary)."""
    read = [r for r in runs if r.config]
    datasets = {dataset_name(r.data_root, r.dataset) for r in read}
    models = {(model_name(r.config), r.total_steps) for r in read}
    model = ""
    if len(models) == 1:
        name, steps = models.pop()
        model = name + (f" ({steps:,} steps)" if steps else "")
    data = datasets.pop() if len(datasets) == 1 else ""
    return " on ".join(p for p in (model, data) if p)


def run_label(schedule: str, name: PaperName, named: bool) -> str:
    """ "70% sparse · ViT-S/4, 40 epochs · 2:4-sparse teacher": a run in a legend; the schedule
    alone where only schedules differ (`named` False)."""
    return f"{schedule} · {name.full}" if named else schedule
