"""CPU tests of auto's per-mode decisions (eager vs graph)."""

import pytest
import torch


def _timed_auto(monkeypatch, eager, graph):
    """An AutoBackend whose timings are (sparse, dense) ms `eager` and `graph`, with sparse
    available everywhere; returns it and the token counts it was asked to time."""
    from sparsity.backends.auto import AutoBackend

    auto, timed = AutoBackend(), []

    def fake_measure(weight, pruning, tokens, has_bias, in_backward=False):
        timed.append(tokens)
        return eager, graph, "fake"

    monkeypatch.setattr(auto, "_sparse_unavailable", lambda w, t: None)
    monkeypatch.setattr(auto, "_measure", fake_measure)
    return auto, timed


def test_auto_keeps_one_choice_per_mode(monkeypatch):
    """auto decides once per shape and mode: eager timings (host included) pick `choice`,
    device-only timings pick `choice_graph`, used while a CUDA graph is being captured."""
    from sparsity.backends.auto import MARGIN

    # eager: sparse host-bound (slower); device only: sparse faster
    auto, calls = _timed_auto(monkeypatch, eager=(1.0, 0.8), graph=(0.5, 0.6))
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


@pytest.mark.parametrize(
    "tokens, padded", [(30779, 30784), (25216, 25216), (13246, 13248), (1, 8), (8, 8)]
)
def test_padded_token_count_is_the_count_rounded_up_to_eight(tokens, padded):
    from sparsity.backends.cusparselt.library import padded_token_count

    assert padded_token_count(tokens) == padded


def test_a_key_met_while_tracing_is_timed_at_the_rows_the_compiled_gemm_runs(monkeypatch):
    """The compiled layer pads 30,779 rows to 30,784 and runs one GEMM; the eager layer runs the
    last three rows as a second GEMM. A key first met while tracing is timed at 30,784 rows and
    recorded under its own count; one first met eagerly is timed at its own count."""
    import sparsity.backends.auto as auto_mod

    auto, timed = _timed_auto(monkeypatch, eager=(1.0, 1.1), graph=(1.0, 1.1))
    monkeypatch.setattr(auto_mod, "_timing_weight", lambda o, i, d, t: torch.zeros(o, i, dtype=t))
    cuda = torch.device("cuda", 0)
    choice = auto.choice_for_trace(cuda, torch.bfloat16, 1024, 1024, 30779, "tile_greedy", True)
    assert choice == "cusparselt" and timed == [30784]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    auto.decide(torch.zeros(1024, 1024, dtype=torch.bfloat16), "tile_greedy", 13246, True)
    assert timed == [30784, 13246]
    traced, eager = auto.describe()["decisions"]
    assert (traced["tokens"], traced["timed_tokens"], traced["first_met"]) == (
        30779,
        30784,
        "compiled",
    )
    assert (eager["tokens"], eager["timed_tokens"], eager["first_met"]) == (13246, 13246, "eager")


@pytest.mark.parametrize("outside_mb, warns", [(850.0, False), (14_300.0, True)])
def test_auto_records_the_memory_others_held_and_warns_once_when_the_gpu_was_shared(
    monkeypatch, caplog, outside_mb, warns
):
    """A decision timed while far more memory than a process's own context was held outside its
    allocator (another process on the GPU) says so in its record and warns once a run, naming the
    remedy; a GPU of the run's own (0.85 GB outside, as measured alone on one H200) stays silent."""
    import logging

    import sparsity.backends.auto as auto_module

    auto, _ = _timed_auto(monkeypatch, eager=(0.5, 0.6), graph=(0.5, 0.6))
    seen = []

    def fake_outside(device):
        seen.append(device)
        return outside_mb

    monkeypatch.setattr(auto_module, "device_memory_outside_mb", fake_outside)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    w = torch.zeros(64, 32)
    with caplog.at_level(logging.WARNING, logger=auto_module.__name__):
        auto.decide(w, "tile_greedy", 128, True)
        auto.decide(w, "tile_greedy", 256, True)
    records = auto.describe()["decisions"]
    assert [r["memory_outside_mb"] for r in records] == [round(outside_mb)] * 2
    assert seen == [w.device, w.device]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if warns:
        (message,) = warnings  # once, not once a shape
        assert "tokens=128 in=32 out=64" in message and "14.0 GB" in message
        assert "sparsity.backend=cusparselt or dense" in message
    else:
        assert warnings == []


def test_device_memory_outside_is_what_the_allocator_does_not_hold(monkeypatch):
    """Free and total from the driver, less what this process's allocator reserved: 80 GiB total,
    60 GiB free and 12 GiB reserved leave 8 GiB = 8192 MB outside; never negative; None off CUDA."""
    from sparsity.backends.timing import device_memory_outside_mb

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (60 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 12 * gib)
    assert device_memory_outside_mb(torch.device("cuda", 0)) == 8192.0
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 30 * gib)
    assert device_memory_outside_mb(torch.device("cuda", 0)) == 0.0
    assert device_memory_outside_mb(torch.device("cpu")) is None


def test_auto_and_the_tables_draw_the_shared_gpu_line_at_one_bound():
    """auto's warning and the tables' dropped speed columns judge "another process shared the GPU"
    by the same memory bound (two constants, since the torch-free reporting cannot import sparsity)."""
    from reporting.speed_columns import SHARED_GPU_MB
    from sparsity.backends.auto import SHARED_DEVICE_MB

    assert SHARED_DEVICE_MB == SHARED_GPU_MB
