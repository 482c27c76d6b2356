"""What the sparse backends decided at run time (auto's per-shape choice, cuSPARSELt plans, the
weight-gradient path) is written into the run directory as sparsity_decisions.json once it is made:
on a CPU, `auto` runs every layer dense and says why."""

import json

from sparsity.backends.settings import BackendSettings


def test_decisions_are_written_into_the_run_directory(reference_run):
    path = reference_run / "sparsity_decisions.json"
    record = json.loads(path.read_text())
    assert record["settings"] == {
        "cslt_search": BackendSettings.cslt_search,
        "cslt_pack": BackendSettings.cslt_pack,
        "fused_wgrad": BackendSettings.fused_wgrad,
    }
    assert record["auto_fallbacks"] == [
        {
            "device": "cpu",
            "dtype": "float32",
            "choice": "dense",
            "reason": "weights on cpu: cuSPARSELt runs only on CUDA GPUs",
        }
    ]
    assert record["auto"] == [] and record["cusparselt_plans"] == {} and record["weight_grad"] == []
    assert not [
        p.name
        for p in reference_run.iterdir()
        if p.name.startswith(("sparsity_decisions", ".sparsity"))
        and p.name != "sparsity_decisions.json"
    ], "a temporary file was left behind"
