"""Schedules against hand-computed values."""

import math

import numpy as np
import pytest

from configs import load_config
from training.schedules import build_schedules, cosine_schedule, linear_then_constant


def test_cosine_schedule_by_hand():
    s = cosine_schedule(1.0, 0.0, total_iters=6, warmup_iters=2, start_warmup_value=0.5, freeze_iters=1)
    # freeze: 0 | warm-up linspace(0.5, 1, 2) = 0.5, 1 | cosine over 3 iters: 0.5 * (1 + cos(pi * i / 3))
    expected = [0.0, 0.5, 1.0, 1.0, 0.75, 0.25]
    np.testing.assert_allclose(s, expected, atol=1e-12)


def test_cosine_schedule_rejects_too_long_warmup():
    with pytest.raises(ValueError, match="exceed"):
        cosine_schedule(1.0, 0.0, total_iters=3, warmup_iters=4)


def test_linear_then_constant_by_hand():
    np.testing.assert_allclose(linear_then_constant(0.04, 0.07, 4, 6), [0.04, 0.05, 0.06, 0.07, 0.07, 0.07])


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
    np.testing.assert_allclose([s.at(0)[k] for k in ("wd", "momentum", "teacher_temp")], [0.04, 0.992, 0.04])
    assert math.isclose(s.at(124_999)["wd"], 0.4, rel_tol=1e-6)
    assert math.isclose(s.at(124_999)["momentum"], 1.0, rel_tol=1e-6)
    assert math.isclose(s.at(30 * 1250 - 1)["teacher_temp"], 0.07)  # linear over 30 epochs, then constant
    assert s.at(100_000)["teacher_temp"] == 0.07
    assert s.at(10**9) == s.at(124_999)  # past the end: final values
