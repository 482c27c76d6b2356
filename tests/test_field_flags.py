"""What a schema field says about itself (`configs.fields.FLAGS`) replaces the lists other modules kept by hand: the
keys that may change on resume, the keys that act at the sparse-to-dense switch, and the `sparsity` keys the trainer
acts on rather than the library's converter. The lists read from the flags are the ones the project had written out
(so resume, sweeps and tables behave as before), and every `sparsity` key has exactly one owner."""

import inspect

import pytest

from configs.fields import flagged_keys
from configs.load import RESUMABLE_CHANGES
from configs.schema import Config, SparsityConfig
from configs.sweep import SWITCH_KEYS

# the hand-kept lists these flags replaced, as they were
FORMER_RESUMABLE_CHANGES = {
    "train.max_steps", "train.num_workers", "train.log_period", "train.checkpoint_period", "train.max_to_keep",
    "train.teacher_export_period", "train.resume", "train.allow_unverified_checkpoints", "train.batch_size_per_gpu",
    "train.compile", "train.compile_backend", "train.compile_mode", "train.ddp_split_compiled_graphs",
    "train.gc_period", "train.cuda_graph", "train.dist_start_timeout_s", "data.root", "data.on_corrupt",
    "sparsity.backend", "sparsity.cslt_search", "sparsity.cslt_pack", "sparsity.fused_wgrad", "sparsity.mask_stats",
    "train.export_student",
}
FORMER_TRAINER_KEYS = {"sparse_fraction", "dense_warmup_fraction", "teacher", "switch_weights", "mask_stats"}
ADDED_SINCE_TRAINER_KEYS = {"pruned_decay_ramp"}  # a schedule of the trainer's, flagged when it was added


def test_the_flags_give_the_lists_that_were_kept_by_hand():
    assert set(RESUMABLE_CHANGES) == FORMER_RESUMABLE_CHANGES and len(RESUMABLE_CHANGES) == 24
    assert SWITCH_KEYS == {"teacher.momentum_restart_at_switch": False}
    assert set(flagged_keys(SparsityConfig, "trainer")) == FORMER_TRAINER_KEYS | ADDED_SINCE_TRAINER_KEYS


def test_every_sparsity_key_is_the_converters_or_the_trainers_and_not_both():
    from sparsity import SparseThenDense

    converter = set(inspect.signature(SparseThenDense.__init__).parameters) - {"self", "sparse_steps",
                                                                               "dense_warmup_steps"}
    trainer = set(flagged_keys(SparsityConfig, "trainer"))
    keys = set(SparsityConfig.__dataclass_fields__)
    assert keys == converter | trainer, (keys - converter - trainer, converter - keys)
    assert not converter & trainer


def test_an_unknown_flag_is_an_error():
    with pytest.raises(ValueError, match="unknown field flag 'resumable': one of execution, at_switch, trainer"):
        flagged_keys(Config, "resumable")


def test_the_configs_converter_rules_are_the_librarys_and_its_defaults_pass_them():
    """configs/checks.py reports the converter's rules by calling the library (`options_problem`), skipping the call
    at the defaults: they must pass, and the keys it hands over must be the function's parameters."""
    from configs.checks import CONVERTER_RULE_KEYS
    from sparsity.options import options_problem

    assert set(CONVERTER_RULE_KEYS) == set(inspect.signature(options_problem).parameters)
    assert options_problem(**{key: getattr(SparsityConfig, key) for key in CONVERTER_RULE_KEYS}) is None
    assert options_problem(**{**{key: getattr(SparsityConfig, key) for key in CONVERTER_RULE_KEYS},
                              "kind": "block", "weight_grad": "mvue24"}) == \
        "sparsity.weight_grad=mvue24 applies to sparsity.kind=weight only, not block"
