"""Config loading: the ViT-L recipe equals the published values; bad configs fail with clear
messages."""

import math

import pytest

from configs import ConfigError, load_config, scaled_lr, to_yaml
from configs.load import CONFIG_DIR

VITL = CONFIG_DIR / "vitl16_imagenet.yaml"
ROOT = ["data.root=/datasets/imagenet"]


def test_vitl16_recipe_matches_the_published_values():
    cfg = load_config(VITL, ROOT)
    # vitl16_short: 125k iterations of 1250-iteration "epochs"
    assert (cfg.optim.epochs, cfg.train.epoch_length, cfg.total_steps) == (100, 1250, 125_000)
    assert cfg.train.batch_size_per_gpu == 64
    # base lr 0.004 at batch 1024, sqrt scaling: 32 GPUs x 64 = 2048 -> 0.004 * sqrt(2)
    assert cfg.optim.base_lr == 0.004 and cfg.optim.scaling_rule == "sqrt_wrt_1024"
    assert math.isclose(scaled_lr(cfg, world_size=32), 0.004 * math.sqrt(2))
    assert (cfg.optim.warmup_epochs, cfg.optim.min_lr) == (10, 1e-6)
    assert (cfg.optim.weight_decay, cfg.optim.weight_decay_end) == (0.04, 0.4)
    assert (cfg.teacher.momentum_teacher, cfg.teacher.final_momentum_teacher) == (0.992, 1.0)
    assert (cfg.teacher.warmup_teacher_temp, cfg.teacher.teacher_temp) == (0.04, 0.07)
    assert cfg.teacher.warmup_teacher_temp_epochs == 30
    s = cfg.student
    assert (s.arch, s.patch_size, s.drop_path_rate, s.layerscale, s.ffn_layer) == (
        "vit_large",
        16,
        0.3,
        1e-5,
        "mlp",
    )
    assert (s.qkv_bias, s.proj_bias, s.ffn_bias, s.num_register_tokens) == (True, True, True, 0)
    assert (s.interpolate_antialias, s.interpolate_offset) == (False, 0.1)
    d, i = cfg.dino, cfg.ibot
    assert (d.head_n_prototypes, d.head_bottleneck_dim, d.head_hidden_dim, d.head_nlayers) == (
        65536,
        256,
        2048,
        3,
    )
    assert (d.loss_weight, d.koleo_loss_weight) == (1.0, 0.1)
    assert i.separate_head is False  # iBOT shares the DINO head
    assert (i.loss_weight, i.mask_sample_probability, i.mask_ratio_min_max) == (
        1.0,
        0.5,
        [0.1, 0.5],
    )
    o = cfg.optim
    assert (o.clip_grad, o.layerwise_decay, o.patch_embed_lr_mult, o.freeze_last_layer_epochs) == (
        3.0,
        0.9,
        0.2,
        1,
    )
    assert (o.adamw_beta1, o.adamw_beta2) == (0.9, 0.999)
    c = cfg.crops
    assert (c.global_crops_scale, c.local_crops_scale, c.local_crops_number) == (
        [0.32, 1.0],
        [0.05, 0.32],
        8,
    )
    assert (c.global_crops_size, c.local_crops_size) == (224, 96)
    assert c.reference_blur_inversion is True  # how the published checkpoints were trained
    assert cfg.train.centering == "centering"
    assert (
        cfg.sparsity.modules == r"blocks\.\d+\.mlp\.fc[12]"
        and cfg.sparsity.pruning == "tile_greedy"
    )
    # the published recipe: the straight-through gradient, no masked decay, dinov2's momentum over
    # the whole run
    sp, t = cfg.sparsity, cfg.teacher
    assert (sp.pruned_grad, sp.pruned_decay, sp.weight_grad, sp.switch_weights, sp.teacher) == (
        "ste",
        0.0,
        "dense",
        "dense",
        "dense",
    )
    assert (t.momentum_reference_steps, t.momentum_restart_at_switch) == (0, False)


@pytest.mark.parametrize(
    "fraction,sparse_steps",
    [
        (0.0, 0),
        (0.4, 50_000),
        (0.6, 75_000),
        (0.7, 87_500),
        (0.8, 100_000),
        (0.9, 112_500),
        (1.0, 125_000),
    ],
)
def test_the_seven_published_schedules(fraction, sparse_steps):
    cfg = load_config(VITL, ROOT + [f"sparsity.sparse_fraction={fraction}"])
    assert cfg.sparse_steps == sparse_steps


def test_default_config_is_a_small_sparse_then_dense_run():
    cfg = load_config()
    assert cfg.data.dataset == "digits" and cfg.sparsity.sparse_fraction == 0.7
    assert 0 < cfg.sparse_steps < cfg.total_steps <= 1000


def test_overrides_apply_and_round_trip_through_yaml(tmp_path):
    cfg = load_config(
        None, ["train.seed=7", "optim.base_lr=0.001", "crops.local_crops_scale=[0.1,0.2]"]
    )
    assert (cfg.train.seed, cfg.optim.base_lr, cfg.crops.local_crops_scale) == (
        7,
        0.001,
        [0.1, 0.2],
    )
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(cfg))
    assert load_config(saved) == cfg


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "train.batchsize=3",
            "unknown config key 'train.batchsize'.*valid keys in train: batch_size_per_gpu",
        ),
        (
            "optimizer.lr=1",
            "unknown config key 'optimizer'.*valid keys in top level: student, teacher",
        ),
        ("train.batch_size_per_gpu=abc", "wrong type for 'train.batch_size_per_gpu'"),
        ("train.resume=maybe", "wrong type for 'train.resume'"),
        ("student.arch=vit_huge", "student.arch='vit_huge' is not one of vit_tiny"),
        (
            "sparsity.sparse_fraction=1.5",
            r"sparsity.sparse_fraction=1.5 is out of range: must be >= 0 and <= 1",
        ),
        ("sparsity.backend=cusparse", "sparsity.backend='cusparse' is not one of"),
        (
            "sparsity.cslt_search=fastest",
            "sparsity.cslt_search='fastest' is not one of sweep, sweep_unsafe, library",
        ),
        (
            "sparsity.cslt_pack=cutlass",
            "sparsity.cslt_pack='cutlass' is not one of auto, triton, library",
        ),
        ("sparsity.fused_wgrad=maybe", "wrong type for 'sparsity.fused_wgrad'"),
        ("crops.global_crops_size=30", "multiple of student.patch_size"),
        ("ibot.mask_ratio_min_max=[0.5,0.1]", "min <= max"),
        (
            "ibot.mask_sample_probability=2",
            r"ibot.mask_sample_probability=2.0 is out of range: must be >= 0 and <= 1",
        ),
        ("train.seed", "not of the form key=value"),
        (
            "data.augment_compile=true",
            "data.augment_compile=true compiles the crops made on the training device, but "
            "data.augment_on=workers",
        ),
    ],
)
def test_bad_overrides_are_errors_that_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["sparsity.kind=blocks"],
            "sparsity.kind='blocks' is not one of weight, activation, block",
        ),
        (
            ["sparsity.kind=block", "sparsity.block_density=0"],
            r"sparsity.block_density=0.0 is out of range: must be > 0",
        ),
        (
            ["sparsity.kind=block", "sparsity.block_density=1.5"],
            r"sparsity.block_density=1.5 is out of range",
        ),
        (
            ["sparsity.kind=block", "sparsity.block_size=0"],
            r"sparsity.block_size=0 is out of range: must be >= 1",
        ),
        (["sparsity.weight_grad=mvue"], "sparsity.weight_grad='mvue' is not one of dense, mvue24"),
        (
            ["sparsity.weight_grad=mvue24", "sparsity.backend=dense"],
            "sparsity.weight_grad=mvue24 compiles on cuSPARSELt only .* not "
            "sparsity.backend=dense: change the backend "
            "or set train.compile=false",
        ),
        (
            ["sparsity.weight_grad=mvue24", "sparsity.kind=block", "train.compile=false"],
            "sparsity.weight_grad=mvue24 applies to sparsity.kind=weight only, not block",
        ),
    ],
)
def test_bad_sparsity_options_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
    # the same options with valid values load
    load_config(
        None, ["sparsity.kind=block", "sparsity.block_density=0.25", "sparsity.block_size=64"]
    )
    load_config(None, ["sparsity.weight_grad=mvue24", "train.compile=false"])
    load_config(
        None, ["sparsity.weight_grad=mvue24"]
    )  # compiled, on the default backend (auto: cuSPARSELt)


def test_unknown_key_in_a_yaml_file_is_an_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epoch_lenght: 10\n")
    with pytest.raises(ConfigError, match=f"{bad}: unknown config key 'train.epoch_lenght'"):
        load_config(bad)


def test_missing_config_file_and_missing_dataset_root(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="data.root is required"):
        load_config(VITL)
    with pytest.raises(ConfigError, match="data.root is required for data.dataset=image_folder"):
        load_config(None, ["data.dataset=image_folder"])


def test_a_root_for_the_bundled_digits_is_refused_naming_the_folder_kinds():
    """`train.py data.root=<my folder>` on the embedded default (digits) used to train on digits,
    exit 0."""
    with pytest.raises(
        ConfigError,
        match=r"data.root=/my/images is set but data.dataset=digits .*has no root: add "
        r"data.dataset=image_folder .* or data.dataset=imagenet_folder",
    ):
        load_config(None, ["data.root=/my/images"])
    assert (
        load_config(None, ["data.root=/my/images", "data.dataset=image_folder"]).data.dataset
        == "image_folder"
    )


def test_a_root_given_as_an_interpolation_is_shown_as_written(monkeypatch):
    monkeypatch.setenv("DATA_TOKEN", "/secret/tok-93a1")
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.root=${oc.env:DATA_TOKEN}"])
    assert "data.root=${oc.env:DATA_TOKEN} is set" in str(e.value) and "tok-93a1" not in str(
        e.value
    )
