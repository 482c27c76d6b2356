"""The step benchmark's GPU state (nvidia-smi's clock, temperature, power) and its warm-up by time
(CPU)."""

import subprocess
from types import SimpleNamespace

from scripts.benchmarks import gpu_state as G, timing


def test_a_line_of_nvidia_smi_is_parsed_and_anything_else_is_none():
    assert G.parse("1680, 71, 694.46, 0x0000000000000004") == {
        "sm_mhz": 1680.0,
        "temperature_c": 71.0,
        "power_w": 694.46,
        "throttle_reasons": "0x0000000000000004",
    }
    assert G.parse("[N/A], 71, 694.46, 0x0") is None  # a field the GPU does not report
    assert G.parse("1680, 71") is None
    assert G.parse("") is None


def test_no_nvidia_smi_or_a_failing_one_gives_none(monkeypatch):
    monkeypatch.setattr(G.shutil, "which", lambda name: None)
    assert G.gpu_state() is None
    monkeypatch.setattr(G.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        G.subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=9, stdout="")
    )
    assert G.gpu_state() is None

    def hangs(*a, **k):
        raise subprocess.TimeoutExpired("nvidia-smi", 10)

    monkeypatch.setattr(G.subprocess, "run", hangs)
    assert G.gpu_state() is None
    asked = []

    def answers(cmd, **k):
        asked.append(cmd)
        return SimpleNamespace(returncode=0, stdout="1980, 45, 129.0, 0x0\n")

    monkeypatch.setattr(G.subprocess, "run", answers)
    assert G.gpu_state(3) == {
        "sm_mhz": 1980.0,
        "temperature_c": 45.0,
        "power_w": 129.0,
        "throttle_reasons": "0x0",
    }
    assert "--id=3" in asked[0] and any(a.startswith("--query-gpu=clocks.sm,") for a in asked[0])


def test_heat_steps_for_the_time_given_and_at_least_once(monkeypatch):
    syncs = []
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: syncs.append(1))
    clock = iter(range(1000))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))
    calls = []
    # the clock reads 0 at the start (end = 25), then 1, 2, ... before each call: calls at 1..24
    assert timing.heat(lambda: calls.append(1), seconds=25) == 24 == len(calls)
    assert len(syncs) == 3  # every 10 calls, and once at the end
    assert timing.heat(lambda: None, seconds=0) == 1
