"""CPU tests of auto's per-mode decisions (eager vs graph)."""

import pytest
import torch


def test_auto_keeps_one_choice_per_mode(monkeypatch):
    """auto decides once per shape and mode: eager timings (host included) pick `choice`,
    device-only timings pick `choice_graph`, used while a CUDA graph is being captured."""
    from sparsity.backends.auto import MARGIN, AutoBackend

    auto = AutoBackend()
    calls = []

    def fake_measure(weight, pruning, tokens, has_bias, in_backward=False):
        calls.append(tokens)
        # eager: sparse host-bound (slower); device only: sparse faster
        return (1.0, 0.8), (0.5, 0.6), "fake"

    monkeypatch.setattr(auto, "_sparse_unavailable", lambda w, t: None)
    monkeypatch.setattr(auto, "_measure", fake_measure)
    capturing = {"on": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["on"])
    w = torch.zeros(64, 32)
    assert auto.decide(w, "tile_greedy", 128, True) == "dense"
    capturing["on"] = True
    assert auto.decide(w, "tile_greedy", 128, True) == "cusparselt"
    assert calls == [128]  # timed once
    (rec,) = auto.describe()["decisions"]
    assert rec["choice"] == "dense" and rec["choice_graph"] == "cusparselt"
    assert rec["speedup"] == pytest.approx(0.8) and rec["speedup_graph"] == pytest.approx(1.2)
    assert rec["speedup_graph"] > MARGIN > rec["speedup"]
    # a new shape first met during capture: dense, not remembered (no timing is possible inside a
    # capture)
    assert auto.decide(w, "tile_greedy", 256, True) == "dense"
    assert len(auto.describe()["decisions"]) == 1


def test_auto_unavailable_is_dense_in_both_modes(monkeypatch):
    from sparsity.backends.auto import AutoBackend

    auto = AutoBackend()
    monkeypatch.setattr(auto, "_sparse_unavailable", lambda w, t: "no GPU here")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert auto.decide(torch.zeros(64, 32), "tile_greedy", 128, False) == "dense"
    (rec,) = auto.describe()["decisions"]
    assert rec["choice"] == rec["choice_graph"] == "dense" and rec["reason"] == "no GPU here"
