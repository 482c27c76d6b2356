"""configs.sweep: one run's config per sparse fraction. A key that acts only at the switch is turned
off, with a note, on the runs without one; every other key and every other refusal is as train.py's
own load_config."""

import pytest

from configs import ConfigError, load_config, to_yaml
from configs.sweep import acts_only_with_a_sparse_phase, schedule_run

RESTART = "teacher.momentum_restart_at_switch"
SHORT = [
    "optim.epochs=2",
    "train.epoch_length=5",
]  # 10 steps: 0.7 -> 7 sparse, 0.04 -> 0 (no switch)


@pytest.mark.parametrize(
    "fraction,switches", [(0.0, False), (0.04, False), (0.5, True), (0.7, True), (1.0, False)]
)
def test_the_restart_is_kept_where_the_run_switches_and_turned_off_where_it_does_not(
    fraction, switches
):
    run = schedule_run(None, [*SHORT, f"{RESTART}=true"], fraction)
    assert run.cfg.sparsity.sparse_fraction == fraction
    assert run.cfg.teacher.momentum_restart_at_switch is switches
    if switches:
        assert run.overrides == [*SHORT, f"{RESTART}=true", f"sparsity.sparse_fraction={fraction}"]
        assert run.notes == []
    else:
        assert run.overrides[-1] == f"{RESTART}=false"
        assert run.notes == [f"{RESTART}=true left out: {fraction * 100:g}% sparse has no switch"]
    # what the job's train.py resolves from these overrides is this config, and it is not refused
    assert to_yaml(load_config(None, run.overrides)) == to_yaml(run.cfg)


def test_a_run_without_the_key_gets_the_sweep_overrides_unchanged():
    for fraction in (0.0, 0.7, 1.0):
        run = schedule_run(None, SHORT, fraction)
        assert run.overrides == [*SHORT, f"sparsity.sparse_fraction={fraction}"] and run.notes == []
        assert run.cfg.teacher.momentum_restart_at_switch is False


def test_the_key_set_in_the_yaml_is_turned_off_too(tmp_path):
    config = (
        tmp_path / "recipe.yaml"
    )  # the embedded default with the recipe's two keys set in the file
    text = to_yaml(load_config(None, [*SHORT, "sparsity.pruned_decay=0.005"]))
    assert text.count("momentum_restart_at_switch: false") == 1
    config.write_text(
        text.replace("momentum_restart_at_switch: false", "momentum_restart_at_switch: true")
    )
    dense = schedule_run(config, SHORT, 0.0)
    assert (
        dense.cfg.teacher.momentum_restart_at_switch is False
        and dense.cfg.sparsity.pruned_decay == 0.005
    )
    assert dense.notes == [f"{RESTART}=true left out: 0% sparse has no switch"]
    assert schedule_run(config, SHORT, 0.7).cfg.teacher.momentum_restart_at_switch is True


def test_other_refusals_stay_refusals():
    # the restart with the horizon-matched momentum is refused where the run switches, as by
    # train.py
    with pytest.raises(ConfigError, match="both reshape the momentum schedule"):
        schedule_run(None, [*SHORT, f"{RESTART}=true", "teacher.momentum_reference_steps=20"], 0.7)
    with pytest.raises(ConfigError, match="unknown config key 'train.batchsize'"):
        schedule_run(None, [*SHORT, "train.batchsize=3"], 0.0)
    # a typo in the key itself is not taken for the switch key: it is an unknown key
    with pytest.raises(ConfigError, match="momentum_restart_at_swich"):
        schedule_run(None, [*SHORT, "teacher.momentum_restart_at_swich=true"], 0.0)


def test_which_keys_act_only_with_a_sparse_phase():
    assert acts_only_with_a_sparse_phase("sparsity.pruned_decay") and acts_only_with_a_sparse_phase(
        RESTART
    )
    assert not acts_only_with_a_sparse_phase("teacher.momentum_teacher")
    assert not acts_only_with_a_sparse_phase(
        "sparsity_extra.key"
    )  # the section, not a name that starts alike
