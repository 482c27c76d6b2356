"""The step benchmark's `--rounds`: rows take turns, and each row's rounds merge into one row (CPU,
timing faked)."""

import json
from types import SimpleNamespace

import pytest

from scripts import bench_train_step as B


def a_round(times, gc_ms, gen1, mhz, profile=False):
    out = {
        "row": "compiled-dense",
        "ms": sorted(times)[len(times) // 2],
        "min_ms": min(times),
        "max_ms": max(times),
        "times_ms": times,
        "peak_gib": 30.0 + gc_ms,
        "per_step": {"host_ms": [1.0] * len(times), "gc_ms": [gc_ms] * len(times)},
        "gc": {"collections": {"gen0": 0, "gen1": gen1, "gen2": 0}, "ms": gc_ms, "max_ms": gc_ms},
        "gpu_state": {"sm_mhz": mhz},
    }
    if profile:
        out["profile"] = {"busy_ms": 9.0}
    return out


def test_rounds_merge_into_one_row_by_hand():
    merged = B.merge_rounds(
        [
            a_round([10.0, 30.0, 20.0], 1.5, 1, 1800.0),
            a_round([40.0, 12.0], 4.0, 2, 1600.0, profile=True),
        ]
    )
    assert merged["times_ms"] == [10.0, 30.0, 20.0, 40.0, 12.0]
    assert (
        merged["ms"] == 20.0 and merged["min_ms"] == 10.0 and merged["max_ms"] == 40.0
    )  # over all five steps
    assert merged["rounds"] == [
        {"ms": 20.0, "gpu_state": {"sm_mhz": 1800.0}},
        {"ms": 40.0, "gpu_state": {"sm_mhz": 1600.0}},
    ]
    assert merged["gc"] == {
        "collections": {"gen0": 0, "gen1": 3, "gen2": 0},
        "ms": 5.5,
        "max_ms": 4.0,
    }
    assert merged["per_step"]["gc_ms"] == [1.5] * 3 + [4.0] * 2 and merged["peak_gib"] == 34.0
    assert merged["profile"] == {"busy_ms": 9.0} and "gpu_state" not in merged
    single = a_round([1.0], 0.0, 0, 1980.0)
    assert B.merge_rounds([single]) is single  # one round: the row as it ran


def test_rows_take_turns_and_profile_once(monkeypatch, tmp_path):
    ran = []

    def fake_run_row(trainer, batch, row, args, step_gc, label=None, extras=True):
        ran.append((label or row, extras))
        return dict(a_round([float(len(ran))], 0.0, 0, 1900.0), row=label or row)

    class FakeTrainer:
        compiled, cfg = (
            [],
            SimpleNamespace(train=SimpleNamespace(gc_period=0, batch_size_per_gpu=1)),
        )
        schedules = SimpleNamespace(at=lambda step: {})
        step_graph = None

        def __init__(self, cfg, *a):
            self.cfg, self.model = cfg, SimpleNamespace(train=lambda: None)

    monkeypatch.setattr(B, "run_row", fake_run_row)
    monkeypatch.setattr(B, "set_row", lambda trainer, row: None)
    monkeypatch.setattr(B, "Trainer", FakeTrainer)
    monkeypatch.setattr(B, "synthetic_batch", lambda cfg, device: None)
    monkeypatch.setattr(B.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(B.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(B.torch.cuda, "get_device_name", lambda: "fake")
    monkeypatch.setattr(B, "sparse_decisions", lambda: {})
    monkeypatch.setattr(B, "_cusparselt_library", lambda: {})
    monkeypatch.setattr(B, "print_table", lambda result: None)
    monkeypatch.setattr(
        B,
        "step_flops",
        lambda trainer, batch, values: {
            "total": 10**12,
            "student_mlp": 3 * 10**11,
            "teacher_mlp": 10**11,
        },
    )
    monkeypatch.setattr(B, "gemm_rate_tflops", lambda device: 100.0)
    monkeypatch.setattr(
        "sys.argv",
        [
            "bench",
            "--rows",
            "compiled-dense",
            "compiled-cusparselt",
            "--rounds",
            "3",
            "--iters",
            "1",
            "--out",
            str(tmp_path / "out.json"),
        ],
    )
    B.main()
    out = json.loads((tmp_path / "out.json").read_text())
    # every row's MFU: 1 TFLOP in 5 or 6 ms (the fake rounds' medians) of 100 TFLOP/s; the sparse
    # row's student MLP runs two of its three GEMMs 2:4, at half their FLOPs: 0.1 TFLOP fewer
    # executed
    assert [r["row"] for r in out["rows"]] == ["compiled-dense", "compiled-cusparselt"]
    assert [r["mfu"]["nominal_mfu"] for r in out["rows"]] == [
        round(1e12 / 3e-3 / 100e12, 4),
        round(1e12 / 4e-3 / 100e12, 4),
    ]
    assert [r["mfu"]["executed_tflop"] for r in out["rows"]] == [1.0, 0.9]
    assert ran == [("compiled-dense", False), ("compiled-cusparselt", False)] * 2 + [
        ("compiled-dense", True),
        ("compiled-cusparselt", True),
    ]


def test_rounds_below_one_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(B.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("sys.argv", ["bench", "--rounds", "0"])
    with pytest.raises(SystemExit):
        B.main()
    assert "--rounds 0: at least 1" in capsys.readouterr().err


def test_every_row_compiles_before_the_heat_and_the_heat_runs_the_first_compiled_row(monkeypatch):
    """The first GPU run of --heat-s 60 --rounds 4 heated for one step: the 60 s went to compiling
    the first row, and the later rows' compiles let the GPU cool before round 1. Now every row warms
    up first, then the heat runs."""
    events, current = [], {}

    class FakeTrainer:
        schedules = SimpleNamespace(at=lambda step: {"step": step})

        def train_step(self, batch, values):
            events.append(("step", current["row"]))

        def settle_checks(self):
            events.append(("settle", None))

    def fake_set_row(trainer, row):
        current["row"] = row

    monkeypatch.setattr(B, "set_row", fake_set_row)
    monkeypatch.setattr(B, "gpu_state", lambda: {"sm_mhz": 1.0})
    monkeypatch.setattr(B, "heat", lambda step, seconds: [step() for _ in range(3)] and 3)
    out = B.compile_then_heat(
        FakeTrainer(), None, ["eager-dense", "compiled-dense", "compiled-auto"], 2, 60.0
    )
    assert events == [("step", "eager-dense")] * 2 + [("step", "compiled-dense")] * 2 + [
        ("step", "compiled-auto")
    ] * 2 + [("settle", None)] + [("step", "compiled-dense")] * 3 + [("settle", None)]
    assert out == {"steps": 3, "seconds": 60.0, "gpu_state": {"sm_mhz": 1.0}}


def test_rows_of_a_mode_are_named_after_it_and_eager_rows_run_in_the_default_mode_only():
    rows = ["eager-dense", "compiled-dense", "compiled-cusparselt"]
    assert B.mode_rows(rows, "default") == rows
    assert B.mode_rows(rows, "step-graph") == ["stepgraph-dense", "stepgraph-cusparselt"]
    assert B.mode_rows(rows, "reduce-overhead") == ["graphs-dense", "graphs-cusparselt"]


def test_row_names_say_mode_backend_teacher_and_weight_gradient():
    cfg = SimpleNamespace(sparsity=SimpleNamespace(teacher="dense", weight_grad="dense"))
    trainer = SimpleNamespace(cfg=cfg)
    assert B.parse_row("compiled-auto+teacher") == ("compiled", "auto", {"teacher"})
    assert B.parse_row("compiled-auto+teacher+mvue") == ("compiled", "auto", {"teacher", "mvue"})
    assert B.parse_row("eager-dense") == ("eager", "dense", set())
    assert B.wgrad_sparse(trainer, "compiled-auto+mvue") and not B.wgrad_sparse(
        trainer, "compiled-auto+teacher"
    )
    assert not B.wgrad_sparse(trainer, "compiled-dense+mvue")  # a dense row runs no 2:4 GEMM
    assert B.parse_row("compiled-auto+teacher+mvue-fc2") == (
        "compiled",
        "auto",
        {"teacher", "mvue-fc2"},
    )
    assert B.wgrad_modules(trainer, "compiled-auto+mvue-fc2") == r".*\.fc2"
    cfg.sparsity.weight_grad, cfg.sparsity.weight_grad_modules = "mvue24", "blocks.0.mlp.fc1"
    assert (
        B.wgrad_modules(trainer, "compiled-auto") == "blocks.0.mlp.fc1"
    )  # the config's own setting
    assert B.teacher_sparse(trainer, "compiled-auto+teacher") and not B.teacher_sparse(
        trainer, "compiled-auto"
    )
    assert not B.teacher_sparse(trainer, "compiled-dense")  # a dense row has no sparse teacher
    cfg.sparsity.teacher = "sparse"  # the config's own setting makes every sparse row's teacher 2:4
    assert B.teacher_sparse(trainer, "compiled-auto") and not B.teacher_sparse(
        trainer, "compiled-dense"
    )


def test_set_row_makes_the_teacher_sparse_only_in_its_rows():
    class FakeTrainer:
        def __init__(self):
            self.model = SimpleNamespace(
                student=SimpleNamespace(backbone="S"), teacher=SimpleNamespace(backbone="T")
            )
            self.cfg = SimpleNamespace(
                sparsity=SimpleNamespace(teacher="dense", weight_grad="dense")
            )
            self.sparsity = SimpleNamespace(
                backend="auto", weight_grad="dense", weight_grad_modules=".*"
            )
            self.sparse = set()

        def enter_phase(self, phase):
            self.sparse = (
                set(self.sparse_targets)
                if phase == "sparse"
                else self.sparse - set(self.sparse_targets)
            )

    t = FakeTrainer()
    B.set_row(t, "compiled-cusparselt+teacher")
    assert (
        t.sparse == {"S", "T"}
        and t.sparsity.backend == "cusparselt"
        and t.sparsity.weight_grad == "dense"
    )
    B.set_row(
        t, "compiled-auto+mvue"
    )  # the teacher the last row made sparse goes dense; MVUE weight gradients
    assert t.sparse == {"S"} and t.sparsity.weight_grad == "mvue24"
    B.set_row(t, "compiled-auto+mvue-fc2")  # MVUE on the second MLP linear alone
    assert t.sparsity.weight_grad == "mvue24" and t.sparsity.weight_grad_modules == r".*\.fc2"
    B.set_row(t, "compiled-auto+mvue")
    assert t.sparsity.weight_grad_modules == ".*"
    B.set_row(t, "compiled-auto")
    assert t.sparse == {"S"} and t.sparsity.weight_grad == "dense"
    B.set_row(t, "compiled-dense")
    assert t.sparse == set()


def test_finish_ledgers_idle_projections_and_in_place():
    from scripts.benchmarks.ledger import CLASSES

    def led(**ms):
        return {"ms": dict(dict.fromkeys(CLASSES, 0.0), **ms), "busy_ms": 150.0}

    rows = [
        {
            "row": "compiled-dense",
            "ms": 200.0,
            "sparse": {"student_gemms_2to4": 0, "teacher": False},
            "ledger": led(
                student_mlp_forward=20.0, student_mlp_input_grad=20.0, teacher_mlp_forward=10.0
            ),
        },
        {
            "row": "compiled-auto+teacher",
            "ms": 190.0,
            "sparse": {"student_gemms_2to4": 2, "teacher": True},
            "ledger": led(
                student_mlp_forward=15.0,
                student_mlp_input_grad=15.0,
                teacher_mlp_forward=7.0,
                student_prune_pack=2.0,
                teacher_prune_pack=1.0,
            ),
        },
    ]
    B.finish_ledgers(rows)
    dense, sparse = rows[0]["ledger"], rows[1]["ledger"]
    assert dense["idle_ms"] == 50.0 and sparse["idle_ms"] == 40.0
    assert dense["projections"][0]["coverage"] == "today" and "projections" not in sparse
    assert sparse["in_place"]["dense_ms"] == 50.0 and sparse["in_place"]["sparse_ms"] == 40.0


def test_wgrad_share_counts_the_student_linears_the_row_puts_on_mvue():
    from torch import nn

    from sparsity import SparseThenDense

    block = lambda: nn.Module()  # noqa: E731
    backbone = nn.Module()
    backbone.blocks = nn.ModuleList([block() for _ in range(3)])
    for b in backbone.blocks:
        b.mlp = nn.ModuleDict({"fc1": nn.Linear(8, 32), "fc2": nn.Linear(32, 8)})
    cfg = SimpleNamespace(
        sparsity=SimpleNamespace(teacher="dense", weight_grad="dense", weight_grad_modules=".*")
    )
    trainer = SimpleNamespace(
        cfg=cfg,
        sparsity=SparseThenDense(1),
        model=SimpleNamespace(student=SimpleNamespace(backbone=backbone)),
    )
    assert B.wgrad_share(trainer, "compiled-auto+mvue") == 1.0
    assert B.wgrad_share(trainer, "compiled-auto+mvue-fc2") == 0.5
    assert (
        B.wgrad_share(trainer, "compiled-auto")
        == 0.0
        == B.wgrad_share(trainer, "compiled-dense+mvue")
    )
    cfg.sparsity.weight_grad, cfg.sparsity.weight_grad_modules = "mvue24", r"blocks\.0\.mlp\.fc1"
    assert B.wgrad_share(trainer, "compiled-auto") == 1 / 6


def test_graph_ms_in_turns_alternates_the_rows_and_takes_each_ones_upper_median(monkeypatch):
    """The probes' timing (graph_ms faked): every round times every row once, in order, and each row
    keeps the upper median of its rounds (one measured value, not an average)."""
    from scripts.benchmarks import timing

    calls, results = [], iter([3.0, 10.0, 1.0, 20.0, 2.0, 30.0, 4.0, 40.0])
    monkeypatch.setattr(
        timing, "graph_ms", lambda step, sets: (calls.append((step, sets)), next(results))[1]
    )
    got = timing.graph_ms_in_turns({"a": "step a", "b": "step b"}, sets=2, rounds=4)
    assert [s for s, _ in calls] == ["step a", "step b"] * 4 and {n for _, n in calls} == {2}
    assert got == {"a": 3.0, "b": 30.0}  # a: 1, 2, 3, 4 -> 3; b: 10, 20, 30, 40 -> 30


def _profiled(row: str, gemms: float, dense_gemm: float, sparse_gemm: float = 0.0) -> dict:
    return {
        "row": row,
        "ms": 100.0,
        "sparse": {"student_gemms_2to4": gemms, "teacher": False},
        "profile": {
            "by_category_ms": {"dense_gemm": dense_gemm, "sparse_gemm": sparse_gemm},
            "busy_ms": 90.0,
        },
    }


def test_sparse_rows_alone_keep_their_profiles_and_get_no_in_place_speedup(capsys):
    # a run of sparse rows alone (an ablation beside a sparse row) once crashed after all its GPU
    # work, looking for a dense row it never timed, and wrote nothing
    rows = [
        _profiled("compiled-auto", 2, 40.0, 20.0),
        _profiled("compiled-auto, attention-per-crop", 2, 42.0, 19.0),
    ]
    B.attach_gemms_2to4(rows)
    assert all("gemms_2to4" not in r and "profile" in r for r in rows)
    assert capsys.readouterr().out.count("no dense row of its mode") == 2
    assert B.ratio_baseline(rows) is None and B.ratio_text(None) == "–"


def test_each_sparse_row_is_compared_with_its_own_modes_dense_row():
    rows = [
        _profiled("compiled-dense", 0, 60.0),
        _profiled("stepgraph-dense", 0, 50.0),
        _profiled("stepgraph-auto, attention-per-crop", 2, 30.0, 10.0),
    ]
    B.attach_gemms_2to4(rows)
    # (50 - 30) ms of dense GEMMs removed for 10 ms of 2:4 GEMMs: against stepgraph-dense, not the
    # compiled one (whose 60 ms would give 3.0)
    assert rows[2]["gemms_2to4"]["in_place_speedup"] == 2.0
    assert "gemms_2to4" not in rows[0] and B.ratio_baseline(rows)["row"] == "compiled-dense"
    assert B.ratio_baseline(rows[1:])["row"] == "stepgraph-dense"
