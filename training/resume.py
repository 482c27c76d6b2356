"""The rules for continuing a run from a checkpoint, apart from the loop (trainer.py) because they
are a concern of their own: which config changes a resume accepts, the global-batch bookkeeping that
lets a run resume on another number of processes, checkpoints of older versions, and the per-rank
random streams.
"""

import logging
from pathlib import Path

import torch
from omegaconf import OmegaConf

from configs import Config, ConfigError, to_yaml
from configs.load import RESUMABLE_CHANGES, config_difference
from rundir.errors import CommandError
from rundir.run_dir import RunDir
from rundir.status import nothing_left_at, read_status

from .distributed import DistContext

logger = logging.getLogger(__name__)


class ResumeMismatch(CommandError, RuntimeError):
    """The checkpoint cannot be continued with this run's processes, batch size or config."""


def batch_bookkeeping(state: dict) -> tuple[int, int, int]:
    """(world size, per-GPU batch, samples consumed) of a checkpoint (the trainer records its
    sampler state's count); older ones only hold their config (derived from the step, as those
    versions did)."""
    world = state["world_size"]
    if "batch_size_per_gpu" in state:
        return world, state["batch_size_per_gpu"], state["samples_consumed"]
    b = int(OmegaConf.create(state["config"]).train.batch_size_per_gpu)
    return world, b, state["step"] * world * b


def sampler_state(state: dict) -> dict:
    """Where the data stream of checkpoint `state` continues: its loader's sampler state
    (`SSLLoader.state_dict`); for a checkpoint written before that was saved, the same state derived
    from its step (all its ranks had consumed samples_consumed / world_size samples each)."""
    if "sampler" in state:
        return state["sampler"]
    world, _, consumed = batch_bookkeeping(state)
    return {"position": consumed // world, "world_size": world, "samples_consumed": consumed}


def check_resumable(state: dict, cfg: Config, world_size: int) -> None:
    """The sampler restarts at global stream position `samples_consumed` (each rank at
    samples_consumed / W, see `data.samplers.local_start`), which is where the uninterrupted run
    would be iff this run's global batch equals the checkpoint's; the schedules (lr, momentum,
    sparsity switch) are indexed by step and also assume that batch. So the global batch must match;
    the number of processes may change."""
    saved_world, saved_b, consumed = batch_bookkeeping(state)
    saved_global = saved_world * saved_b
    global_batch = cfg.train.batch_size_per_gpu * world_size
    if consumed != state["step"] * saved_global:
        raise ResumeMismatch(
            f"checkpoint at step {state['step']} records {consumed} samples consumed, not "
            f"step x {saved_global}: it is inconsistent"
        )
    if saved_global == global_batch:
        if "sampler" in state and state["sampler"]["samples_consumed"] != consumed:
            raise ResumeMismatch(
                f"checkpoint at step {state['step']} records {consumed} samples consumed, its "
                f"sampler state {state['sampler']['samples_consumed']}: it is inconsistent"
            )
        return
    if saved_global % world_size == 0:
        fix = (
            f"set train.batch_size_per_gpu={saved_global // world_size} to resume on {world_size} "
            f"processes"
        )
    else:
        fix = (
            f"no per-GPU batch gives {saved_global} images on {world_size} processes: resume on a "
            f"number of "
            f"processes that divides {saved_global}"
        )
    raise ResumeMismatch(
        f"checkpoint at step {state['step']} was written with a global batch of {saved_global} "
        f"({saved_world} "
        f"processes x {saved_b} per GPU); this run has {world_size} x "
        f"{cfg.train.batch_size_per_gpu} = "
        f"{global_batch}. The schedules and the sample stream are counted in global batches, so "
        f"the "
        f"global batch must stay the same: {fix}"
    )


def check_same_config(state: dict, cfg: Config, output_dir: Path) -> None:
    """A run continues only under the config it was started with, except for `RESUMABLE_CHANGES`
    (how it is executed and observed): anything else would silently mix two experiments in one run
    directory. Resolved values are compared (an `${oc.env:LR}` whose variable changed is a change),
    against the checkpoint's own config: the state being continued, which config.yaml only
    mirrors."""
    try:
        changed = config_difference(state["config"], to_yaml(cfg), RESUMABLE_CHANGES)
    except ConfigError as e:
        raise ResumeMismatch(
            f"{output_dir}: the checkpoint's config cannot be compared with this one: {e}"
        ) from None
    if changed:
        raise ResumeMismatch(
            f"{output_dir} was trained with another config ({'; '.join(changed)}). Resume it with "
            f"the "
            f"same settings (these may change: {', '.join(RESUMABLE_CHANGES)}), or start a new run "
            f"in another "
            "--output-dir"
        )


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def restore_rng(rng_per_rank: list[dict], ctx: DistContext, seed: int, step: int) -> None:
    if len(rng_per_rank) == ctx.world_size:
        set_rng_state(rng_per_rank[ctx.rank])
        return
    # Another number of processes: the per-rank streams (drop-path draws) cannot be continued; start
    # fresh, distinct ones. The data order does not depend on them.
    torch.manual_seed(seed + 1_000_003 * step + ctx.rank)
    if ctx.is_main:
        logger.warning(
            "checkpoint written by %d processes, resumed on %d: data order preserved, per-rank "
            "drop-path random streams reseeded",
            len(rng_per_rank),
            ctx.world_size,
        )


def nothing_left(cfg: Config, output_dir: Path, step: int, last_step: int, say: bool) -> bool:
    """Whether a run resumed at `step` has nothing left to do: its checkpoint is at the last step
    and, for a full run, the teacher is exported. Then it is said so (`say`: the rank that logs),
    and nothing is rewritten."""
    total = cfg.total_steps
    final = RunDir(output_dir).teacher
    if not nothing_left_at(output_dir, step, last_step, total):
        return False
    if say and last_step >= total:
        logger.info(
            "%s is complete: checkpoint at step %d of %d, teacher exported to %s; nothing to do "
            "(nothing was rewritten; start a new run in another --output-dir)",
            output_dir,
            step,
            total,
            final,
        )
    elif say:
        logger.info(
            "%s has reached train.max_steps=%d (of %d steps): nothing to do; raise "
            "train.max_steps to continue it",
            output_dir,
            last_step,
            total,
        )
    return True


def own_run_id(state: dict, output_dir: Path, path) -> str:
    """The identity of the run a resume continues: the checkpoint's, which must be the one the run
    directory's status.json records. A checkpoint of another run (a `checkpoints` link shared by two
    run directories, or a directory whose status.json was replaced) is a `ResumeMismatch`, never
    continued; checkpoints and status files written before run ids existed are accepted, and so is a
    run id where status.json records none and the checkpoint lies in the run directory's own folder
    (not a link to elsewhere)."""
    theirs = str(state.get("run_id") or "")
    recorded = read_status(output_dir).run_id
    if theirs and not recorded and _own_folder(output_dir, path):
        # a run directory copied or restored without its status.json: its checkpoints are its own
        return theirs
    if theirs and theirs != recorded:
        raise ResumeMismatch(
            f"{path} belongs to run {theirs}, not to {output_dir} (its status.json records "
            f"{'run ' + recorded if recorded else 'no run'}): is its checkpoints folder another "
            f"run's "
            "(a link two run directories share)? Give each run a checkpoints folder of its own, or "
            "start this one afresh with train.resume=false (the checkpoints found are then set "
            "aside)"
        )
    return theirs or recorded


def _own_folder(output_dir: Path, checkpoint) -> bool:
    """Whether `checkpoint` lies in a folder inside `output_dir` itself, no link leading
    elsewhere."""
    folder = Path(checkpoint).parent
    return not folder.is_symlink() and folder.resolve().parent == Path(output_dir).resolve()
