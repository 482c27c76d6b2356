"""A sweep's runs are its schedules: every fraction gets a directory of its own, -0 is 0, and two
fractions that give the same number of sparse steps are one run, refused before anything is planned
(in-process, no scheduler)."""

import pytest

from configs import ConfigError
from slurm.launch import main
from slurm.sweep import plan_sweep, run_name

DEFAULT = "configs/default.yaml"  # 300 steps


def test_names_are_distinct_and_minus_zero_is_zero():
    assert run_name(-0.0) == run_name(0.0) == "sparse_0.00"
    assert run_name(0.7) == "sparse_0.70"
    assert run_name(0.3333333) == "sparse_0.3333333" and run_name(0.33333334) == "sparse_0.33333334"


@pytest.mark.parametrize(
    "fractions, message",
    [
        (
            [0.3333333, 0.33333334],
            "0.3333333 and 0.33333334 give the same schedule (100 sparse steps of 300)",
        ),
        ([0.0, -0.0], "duplicates"),
        ([0.5, 0.501], "0.5 and 0.501 give the same schedule (150 sparse steps of 300)"),
    ],
)
def test_fractions_of_one_schedule_are_refused(tmp_path, fractions, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_sweep(DEFAULT, fractions, tmp_path / "s", [])
    assert not (tmp_path / "s").exists()


def test_minus_zero_on_the_command_line_is_the_dense_run(tmp_path, capsys):
    assert (
        main(
            [
                "--config",
                DEFAULT,
                "--sparse-fractions",
                "-0",
                "--runs-dir",
                str(tmp_path / "s"),
                "--gpus-per-node",
                "0",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "sparse_0.00" in out and "sparse_-0" not in out


def test_a_planted_link_for_the_job_logs_is_refused(tmp_path, capsys):
    """submitit writes each job's logs and pickles under <run>/slurm: a link there would put them
    elsewhere."""
    run = tmp_path / "s" / "sparse_0.50"
    run.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (run / "slurm").symlink_to(tmp_path / "elsewhere")
    assert (
        main(
            [
                "--config",
                DEFAULT,
                "--sparse-fractions",
                "0.5",
                "--runs-dir",
                str(tmp_path / "s"),
                "--gpus-per-node",
                "0",
                "--dry-run",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert f"{run / 'slurm'} is a symlink" in err and err.count("\n") == 1
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_run_killed_during_its_final_export_is_not_done(tmp_path):
    """The launcher's "training done" is train.py's: a checkpoint at the last step and the final
    teacher."""
    plan = plan_sweep(DEFAULT, [0.5], tmp_path / "s", [])[0]
    run = plan.run_dir
    from rundir.torch_files import save_verified

    (run / "checkpoints").mkdir(parents=True)
    save_verified({"step": plan.last_step}, run / "checkpoints" / f"step_{plan.last_step:08d}.pt")
    plan = plan_sweep(DEFAULT, [0.5], tmp_path / "s", [])[0]
    assert (
        plan.done_steps == plan.last_step
        and not plan.train_done
        and plan.train_action.startswith("resume@")
    )
    (run / "teacher_backbone.pth").write_bytes(b"x")
    assert plan_sweep(DEFAULT, [0.5], tmp_path / "s", [])[0].train_done


def test_a_damaged_last_checkpoint_is_not_done(tmp_path):
    """A truncated copy of the last checkpoint beside its digest: train.py sets it aside and resumes
    from the one before, so the launcher must not call training done (and submit only a probe that
    finds no new teacher)."""
    from rundir.torch_files import save_verified

    plan = plan_sweep(DEFAULT, [0.5], tmp_path / "s", [])[0]
    run = plan.run_dir
    (run / "checkpoints").mkdir(parents=True)
    save_verified({"step": 3}, run / "checkpoints" / "step_00000003.pt")
    last = run / "checkpoints" / f"step_{plan.last_step:08d}.pt"
    save_verified({"step": plan.last_step, "weights": list(range(1000))}, last)
    (run / "teacher_backbone.pth").write_bytes(b"x")
    assert plan_sweep(DEFAULT, [0.5], tmp_path / "s", [])[0].train_done
    last.write_bytes(last.read_bytes()[:100])  # truncated, its digest kept
    plan = plan_sweep(DEFAULT, [0.5], tmp_path / "s", [])[0]
    assert (plan.done_steps, plan.train_done, plan.train_action) == (3, False, "resume@3")
