"""Schedules against hand-computed values."""

import math

import numpy as np
import pytest

from configs import load_config
from training.schedules import build_schedules, cosine_schedule, linear_then_constant


def test_cosine_schedule_by_hand():
    s = cosine_schedule(
        1.0, 0.0, total_iters=6, warmup_iters=2, start_warmup_value=0.5, freeze_iters=1
    )
    # freeze: 0 | warm-up linspace(0.5, 1, 2) = 0.5, 1 | cosine over 3 iters: 0.5 * (1 + cos(pi * i
    # / 3))
    expected = [0.0, 0.5, 1.0, 1.0, 0.75, 0.25]
    np.testing.assert_allclose(s, expected, atol=1e-12)


def test_cosine_schedule_rejects_too_long_warmup():
    with pytest.raises(ValueError, match="exceed"):
        cosine_schedule(1.0, 0.0, total_iters=3, warmup_iters=4)


def test_linear_then_constant_by_hand():
    np.testing.assert_allclose(
        linear_then_constant(0.04, 0.07, 4, 6), [0.04, 0.05, 0.06, 0.07, 0.07, 0.07]
    )


def test_vitl_schedules_follow_the_reference():
    cfg = load_config("configs/vitl16_imagenet.yaml", ["data.root=/x"])
    s = build_schedules(cfg, world_size=32)
    peak = 0.004 * math.sqrt(2)
    assert len(s.lr) == 125_000
    assert s.at(0)["lr"] == 0.0  # warm-up starts at 0
    assert math.isclose(s.at(12_499)["lr"], peak)  # 10 epochs x 1250 iterations of warm-up
    assert math.isclose(s.at(12_500)["lr"], peak)  # cosine starts at the peak
    assert math.isclose(s.at(124_999)["lr"], 1e-6, rel_tol=1e-3)
    assert all(s.at(i)["last_layer_lr"] == 0.0 for i in (0, 600, 1249))  # frozen for 1 epoch
    assert s.at(1250)["last_layer_lr"] == s.at(1250)["lr"] > 0
    np.testing.assert_allclose(
        [s.at(0)[k] for k in ("wd", "momentum", "teacher_temp")], [0.04, 0.992, 0.04]
    )
    assert math.isclose(s.at(124_999)["wd"], 0.4, rel_tol=1e-6)
    assert math.isclose(s.at(124_999)["momentum"], 1.0, rel_tol=1e-6)
    assert math.isclose(
        s.at(30 * 1250 - 1)["teacher_temp"], 0.07
    )  # linear over 30 epochs, then constant
    assert s.at(100_000)["teacher_temp"] == 0.07
    assert s.at(10**9) == s.at(124_999)  # past the end: final values


def _sixteen_steps(*extra: str):
    """16 steps (4 epochs of 4 iterations), the momentum from 0.992 to 1."""
    return load_config(
        None,
        [
            "data.dataset=digits",
            "optim.epochs=4",
            "train.epoch_length=4",
            "optim.warmup_epochs=1",
            "teacher.warmup_teacher_temp_epochs=1",
            *extra,
        ],
    )


def test_momentum_restart_at_the_switch_by_hand():
    """Half the steps sparse: steps 0-7 keep dinov2's cosine over 16 steps, steps 8-15 a cosine over
    8 steps from 0.992 again, so the switch-time teacher's share of the final one, prod(m[8:]),
    falls."""
    whole = build_schedules(_sixteen_steps("sparsity.sparse_fraction=0.5"), 1).momentum
    restarted = build_schedules(
        _sixteen_steps("sparsity.sparse_fraction=0.5", "teacher.momentum_restart_at_switch=true"), 1
    ).momentum
    by_hand_whole = [1 - 0.004 * (1 + math.cos(math.pi * i / 16)) for i in range(16)]
    by_hand_dense = [1 - 0.004 * (1 + math.cos(math.pi * i / 8)) for i in range(8)]
    np.testing.assert_allclose(whole, by_hand_whole, atol=1e-12)
    np.testing.assert_allclose(restarted, by_hand_whole[:8] + by_hand_dense, atol=1e-12)
    assert restarted[8] == pytest.approx(0.992) and restarted[12] == pytest.approx(0.996)
    assert np.prod(restarted[8:]) < np.prod(whole[8:]) < 1


def test_momentum_restart_follows_the_switch_step():
    """The restart sits at round(sparse_fraction x steps): 0.25 of 16 -> step 4 is the dense phase's
    first."""
    m = build_schedules(
        _sixteen_steps("sparsity.sparse_fraction=0.25", "teacher.momentum_restart_at_switch=true"),
        1,
    ).momentum
    assert m[3] > 0.992 and m[4] == pytest.approx(0.992) and m[-1] > m[4]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["sparsity.sparse_fraction=0"],
            r"needs a switch, 0 < sparsity.sparse_fraction < 1 \(got 0: 0 of 16",
        ),
        (["sparsity.sparse_fraction=1"], r"needs a switch, .*got 1: 16 of 16 steps sparse"),
        (
            ["sparsity.sparse_fraction=0.02"],
            r"got 0.02: 0 of 16 steps sparse",
        ),  # rounds to no sparse step
        (
            ["sparsity.sparse_fraction=0.5", "teacher.momentum_reference_steps=100"],
            "teacher.momentum_reference_steps=100 both reshape the momentum schedule",
        ),
        (["teacher.momentum_restart_at_switch=maybe"], "teacher.momentum_restart_at_switch"),
    ],
)
def test_momentum_restart_refusals_name_the_key(overrides, message):
    from configs.load import ConfigError

    with pytest.raises(ConfigError, match=message):
        _sixteen_steps("teacher.momentum_restart_at_switch=true", *overrides)


def test_momentum_restart_at_a_fraction_by_hand():
    """The dense control: a run without a switch restarts the cosine at round(0.4 x 16) = step 6
    (6.4 rounds down), and equals a 40% sparse run's restart at its switch step for step."""
    control = build_schedules(_sixteen_steps("teacher.momentum_restart_fraction=0.4"), 1).momentum
    by_hand = [1 - 0.004 * (1 + math.cos(math.pi * i / 16)) for i in range(6)] + [
        1 - 0.004 * (1 + math.cos(math.pi * i / 10)) for i in range(10)
    ]
    np.testing.assert_allclose(control, by_hand, atol=1e-12)
    at_switch = build_schedules(
        _sixteen_steps("sparsity.sparse_fraction=0.4", "teacher.momentum_restart_at_switch=true"), 1
    ).momentum
    np.testing.assert_array_equal(control, at_switch)
    for fraction in ("0.0", "0"):  # 0: dinov2's schedule untouched
        plain = build_schedules(
            _sixteen_steps(f"teacher.momentum_restart_fraction={fraction}"), 1
        ).momentum
        np.testing.assert_allclose(
            plain, [1 - 0.004 * (1 + math.cos(math.pi * i / 16)) for i in range(16)]
        )


def test_momentum_restart_fraction_in_a_sparse_run():
    """Independent of the switch: a 70% sparse run restarted at 25% of its steps restarts at step 4,
    not 11."""
    m = build_schedules(
        _sixteen_steps("sparsity.sparse_fraction=0.7", "teacher.momentum_restart_fraction=0.25"), 1
    ).momentum
    assert m[4] == pytest.approx(0.992) and m[11] > 0.992 and m[3] > 0.992


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["teacher.momentum_restart_fraction=1"],
            r"teacher.momentum_restart_fraction",
        ),  # range: [0, 1)
        (["teacher.momentum_restart_fraction=-0.1"], r"teacher.momentum_restart_fraction"),
        (["teacher.momentum_restart_fraction=soon"], r"teacher.momentum_restart_fraction"),
        (
            ["teacher.momentum_restart_fraction=0.02"],
            r"restarts the teacher momentum at step 0 of 16: it must fall "
            r"strictly inside the run",
        ),
        (
            ["teacher.momentum_restart_fraction=0.99"],
            r"at step 16 of 16",
        ),  # rounds to the end: no restart left
        (
            [
                "teacher.momentum_restart_fraction=0.5",
                "sparsity.sparse_fraction=0.5",
                "teacher.momentum_restart_at_switch=true",
            ],
            "both place the teacher momentum's restart: set one of them",
        ),
        (
            ["teacher.momentum_restart_fraction=0.5", "teacher.momentum_reference_steps=100"],
            "teacher.momentum_reference_steps=100 both reshape the momentum schedule",
        ),
    ],
)
def test_momentum_restart_fraction_refusals_name_the_key(overrides, message):
    from configs.load import ConfigError

    with pytest.raises(ConfigError, match=message):
        _sixteen_steps(*overrides)


def test_dense_warm_up_steps_by_hand():
    """round(0.1 x 16) = 2 (1.6 rounds up) dense steps before a 50% run's sparse phase; none in a
    dense run, where the key does nothing (a sweep passes it to every run), and the switch stays at
    round(0.5 x 16) = 8."""
    cfg = _sixteen_steps("sparsity.sparse_fraction=0.5", "sparsity.dense_warmup_fraction=0.1")
    assert (cfg.dense_warmup_steps, cfg.sparse_steps) == (2, 8)
    assert (
        _sixteen_steps(
            "sparsity.sparse_fraction=0", "sparsity.dense_warmup_fraction=0.1"
        ).dense_warmup_steps
        == 0
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["sparsity.dense_warmup_fraction=1"], r"sparsity.dense_warmup_fraction"),  # range: [0, 1)
        (["sparsity.dense_warmup_fraction=-0.1"], r"sparsity.dense_warmup_fraction"),
        (
            ["sparsity.dense_warmup_fraction=0.02"],
            r"makes the first 0 of 16 steps dense, but the sparse phase ends at "
            r"step 8 \(sparsity.sparse_fraction=0.5\): it must leave at least one",
        ),
        (
            ["sparsity.dense_warmup_fraction=0.5"],
            r"the first 8 of 16 steps dense, but the sparse phase ends at step 8",
        ),
        (["sparsity.dense_warmup_fraction=0.6"], r"makes the first 10 of 16 steps dense"),
    ],
)
def test_dense_warm_up_refusals_name_the_key(overrides, message):
    from configs.load import ConfigError

    with pytest.raises(ConfigError, match=message):
        _sixteen_steps("sparsity.sparse_fraction=0.5", *overrides)


def test_lr_restart_at_the_switch_by_hand():
    """Half the steps sparse, the learning rate restarted at the switch from half its peak: steps
    0-7 are the one cosine's (4 warm-up steps, then its first 4 of 12), steps 8-15 a cosine over 8
    steps from peak / 2 to min_lr; the last layer's follows it after its frozen first epoch."""
    base = _sixteen_steps("sparsity.sparse_fraction=0.5")
    cfg = _sixteen_steps("sparsity.sparse_fraction=0.5", "optim.lr_restart_at_switch=true")
    one, restarted = build_schedules(base, 1), build_schedules(cfg, 1)
    peak, low = float(one.lr.max()), cfg.optim.min_lr
    dense = [low + 0.5 * (peak / 2 - low) * (1 + math.cos(math.pi * i / 8)) for i in range(8)]
    np.testing.assert_allclose(restarted.lr[:8], one.lr[:8], rtol=0, atol=0)
    np.testing.assert_allclose(restarted.lr[8:], dense, rtol=1e-12, atol=0)
    assert restarted.lr[8] == pytest.approx(peak / 2) != one.lr[8]
    np.testing.assert_allclose(restarted.last_layer_lr[4:], restarted.lr[4:], rtol=0, atol=0)
    assert not restarted.last_layer_lr[:4].any()
    for name in ("weight_decay", "momentum", "teacher_temp"):  # the other schedules are untouched
        np.testing.assert_array_equal(getattr(restarted, name), getattr(one, name))


def test_lr_restart_at_a_fraction_is_the_dense_control_and_takes_its_peak():
    """A run without a switch restarts at round(0.5 x 16) = step 8, as the 50% run at its switch;
    lr_restart_peak sets where the second cosine starts."""
    control = build_schedules(_sixteen_steps("optim.lr_restart_fraction=0.5"), 1).lr
    at_switch = build_schedules(
        _sixteen_steps("sparsity.sparse_fraction=0.5", "optim.lr_restart_at_switch=true"), 1
    ).lr
    np.testing.assert_array_equal(control, at_switch)
    quarter = build_schedules(
        _sixteen_steps("optim.lr_restart_fraction=0.5", "optim.lr_restart_peak=0.25"), 1
    ).lr
    assert quarter[8] == pytest.approx(control.max() / 4) and quarter[8] == pytest.approx(
        control[8] / 2
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["sparsity.sparse_fraction=0", "optim.lr_restart_at_switch=true"],
            r"optim.lr_restart_at_switch=true needs a switch",
        ),
        (
            ["optim.lr_restart_fraction=0.2"],
            r"restart \(optim.lr_restart_fraction=0.2\) falls at step 3 of 16: it must come after "
            r"the warm-up's 4 steps",
        ),
        (
            [
                "sparsity.sparse_fraction=0.5",
                "optim.lr_restart_at_switch=true",
                "optim.lr_restart_fraction=0.5",
            ],
            "both place the learning rate's restart",
        ),
        (["optim.lr_restart_peak=1.5"], r"optim.lr_restart_peak=1.5 is out of range"),
        (["optim.lr_restart_fraction=1"], r"optim.lr_restart_fraction"),
    ],
)
def test_lr_restart_refusals_name_the_key(overrides, message):
    from configs.load import ConfigError

    with pytest.raises(ConfigError, match=message):
        _sixteen_steps(*overrides)
