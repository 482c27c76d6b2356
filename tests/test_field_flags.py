"""What a schema field says about itself (`configs.fields.FLAGS`) replaces the lists other modules
kept by hand: the keys that may change on resume and the keys that act at the sparse-to-dense
switch; the `sparsity` keys the trainer acts on rather than the library's converter are those the
config's section adds to the library's own options (`sparsity.options.ConverterOptions`). The lists
read from them are the ones the project had written out (so resume, sweeps and tables behave as
before), and every `sparsity` key has exactly one owner."""

import dataclasses

import pytest

from configs.fields import flagged_keys
from configs.load import RESUMABLE_CHANGES
from configs.schema import CONVERTER_FIELDS, TRAINER_FIELDS, Config, SparsityConfig
from configs.sweep import SWITCH_KEYS

# the hand-kept lists these flags replaced, as they were
FORMER_RESUMABLE_CHANGES = {
    "train.max_steps",
    "train.num_workers",
    "train.log_period",
    "train.checkpoint_period",
    "train.max_to_keep",
    "train.teacher_export_period",
    "train.resume",
    "train.allow_unverified_checkpoints",
    "train.batch_size_per_gpu",
    "train.compile",
    "train.compile_backend",
    "train.compile_mode",
    "train.ddp_split_compiled_graphs",
    "train.gc_period",
    "train.cuda_graph",
    "train.dist_start_timeout_s",
    "data.root",
    "data.on_corrupt",
    "sparsity.backend",
    "sparsity.cslt_search",
    "sparsity.cslt_pack",
    "sparsity.fused_wgrad",
    "sparsity.mask_stats",
    "train.export_student",
}
ADDED_SINCE_RESUMABLE = {"data.augment_compile"}  # the same draws, compiled: flagged when added
FORMER_TRAINER_KEYS = {
    "sparse_fraction",
    "dense_warmup_fraction",
    "teacher",
    "switch_weights",
    "mask_stats",
}
ADDED_SINCE_TRAINER_KEYS = {
    "pruned_decay_ramp",
    "pruned_decay_fade",
}  # schedules of the trainer's, flagged when they were added


def test_the_flags_give_the_lists_that_were_kept_by_hand():
    assert set(RESUMABLE_CHANGES) == FORMER_RESUMABLE_CHANGES | ADDED_SINCE_RESUMABLE
    assert len(RESUMABLE_CHANGES) == 25
    assert SWITCH_KEYS == {
        "teacher.momentum_restart_at_switch": False,
        "optim.lr_restart_at_switch": False,  # added since, with the same flag
    }
    assert set(TRAINER_FIELDS) == FORMER_TRAINER_KEYS | ADDED_SINCE_TRAINER_KEYS


def test_every_sparsity_key_is_the_converters_or_the_trainers_and_not_both():
    """The converter takes exactly the library's options as keywords (an unknown one is a TypeError
    naming it), and the config's section is those plus the trainer's, each declared once."""
    from sparsity import SparseThenDense

    converter = SparseThenDense(
        4, **{key: getattr(SparsityConfig(), key) for key in CONVERTER_FIELDS}
    )
    assert (converter.backend, converter.settings.cslt_search) == ("auto", "sweep")
    with pytest.raises(TypeError, match="sparse_fraction"):
        SparseThenDense(4, sparse_fraction=0.5)
    keys = [f.name for f in dataclasses.fields(SparsityConfig)]
    assert sorted(keys) == sorted([*CONVERTER_FIELDS, *TRAINER_FIELDS]) and len(set(keys)) == len(
        keys
    )
    assert not set(CONVERTER_FIELDS) & set(TRAINER_FIELDS)


def test_an_unknown_flag_is_an_error():
    with pytest.raises(
        ValueError, match="unknown field flag 'resumable': one of execution, at_switch"
    ):
        flagged_keys(Config, "resumable")


def test_the_configs_converter_rules_are_the_librarys_and_its_defaults_pass_them():
    """configs/checks.py reports the converter's rules through the library's own method on the
    section."""
    from configs import ConfigError, load_config

    assert SparsityConfig().converter_problem() is None
    block_mvue = SparsityConfig(kind="block", weight_grad="mvue24")
    message = "sparsity.weight_grad=mvue24 applies to sparsity.kind=weight only, not block"
    assert block_mvue.converter_problem() == message
    with pytest.raises(
        ConfigError, match="sparsity.weight_grad=mvue24 applies to sparsity.kind=weight only"
    ):
        load_config(None, ["sparsity.kind=block", "sparsity.weight_grad=mvue24"])
