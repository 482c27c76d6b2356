"""Signals and blocking reads: a FIFO in the data tree can block nothing (never opened), and a
SIGTERM (or Ctrl-C) that arrives while the data is being read stops the loop at the step boundary
after it, as the trainer's handler agrees (`training/step_checks.on_stop_signals`), with the data
workers alive. Every case runs in a subprocess with a timeout, so a regression that blocks fails
instead of hanging CI."""

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hostile_tree_helpers import HANG_S, REPO, base_tree, make_fifo, png_bytes, put, run_isolated
from tiny_run import TINY_MODEL_AND_DATA

SMALL = [
    "crops.global_crops_size=16",
    "crops.local_crops_size=8",
    "student.patch_size=4",
    "crops.local_crops_number=2",
    "train.batch_size_per_gpu=4",
    "train.seed=7",
    "data.dataset=imagenet_folder",
]


def loop_script(
    root, workers: int, steps: int, extra=(), slow_s: float = 0.0, fifo_after_listing: int = -1
) -> str:
    """A training-like loop over the SSL loader: SIGTERM (through the trainer's own handler) stops
    it at the end of the step in progress; prints each step and the step it stopped after.
    `fifo_after_listing`: the index of an image replaced by a writer-less FIFO once the tree is
    listed."""
    overrides = SMALL + [f"data.root={root}", f"train.num_workers={workers}", *extra]
    return f"""
        import os, time
        from configs import load_config
        from data import build_ssl_loader
        from data.datasets import ImageFolderDataset
        from training.step_checks import on_stop_signals

        class SlowReads(ImageFolderDataset):  # a file system that blocks each read for a while
            def __getitem__(self, index):
                time.sleep({slow_s})
                return super().__getitem__(index)

        cfg = load_config(overrides={overrides!r})
        dataset = SlowReads(cfg.data.root, "train")
        if {fifo_after_listing} >= 0:
            os.remove(dataset.path({fifo_after_listing})); os.mkfifo(dataset.path({fifo_after_listing}))
        loader = build_ssl_loader(cfg, rank=0, world_size=1, dataset=dataset)
        stop, skipped = [], 0
        with on_stop_signals(lambda signum: stop.append(signum)):
            for step, batch in enumerate(loader):
                skipped += int(batch.corrupt_skipped)
                print("step", step, flush=True)
                if stop:
                    print("stopped after step", step, flush=True)
                    break
                if step + 1 == {steps}:
                    break
        loader.close()
        print("done, corrupt_skipped", skipped, flush=True)
    """


def tree_with_fifos(tmp_path):
    root = base_tree(tmp_path, per_class=4)
    make_fifo(root / "train" / "a" / "pipe.png")
    make_fifo(root / "train" / "b" / "pipe.JPEG")
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fifo_in_the_tree_blocks_no_epoch(tmp_path, workers):
    out = run_isolated(
        loop_script(tree_with_fifos(tmp_path), workers, steps=6)
    )  # 3 passes over 8 images
    assert "step 5" in out.stdout and "done, corrupt_skipped 0" in out.stdout


@pytest.mark.parametrize("on_corrupt", ["skip", "raise"])
def test_a_file_turned_fifo_mid_run_is_refused_at_once(tmp_path, on_corrupt):
    root = base_tree(tmp_path, per_class=4)
    script = loop_script(
        root, 2, steps=4, extra=[f"data.on_corrupt={on_corrupt}"], fifo_after_listing=3
    )
    if on_corrupt == "skip":
        out = run_isolated(script)
        assert "done, corrupt_skipped 2" in out.stdout  # 16 draws over 2 passes: the FIFO met twice
        return
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "CorruptImageError: cannot read image" in last, result.stderr[
        -2000:
    ]
    assert "img_3.png': not a regular file (FIFO)" in last


def start_in_own_group(script: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def read_lines(proc: subprocess.Popen) -> queue.Queue:
    """`proc`'s stdout lines, read by a thread (so that waiting for one can time out), then None at
    its end."""
    lines = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def rest(lines: queue.Queue, timeout: float = HANG_S) -> str:
    out = []
    while (line := lines.get(timeout=timeout)) is not None:
        out.append(line)
    return "".join(out)


def wait_for_line(
    proc: subprocess.Popen, lines: queue.Queue, needle: str, timeout: float = HANG_S
) -> list:
    """Lines up to the one holding `needle`; fails after `timeout` s even if `proc` prints nothing
    (a blocked read)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line.strip())
        if needle in line:
            return seen
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"no {needle!r} within {timeout} s in {seen}")


@pytest.mark.parametrize(
    "workers, sig", [(0, signal.SIGTERM), (2, signal.SIGTERM), (2, signal.SIGINT)]
)
def test_a_stop_signal_to_the_group_during_a_blocking_read_stops_at_the_next_step_boundary(
    tmp_path, workers, sig
):
    """What Slurm does (SIGTERM to every process of the job), and Ctrl-C in a terminal (SIGINT to
    its foreground group), while the main process, or a data worker, is inside a read that blocks
    for a while: the loop ends after the step in progress; no worker dies, nothing hangs."""
    proc = start_in_own_group(
        loop_script(tree_with_fifos(tmp_path), workers, steps=1000, slow_s=0.25)
    )
    try:
        lines = read_lines(proc)
        before = wait_for_line(proc, lines, "step 1")
        os.killpg(proc.pid, sig)  # lands inside a read (each takes 0.25 s of a 1 s step)
        proc.wait(timeout=HANG_S)
        out, err = "\n".join(before) + "\n" + rest(lines), proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-2000:]
    stopped = int(out.split("stopped after step")[1].split()[0])
    assert stopped <= 3, (
        out
    )  # the step in flight when the signal came (the workers' prefetch runs ahead), not later
    assert "DataLoader worker" not in err and "done" in out


@pytest.mark.slow
def test_sigterm_to_a_training_run_with_fifos_in_its_tree_checkpoints_and_exits(tmp_path):
    root = tree_with_fifos(tmp_path / "d")
    for c in "ab":  # crops of 16 px
        for i in range(4):
            put(root / "train" / c / f"img_{i}.png", data=png_bytes(i, 24))
    run = tmp_path / "run"
    command = [
        sys.executable,
        str(REPO / "train.py"),
        "--output-dir",
        str(run),
        *TINY_MODEL_AND_DATA,
        "data.dataset=imagenet_folder",
        f"data.root={root}",
        "train.num_workers=2",
        "train.log_period=1",
        "train.batch_size_per_gpu=4",
    ]
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while '"step": 2,' not in (
            (run / "metrics.jsonl").read_text() if (run / "metrics.jsonl").exists() else ""
        ):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        err = proc.communicate(timeout=HANG_S)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    assert "SIGTERM: checkpoint saved at step" in err and "DataLoader worker" not in err
    log = (run / "log.txt").read_text()
    assert "2 entries under" in log and "a/pipe.png (FIFO)" in log and "b/pipe.JPEG (FIFO)" in log
