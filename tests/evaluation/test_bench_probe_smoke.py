"""scripts/bench_probe.py runs end to end at toy size on CPU and writes its record where --out
says."""

import importlib.util
import json

from eval_test_helpers import REPO


def test_bench_probe_cpu_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_probe", REPO / "scripts" / "bench_probe.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "sub" / "probe.json"
    assert (
        bench.main(
            [
                "--n-train",
                "2000",
                "--n-val",
                "400",
                "--dim",
                "64",
                "--classes",
                "10",
                "--n-c",
                "7",
                "--sklearn-n",
                "300",
                "--sklearn-n-c",
                "1",
                "--agreement",
                "0",
                "--device",
                "cpu",
                "--precision",
                "float32_3xtf32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    record = json.loads(out.read_text())
    assert record["precision"] == "float32_3xtf32" and record["n_C_done"] == 7
    assert len(record["iterations_per_C"]) == 7 and record["total_iterations"] >= sum(
        record["iterations_per_C"]
    )
    check = record["float64_check"]
    assert check["C"] == record["best_C"] and check["probe_precision"] == "float32_3xtf32"
    assert (
        check["rel_gap"] < 1e-4 and abs(check["probe_val_top1"] - check["float64_val_top1"]) <= 0.25
    )
    assert record["prediction"]["precision"] == "float32_3xtf32" and record["evaluation_ms"] > 0
