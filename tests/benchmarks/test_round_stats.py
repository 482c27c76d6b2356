"""Round-by-round ratios and ablation savings of the step benchmark (`scripts/benchmarks/round_stats.py`)
and the command that pools them over files (`scripts/bench_rounds.py`), against hand-computed
cases."""

import json

import pytest

from scripts import bench_rounds
from scripts.benchmarks.round_stats import again_label, ratio_rounds, round_stats, saving_rounds


def row(name: str, *ms: float) -> dict:
    return {"row": name, "ms": sorted(ms)[len(ms) // 2], "rounds": [{"ms": m} for m in ms]}


ROWS = [
    row("stepgraph-dense", 200.0, 210.0),
    row("stepgraph-dense, attention-per-crop", 199.0, 208.0),
    row("stepgraph-dense (again)", 202.0, 206.0),
    row("stepgraph-auto", 190.0, 200.0),
    row("stepgraph-auto, attention-per-crop", 187.0, 196.0),
    row("stepgraph-auto (again)", 188.0, 198.0),
    row("compiled-auto", 180.0, 181.0),  # no compiled-dense in this run: no ratio
]


def test_each_sparse_row_against_its_modes_dense_row_round_by_round():
    ratios = ratio_rounds(ROWS)
    assert set(ratios) == {"stepgraph-auto", "stepgraph-auto, attention-per-crop"}
    assert ratios["stepgraph-auto"] == pytest.approx([200 / 190, 210 / 200])
    # under the ablation, against the dense row under the same ablation
    assert ratios["stepgraph-auto, attention-per-crop"] == pytest.approx([199 / 187, 208 / 196])


def test_an_ablation_saves_against_the_mean_of_the_rows_on_either_side():
    savings = saving_rounds(ROWS)
    # dense: (200 + 202) / 2 - 199 = 2, (210 + 206) / 2 - 208 = 0
    assert savings["stepgraph-dense, attention-per-crop"] == pytest.approx([2.0, 0.0])
    # sparse: (190 + 188) / 2 - 187 = 2, (200 + 198) / 2 - 196 = 3
    assert savings["stepgraph-auto, attention-per-crop"] == pytest.approx([2.0, 3.0])
    assert "stepgraph-auto" not in savings


def test_two_ablations_each_save_against_the_row_run_again_right_after_it():
    # the step benchmark's order: row, first ablation, row again, second ablation, row again
    rows = [
        row("stepgraph-dense", 200.0),
        row("stepgraph-dense, attention-per-crop", 199.0),
        row(again_label("stepgraph-dense", "attention-per-crop"), 204.0),
        row("stepgraph-dense, mlp-per-crop", 201.0),
        row(again_label("stepgraph-dense", "mlp-per-crop"), 208.0),
        row("stepgraph-auto", 190.0),
    ]
    savings = saving_rounds(rows)
    assert savings == {
        "stepgraph-dense, attention-per-crop": pytest.approx([3.0]),  # (200 + 204) / 2 - 199
        "stepgraph-dense, mlp-per-crop": pytest.approx([3.0]),  # (200 + 208) / 2 - 201
    }
    assert set(ratio_rounds(rows)) == {"stepgraph-auto"}  # no ratio for a row run again


def test_rounds_pool_over_files_and_the_interval_is_students_t():
    a = {"rows": [row("stepgraph-dense", 100.0, 104.0), row("stepgraph-auto", 100.0, 100.0)]}
    b = {"rows": [row("stepgraph-dense", 102.0), row("stepgraph-auto", 100.0)]}
    s = round_stats([a, b])["ratio"]["stepgraph-auto"]
    # rounds 1.00, 1.04, 1.02: mean 1.02, sd 0.02, t(0.975, 2) = 4.3027
    assert s["rounds"] == 3 and s["mean"] == pytest.approx(1.02)
    half = 4.302653 * 0.02 / 3**0.5
    assert s["low"] == pytest.approx(1.02 - half, abs=1e-6)
    assert s["high"] == pytest.approx(1.02 + half, abs=1e-6)
    one = round_stats([b])["ratio"]["stepgraph-auto"]
    assert one["rounds"] == 1 and one["low"] is None and one["high"] is None


def write(tmp_path, name: str, **fields) -> str:
    result = {"gpu": "NVIDIA H200", "config": "c.yaml", "overrides": [], "rows": ROWS, **fields}
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return str(path)


def test_the_command_pools_files_of_one_setting_and_writes_the_statistics(tmp_path, capsys):
    out = tmp_path / "stats.json"
    files = [write(tmp_path, "a.json"), write(tmp_path, "b.json")]
    bench_rounds.main([*files, "--out", str(out)])
    stats = json.loads(out.read_text())
    assert stats["ratio"]["stepgraph-auto"]["rounds"] == 4
    assert stats["saving_ms"]["stepgraph-auto, attention-per-crop"]["mean"] == pytest.approx(2.5)
    printed = capsys.readouterr().out
    assert "2 file(s)" in printed and "saves +2.50 ms a step over 4 rounds" in printed


@pytest.mark.parametrize(
    "second, message",
    [
        ({"overrides": ["sparsity.modules=x"]}, "overrides .* differs from"),
        ({"gpu": "NVIDIA H100 80GB HBM3"}, "gpu .* differs from"),
    ],
)
def test_the_command_refuses_files_of_another_setting_before_any_statistic(
    tmp_path, second, message
):
    out = tmp_path / "stats.json"
    files = [write(tmp_path, "a.json"), write(tmp_path, "b.json", **second)]
    with pytest.raises(SystemExit, match=message):
        bench_rounds.main([*files, "--out", str(out)])
    assert not out.exists()


def test_the_command_names_a_file_that_is_not_a_benchmark_result(tmp_path):
    other = tmp_path / "b.json"
    other.write_text(json.dumps({"gpu": "NVIDIA H200", "config": "c.yaml", "overrides": []}))
    with pytest.raises(SystemExit, match="b.json: not a bench_train_step result .no rows"):
        bench_rounds.main([write(tmp_path, "a.json"), str(other)])


def test_the_command_names_a_file_it_cannot_read(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match="bad.json: not a readable JSON file"):
        bench_rounds.main([str(bad)])
