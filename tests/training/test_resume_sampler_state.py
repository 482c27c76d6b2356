"""One resume path for the data stream: a checkpoint holds its loader's sampler state
(`SSLLoader.state_dict`), the trainer restores it with `load_state_dict`; a checkpoint of an older
version, without that state, resumes identically from the state its step implies."""

import shutil

from train_runs import run_train

from rundir.metrics import read_metrics, without_timing
from rundir.torch_files import load_verified, save_verified


def test_checkpoints_hold_the_sampler_state(reference_run):
    state = load_verified(reference_run / "checkpoints" / "step_00000009.pt")
    sampler = state["sampler"]
    # 9 steps of 8 images on one rank, the digits train split (1437 images), train.seed 0
    assert {k: sampler[k] for k in ("position", "world_size", "rank", "seed", "dataset_size")} == {
        "position": 72,
        "world_size": 1,
        "rank": 0,
        "seed": 0,
        "dataset_size": 1437,
    }
    assert sampler["samples_consumed"] == state["samples_consumed"] == 72


def test_a_checkpoint_without_sampler_state_resumes_identically(reference_run, tmp_path):
    name = "step_00000009.pt"
    state = load_verified(reference_run / "checkpoints" / name)
    del state["sampler"]  # as an older version wrote it
    (tmp_path / "checkpoints").mkdir()
    save_verified(state, tmp_path / "checkpoints" / name)
    shutil.copy(reference_run / "config.yaml", tmp_path / "config.yaml")
    lines = (reference_run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "metrics.jsonl").write_text(
        "".join(lines[:9])
    )  # the metrics of the 9 steps it holds
    run_train(tmp_path)
    got = without_timing(read_metrics(tmp_path / "metrics.jsonl"))
    want = without_timing(read_metrics(reference_run / "metrics.jsonl"))
    assert [r["step"] for r in got] == list(range(1, 17))
    assert got == want
    assert (
        load_verified(tmp_path / "checkpoints" / "step_00000012.pt")["sampler"]
        == load_verified(reference_run / "checkpoints" / "step_00000012.pt")["sampler"]
    )
