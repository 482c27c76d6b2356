"""The processes of a local job, read from /proc: a stop ends the ones its killed controller left
behind, and never a process that merely reuses a pid."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm import processes

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads live processes from /proc"
)

TREE = (
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
    "time.sleep(120)']); "
    "time.sleep(120)"
)  # a controller with one task, which outlives it if the controller is killed


def _alive(pid: int) -> bool:
    return processes._stat(pid) is not None


def test_the_orphans_of_a_killed_controller_are_found_and_killed_but_not_a_reused_pid():
    controller = subprocess.Popen([sys.executable, "-c", TREE])
    deadline = time.monotonic() + 30
    while not (members := processes.family(controller.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(members) == 1, members
    (task,) = members
    controller.kill()
    controller.wait()
    assert _alive(task)  # re-parented, still running: what a stop used to leave behind
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert (
            processes.kill_left({bystander.pid: "0"}) == []
        )  # its start time is not "0": another process
        assert processes.kill_left(members) == [task]
        deadline = time.monotonic() + 10
        while _alive(task) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(task)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_process_without_children_has_no_family():
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert processes.family(lone.pid) == {}
    finally:
        lone.kill()
        lone.wait()
