"""What a config must satisfy beyond its schema: every field within its declared range (`schema.py`,
`fields.py`), each section's own rules (its `problem()`, beside its fields in `schema.py`), the
converter's (the library's), then the rules that span sections, here; each a `ConfigError` naming
the keys and what is valid."""

import functools
import math

from .errors import ConfigError, as_written
from .fields import check_fields, flagged_keys
from .schema import Config

# 80x the ViT-L recipe (100 x 1250); the schedules (training/schedules.py) take 40 bytes per step,
# 400 MB here
MAX_TOTAL_STEPS = 10_000_000


def validate(cfg: Config) -> None:
    """Every field within its declared range (`schema.py`, `fields.py`), then what relates fields to
    each other."""
    # YAML reads true/false/on/off as booleans, which a str field stores as "True"/"False"
    cfg.train.compile = str(cfg.train.compile).lower()
    problem = check_fields(cfg) or next(
        (
            p
            for section in (cfg.optim, cfg.teacher, cfg.sparsity, cfg.train)
            if (p := section.problem())
        ),
        None,
    )
    if problem:
        raise ConfigError(problem)
    checks = [
        (
            cfg.total_steps <= MAX_TOTAL_STEPS,
            f"optim.epochs x train.epoch_length = {cfg.optim.epochs} x {cfg.train.epoch_length} = "
            f"{cfg.total_steps} "
            f"steps: must be at most {MAX_TOTAL_STEPS} (the schedules hold five values per step)",
        ),
        (
            cfg.crops.global_crops_size % cfg.student.patch_size == 0,
            f"crops.global_crops_size={cfg.crops.global_crops_size} must be a multiple of "
            f"student.patch_size="
            f"{cfg.student.patch_size}",
        ),
        (
            cfg.crops.local_crops_size % cfg.student.patch_size == 0,
            f"crops.local_crops_size={cfg.crops.local_crops_size} must be a multiple of "
            f"student.patch_size="
            f"{cfg.student.patch_size}",
        ),
        (
            cfg.data.augment_on == "device" or not cfg.data.augment_compile,
            "data.augment_compile=true compiles the crops made on the training device, but "
            f"data.augment_on={cfg.data.augment_on}: set data.augment_on=device as well, or "
            "data.augment_compile=false",
        ),
        (
            cfg.dino.loss_weight > 0 or cfg.ibot.loss_weight > 0,
            "dino.loss_weight and ibot.loss_weight are both 0: nothing to train",
        ),
        (
            cfg.data.dataset == "digits" or bool(cfg.data.root),
            f"data.root is required for data.dataset={cfg.data.dataset}",
        ),
        (
            cfg.data.dataset != "digits" or not cfg.data.root,
            f"data.root={as_written(cfg, 'data.root', cfg.data.root)} is set but "
            f"data.dataset=digits (the bundled set) "
            "has no root: add data.dataset=image_folder (every image under root, flat or nested, "
            "labels ignored) or "
            "data.dataset=imagenet_folder (root/<split>/<class>/<image>)",
        ),
        (
            1 - (1 - cfg.teacher.momentum_teacher) * cfg.momentum_scale >= 0,
            f"teacher.momentum_reference_steps={cfg.teacher.momentum_reference_steps} with "
            f"teacher.momentum_teacher="
            f"{cfg.teacher.momentum_teacher:g} over {cfg.total_steps} steps gives a starting "
            f"momentum 1 - (1 - "
            f"{cfg.teacher.momentum_teacher:g}) x "
            f"{cfg.teacher.momentum_reference_steps}/{cfg.total_steps} = "
            f"{1 - (1 - cfg.teacher.momentum_teacher) * cfg.momentum_scale:.3g} < 0: at most "
            f"{math.floor(cfg.total_steps / max(1 - cfg.teacher.momentum_teacher, 1e-12) * (1 + 1e-9))} steps for "
            "this momentum",
        ),
        (
            cfg.sparsity.dense_warmup_fraction == 0
            or not cfg.sparse_steps
            or 0 < cfg.dense_warmup_steps < cfg.sparse_steps,
            f"sparsity.dense_warmup_fraction={cfg.sparsity.dense_warmup_fraction:g} makes the "
            f"first "
            f"{cfg.dense_warmup_steps} of {cfg.total_steps} steps dense, but the sparse phase ends "
            f"at step "
            f"{cfg.sparse_steps} (sparsity.sparse_fraction={cfg.sparsity.sparse_fraction:g}): it "
            f"must leave at least one "
            "step before it and one sparse step, or be 0 for no warm-up",
        ),
        # every setting that acts at the switch (the schema's at_switch flag) needs one
        *(
            (
                not _value(cfg, key) or cfg.switches,
                f"{key}=true needs a switch, 0 < sparsity.sparse_fraction < 1 (got "
                f"{cfg.sparsity.sparse_fraction:g}: {cfg.sparse_steps} of {cfg.total_steps} steps "
                f"sparse)",
            )
            for key in flagged_keys(Config, "at_switch")
        ),
        (
            cfg.lr_restart_step is None
            or cfg.optim.warmup_epochs * cfg.train.epoch_length
            < cfg.lr_restart_step
            < cfg.total_steps,
            f"the learning rate's restart ({_restart_setting(cfg.optim, 'optim.lr')}) falls at step "
            f"{cfg.lr_restart_step} of {cfg.total_steps}: it must come after the warm-up's "
            f"{cfg.optim.warmup_epochs * cfg.train.epoch_length} steps and before the last step",
        ),
        (
            cfg.momentum_restart_step is None or cfg.teacher.momentum_reference_steps == 0,
            f"{_restart_setting(cfg.teacher, 'teacher.momentum')} and "
            f"teacher.momentum_reference_steps={cfg.teacher.momentum_reference_steps} both "
            "reshape the momentum schedule: set one of them",
        ),
        (
            cfg.teacher.momentum_restart_fraction == 0
            or 0 < (cfg.momentum_restart_step or 0) < cfg.total_steps,
            f"teacher.momentum_restart_fraction={cfg.teacher.momentum_restart_fraction:g} restarts "
            f"the teacher "
            f"momentum at step {cfg.momentum_restart_step} of {cfg.total_steps}: it must fall "
            f"strictly inside the run "
            f"(between 1/{cfg.total_steps} and {cfg.total_steps - 1}/{cfg.total_steps} of it), or "
            f"be 0 for no restart",
        ),
        (
            cfg.sparsity.weight_grad == "dense"
            or cfg.train.compile == "false"
            or cfg.sparsity.backend in ("cusparselt", "auto"),
            f"sparsity.weight_grad={cfg.sparsity.weight_grad} compiles on cuSPARSELt only "
            f"(sparsity.backend=cusparselt "
            f"or auto, on a CUDA GPU), not sparsity.backend={cfg.sparsity.backend}: change the "
            f"backend or set "
            "train.compile=false",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    problem = (
        cfg.sparsity.converter_problem()
    )  # the library's own rules on its options (torch-free)
    if problem:
        raise ConfigError(problem)


def _restart_setting(section, name: str) -> str:
    """The key=value of `section` that places the restart of `name` (`teacher.momentum`,
    `optim.lr`): `<name>_restart_at_switch=true` or `<name>_restart_fraction=f` (for a message)."""
    field = name.rsplit(".", 1)[1]
    if getattr(section, f"{field}_restart_at_switch"):
        return f"{name}_restart_at_switch=true"
    return f"{name}_restart_fraction={getattr(section, f'{field}_restart_fraction'):g}"


def _value(cfg: Config, key: str):
    """The value of a dotted key."""
    return functools.reduce(getattr, key.split("."), cfg)
