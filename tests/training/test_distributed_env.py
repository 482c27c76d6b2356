"""Launch detection as a pure function of the environment: torchrun, `srun torchrun`, plain `srun`,
sbatch script."""

import pytest

from training.distributed import LaunchError, detect_launch, first_host, slurm_port

TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "16",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "gpu017",
    "MASTER_PORT": "29500",
    "LOCAL_WORLD_SIZE": "8",
    "TORCHELASTIC_RUN_ID": "42",
}
# what an `srun` task of a 2-node x 4-task step sees (task 6 = node 1, local task 2)
SRUN_TASK = {
    "SLURM_JOB_ID": "123456",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "6",
    "SLURM_LOCALID": "2",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[017-018]",
    "SLURM_STEP_NODELIST": "gpu[017-018]",
}


def test_torchrun():
    launch = detect_launch(TORCHRUN)
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == (
        "torchrun",
        5,
        16,
        1,
    )
    assert (launch.master_addr, launch.master_port) == ("gpu017", 29500)


def test_srun_torchrun_uses_the_torchrun_ranks_not_the_slurm_task():
    # srun starts one torchrun agent per node (SLURM_PROCID = node index, SLURM_NTASKS = nodes); its
    # workers see both sets of variables and must take torchrun's
    env = {
        **SRUN_TASK,
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        **TORCHRUN,
    }
    launch = detect_launch(env)
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == (
        "torchrun",
        5,
        16,
        1,
    )
    assert (launch.master_addr, launch.master_port) == ("gpu017", 29500)


def test_plain_srun_task_launch():
    launch = detect_launch(SRUN_TASK)
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == (
        "slurm",
        6,
        8,
        2,
    )
    assert launch.master_addr == "gpu017" and launch.master_port == slurm_port("123456")
    assert launch.as_env() == {
        "RANK": "6",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "2",
        "MASTER_ADDR": "gpu017",
        "MASTER_PORT": str(slurm_port("123456")),
    }


def test_plain_srun_prefers_the_step_over_the_job_and_explicit_master():
    env = {
        **SRUN_TASK,
        "SLURM_NTASKS": "16",
        "SLURM_JOB_NODELIST": "gpu[001-004]",
    }  # a step on part of the job
    launch = detect_launch(env)
    assert (launch.world_size, launch.master_addr) == (8, "gpu017")
    launch = detect_launch({**SRUN_TASK, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "31000"})
    assert (launch.master_addr, launch.master_port) == ("10.0.0.7", 31000)


def test_single_task_srun_is_one_process():
    env = {
        **SRUN_TASK,
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_STEP_NUM_TASKS": "1",
    }
    assert detect_launch(env).launcher == "single"


def test_batch_script_of_a_multi_task_job_is_one_process_with_a_warning():
    # the sbatch script itself carries SLURM_PROCID=0 and SLURM_NTASKS=8 but is no srun step
    env = {k: v for k, v in SRUN_TASK.items() if not k.startswith("SLURM_STEP")}
    env.update(SLURM_PROCID="0", SLURM_LOCALID="0")
    for step in ({}, {"SLURM_STEP_ID": "batch"}, {"SLURM_STEP_ID": "4294967294"}):
        launch = detect_launch({**env, **step})
        assert launch.launcher == "single" and launch.world_size == 1
        assert "not in an srun step" in launch.note and "srun" in launch.note


def test_no_launcher_is_one_process():
    launch = detect_launch({"MASTER_ADDR": "somewhere", "HOME": "/root"})
    assert (launch.launcher, launch.world_size, launch.note) == ("single", 1, "")


@pytest.mark.parametrize("drop", ["WORLD_SIZE", "MASTER_PORT"])
def test_partial_torchrun_environment_names_what_is_missing(drop):
    env = {k: v for k, v in TORCHRUN.items() if k != drop}
    with pytest.raises(LaunchError, match=drop):
        detect_launch(env)


def test_bad_values_are_named():
    with pytest.raises(LaunchError, match="RANK=16 is outside"):
        detect_launch({**TORCHRUN, "RANK": "16"})
    with pytest.raises(LaunchError, match="SLURM_PROCID='x'"):
        detect_launch({**SRUN_TASK, "SLURM_PROCID": "x"})
    with pytest.raises(LaunchError, match="MASTER_ADDR"):
        detect_launch({k: v for k, v in SRUN_TASK.items() if "NODELIST" not in k})


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("gpu017", "gpu017"),
        ("gpu[017-018]", "gpu017"),
        ("gpu[007,009-012],cpu1", "gpu007"),
        ("node-a,node-b", "node-a"),
        ("rack[1-2]-n[03-04]", "rack1-n03"),
        (" dgx[0001-0004] ", "dgx0001"),
    ],
)
def test_first_host_of_slurm_node_lists(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("bad", ["", "gpu[01-02", "[]"])
def test_unparsable_node_lists_are_named(bad):
    with pytest.raises(LaunchError):
        first_host(bad)


def test_port_is_a_function_of_the_job_id_inside_the_unprivileged_range():
    assert slurm_port("123456") == slurm_port("123456") != slurm_port("123457")
    assert all(20_000 <= slurm_port(str(j)) < 60_000 for j in (0, 1, 39_999, 40_000, 10**9))
