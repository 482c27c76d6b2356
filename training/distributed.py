"""Process-group set-up from the launcher's environment, returned as a value (no module-level
globals).

Launchers, in order of precedence (`detect_launch`, a pure function of the environment):
1. torchrun (also `srun torchrun` and submitit's exported variables): RANK, WORLD_SIZE, LOCAL_RANK,
   MASTER_ADDR, MASTER_PORT. They win over SLURM_* variables, which a `srun torchrun` launch also
   carries but which then describe the torchrun agents (one per node), not the training processes.
   The reference checks SLURM first and gets this wrong.
2. a plain SLURM task launch (`srun python train.py`, one task per GPU): SLURM_PROCID,
   SLURM_STEP_NUM_TASKS (or SLURM_NTASKS), SLURM_LOCALID; master = first host of the step's node
   list, port derived from the job id. Only inside an `srun` step (SLURM_STEP_ID set, not the batch
   step): the batch script itself also sees SLURM_PROCID=0 and SLURM_NTASKS=N but is one process,
   which would otherwise wait forever for N - 1 peers.
3. otherwise one process.
NCCL on GPUs, gloo on CPU.
"""

import inspect
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rundir.errors import UsageError

logger = logging.getLogger(__name__)

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# Step ids Slurm gives to steps that are not `srun` task launches (batch script, extern,
# interactive).
_NON_TASK_STEPS = {
    "batch",
    "extern",
    "interactive",
    "4294967294",
    "4294967295",
    "4294967291",
    "4294967290",
}
_PORT_BASE, _PORT_SPAN = 20_000, 40_000


class LaunchError(UsageError, RuntimeError):
    """The environment describes a distributed launch that cannot be used as is (exit status 2)."""


@dataclass(frozen=True)
class LaunchEnv:
    launcher: str  # "torchrun" | "slurm" | "single"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    note: str = ""  # a warning worth logging (e.g. a batch script that looks like several tasks)

    def as_env(self) -> dict[str, str]:
        """The torchrun-style variables of this launch (exported for a SLURM launch so env:// init
        reads them)."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list, e.g. 'gpu[007-009,012],cpu1' -> 'gpu007',
    'r[1-2]-n[03-04]' -> 'r1-n03'.

    Only the first host is needed (it runs task 0 of a block-distributed step), so no full
    expansion."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise LaunchError("empty Slurm node list")
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):  # the first top-level comma ends the first entry
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            end = i
            break
    entry = nodelist[:end]

    def first_of_range(match: re.Match) -> str:
        return match.group(1).split(",")[0].split("-")[0]  # keeps zero padding: '007-009' -> '007'

    host = re.sub(r"\[([^\]]*)\]", first_of_range, entry)
    if "[" in host or "]" in host or not host:
        raise LaunchError(f"cannot parse Slurm node list {nodelist!r}")
    return host


def slurm_port(job_id: str) -> int:
    """A rendezvous port every task of a job derives alike, spread over [20000, 60000) so that jobs
    sharing a node rarely collide (MASTER_PORT, when set, wins)."""
    try:
        return _PORT_BASE + int(job_id) % _PORT_SPAN
    except ValueError:
        raise LaunchError(f"SLURM_JOB_ID={job_id!r} is not a number: set MASTER_PORT") from None


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise LaunchError(f"{key}={env[key]!r} is not an integer") from None


def _torchrun_launch(env: Mapping[str, str]) -> LaunchEnv:
    missing = [v for v in TORCHRUN_VARS if v not in env]
    if missing:
        raise LaunchError(
            f"partial torchrun environment: {', '.join(missing)} unset (launch with torchrun, or "
            f"unset {', '.join(v for v in TORCHRUN_VARS if v in env)})"
        )
    rank, world, local = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
    if not 0 <= rank < world:
        raise LaunchError(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    return LaunchEnv("torchrun", rank, world, local, env["MASTER_ADDR"], _int(env, "MASTER_PORT"))


def _slurm_launch(env: Mapping[str, str]) -> LaunchEnv:
    world = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
    rank = _int(env, "SLURM_PROCID")
    local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
    if not 0 <= rank < world:
        raise LaunchError(f"SLURM_PROCID={rank} is outside [0, {world})")
    if world == 1:
        return LaunchEnv("single")
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
    else:
        nodelist_key = next(
            (
                k
                for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                if k in env
            ),
            None,
        )
        if nodelist_key is None:
            raise LaunchError(
                "SLURM task launch without SLURM_STEP_NODELIST/SLURM_JOB_NODELIST: set MASTER_ADDR"
            )
        addr = first_host(env[nodelist_key])
    if "MASTER_PORT" in env:
        port = _int(env, "MASTER_PORT")
    elif "SLURM_JOB_ID" in env:
        port = slurm_port(env["SLURM_JOB_ID"])
    else:
        raise LaunchError("SLURM task launch without SLURM_JOB_ID: set MASTER_PORT")
    return LaunchEnv("slurm", rank, world, local, addr, port)


def detect_launch(env: Mapping[str, str]) -> LaunchEnv:
    """How this process was launched, from its environment alone (see the module docstring for the
    rules)."""
    if any(v in env for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return _torchrun_launch(env)
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    if "SLURM_PROCID" in env and step is not None and step not in _NON_TASK_STEPS:
        return _slurm_launch(env)
    ntasks = env.get("SLURM_NTASKS", "1")
    if "SLURM_JOB_ID" in env and ntasks.isdigit() and int(ntasks) > 1:
        return LaunchEnv(
            "single",
            note=(
                f"SLURM allocation of {ntasks} tasks but this process is not in an srun step: "
                f"running as ONE process. "
                "Launch one task per GPU with `srun python train.py ...` or `srun torchrun "
                "--nproc_per_node=G ...`"
            ),
        )
    return LaunchEnv("single")


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _cuda_device(local_rank: int) -> torch.device:
    """GPU `local_rank`, or the only visible GPU when the launcher gives each task its own (srun
    --gpus-per-task)."""
    count = torch.cuda.device_count()
    if local_rank < count:
        return torch.device("cuda", local_rank)
    if count == 1:
        return torch.device("cuda", 0)
    raise LaunchError(
        f"local rank {local_rank} but {count} visible GPUs "
        f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): launch at most "
        f"one "
        "process per GPU"
    )


@contextmanager
def bounded_wait(seconds: float, on_timeout: str):
    """The body may block (a rendezvous whose peers never come): after `seconds`, print `on_timeout`
    as one line and end the process with status 1. A watchdog thread, so torch's own timeouts (which
    also bound every later collective) stay as they are; the run directory's lock is a file lock,
    which the exit releases."""
    done = threading.Event()

    def watchdog() -> None:
        if not done.wait(seconds):
            print(on_timeout, file=sys.stderr, flush=True)
            os._exit(1)

    threading.Thread(target=watchdog, name="distributed-start-watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()


def init_distributed(
    env: Mapping[str, str] | None = None, start_timeout_s: float = 600.0
) -> DistContext:
    """Join the process group this process was launched into (see `detect_launch`); one process: no
    group. The wait for all processes to join is said on one line and bounded by `start_timeout_s`
    (train.dist_start_timeout_s)."""
    env = os.environ if env is None else env
    launch = detect_launch(env)
    if launch.note:
        logger.warning(launch.note)
    cuda = torch.cuda.is_available()
    if launch.world_size == 1:
        return DistContext(
            0,
            1,
            0,
            torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"),
        )
    device = _cuda_device(launch.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if launch.launcher == "slurm":
        os.environ.update(launch.as_env())  # env:// reads them; so do libraries and subprocesses
    if not dist.is_initialized():
        where = f"{launch.master_addr}:{launch.master_port}"
        print(
            f"rank {launch.rank}: waiting up to {start_timeout_s:g} s for the {launch.world_size} "
            f"processes of this "
            f"{launch.launcher} launch to join at {where}",
            file=sys.stderr,
            flush=True,
        )
        unset = (
            "RANK, WORLD_SIZE, LOCAL_RANK"
            if launch.launcher == "torchrun"
            else "the SLURM_* variables"
        )
        with bounded_wait(
            start_timeout_s,
            f"rank {launch.rank}: the {launch.world_size} processes did not all join at "
            f"{where} within train.dist_start_timeout_s={start_timeout_s:g} s; if no "
            f"data-parallel launch was meant, unset {unset} and run again",
        ):
            dist.init_process_group(
                backend="nccl" if cuda else "gloo",
                rank=launch.rank,
                world_size=launch.world_size,
                device_id=device if cuda else None,
            )
    logger.info(
        "rank %d/%d (%s launch, local rank %d) on %s, master %s:%d",
        launch.rank,
        launch.world_size,
        launch.launcher,
        launch.local_rank,
        device,
        launch.master_addr,
        launch.master_port,
    )
    return DistContext(launch.rank, launch.world_size, launch.local_rank, device)


def barrier(ctx: DistContext) -> None:
    if ctx.is_distributed:
        dist.barrier()


def all_gather_objects(obj: Any, ctx: DistContext) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (picklable objects, e.g. RNG states)."""
    if not ctx.is_distributed:
        return [obj]
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def mean_over_ranks(loss: torch.Tensor, terms: dict, ctx: DistContext) -> tuple[torch.Tensor, dict]:
    """A loss and its terms averaged over ranks (each a mean over its rank's batch): the global
    batch's values."""
    if not ctx.is_distributed:
        return loss, terms
    values = torch.stack([loss, *terms.values()]).float()
    torch.distributed.all_reduce(values)
    values /= ctx.world_size
    return values[0], dict(zip(terms, values[1:]))


def check_replicas_identical(tensors: list[torch.Tensor], ctx: DistContext, what: str) -> None:
    """Raise if `tensors` differ between ranks (compared through float64 sums, one small
    collective).

    Data parallelism keeps every replica identical only if every rank applies the same update: a
    rank that drifted (non-deterministic update, a missed all-reduce) would otherwise go unnoticed
    until the teacher, exported by rank 0 alone, no longer matches what the other ranks train."""
    if not ctx.is_distributed:
        return
    sums = torch.stack([t.detach().double().sum() for t in tensors])
    reference = sums.clone()
    dist.broadcast(reference, src=0)
    mismatched = (sums != reference).sum()
    dist.all_reduce(mismatched)
    if mismatched.item() > 0:
        raise RuntimeError(
            f"{what} differ between ranks ({int(mismatched.item())} tensor sums, over all ranks, "
            "differ from rank 0's): the replicas are out of sync"
        )


def data_parallel(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """DDP over the whole meta-architecture (`model` itself on one process): only the student has
    trainable parameters, so only its gradients are bucketed and all-reduced, overlapped with the
    backward pass (the teacher runs under no_grad).

    broadcast_buffers=False: the loss centers are all-reduced inside the losses, and swapping
    linears to 2:4 replaces modules (sharing their Parameters, so DDP's hooks survive) but not a
    buffer list DDP would hold. Every student parameter gets a gradient each step unless the DINO
    loss is off (the DINO head then only serves the iBOT loss, or nothing with a separate iBOT
    head)."""
    if not ctx.is_distributed:
        return model
    ddp = torch.nn.parallel.DistributedDataParallel
    # torch >= 2.13 renamed the switch (and deprecated the old name); older releases only know the
    # old one
    no_buffer_sync = (
        "forward_sync_buffers"
        if "forward_sync_buffers" in inspect.signature(ddp).parameters
        else "broadcast_buffers"
    )
    return ddp(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy in or out
        find_unused_parameters=not model.do_dino,
        **{no_buffer_sync: False},
    )


def shutdown(ctx: DistContext) -> None:
    if ctx.is_distributed and dist.is_initialized():
        dist.destroy_process_group()
