"""CPU tests of bench_sparse's results: several runs merged (a later run's row replaces an earlier
one of the same key, each row keeps which run it came from), and a printed log read back like its
JSON."""

import json
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # the repository root: scripts.benchmarks

from scripts.benchmarks.sparse_results import merge_runs, read_run  # noqa: E402

INFO = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "arch": "sm90",
    "torch": "2.11.0",
    "cusparselt": 800,
    "ceilings": {"copy_TBps": 3.0},
}


def _row(backend, ms, dtype="bfloat16", gemm="fwd"):
    return dict(
        op="gemm",
        gemm=gemm,
        backend=backend,
        graph=False,
        tokens=32768,
        in_features=1024,
        out_features=4096,
        dtype=dtype,
        ms=ms,
        dense_ms=0.4,
        speedup=round(0.4 / ms, 4),
    )


def test_a_later_run_replaces_rows_of_the_same_key_and_keeps_the_others(tmp_path):
    first, second = tmp_path / "bf16.json", tmp_path / "again.log"
    first.write_text(
        json.dumps(
            {**INFO, "rows": [_row("cusparselt", 0.3), _row("cusparselt", 0.5, gemm="dgrad")]}
        )
    )
    # a stdout log: the info line first, then one JSON row per line, with other output between
    second.write_text(
        json.dumps(INFO)
        + "\nINFO sparsity: something\n"
        + json.dumps(_row("cusparselt", 0.25))
        + "\n"
    )
    assert read_run(str(second)) == (INFO, [_row("cusparselt", 0.25)])
    out, md = tmp_path / "m.json", tmp_path / "m.md"
    merge_runs([str(first), str(second)], str(out), str(md))
    merged = json.loads(out.read_text())
    by_gemm = {r["gemm"]: r for r in merged["rows"]}
    assert by_gemm["fwd"]["ms"] == 0.25 and by_gemm["fwd"]["run"] == 1  # replaced by the later run
    assert by_gemm["dgrad"]["ms"] == 0.5 and by_gemm["dgrad"]["run"] == 0
    assert [r["source"] for r in merged["runs"]] == ["bf16.json", "again.log"]
    row = (
        "| gemm | fwd | cusparselt | no | 32768 | 1024→4096 | bfloat16 | 0.2500 | 0.4000 | 1.600x |"
    )
    assert row in md.read_text()
