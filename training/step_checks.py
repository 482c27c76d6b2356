"""The per-step checks of the training loop without a per-step host sync.

Each step the trainer needs to know, agreed over all ranks: is the loss (or a gradient norm)
non-finite, did any rank get SIGTERM, how many corrupt images were skipped. Reading a device value
on the host (`.item()`, `.tolist()`) waits for the GPU to drain, so the host can no longer queue the
next kernels ahead of it. Here the flags of a step are computed on the device, all-reduced (one
small collective per step) and copied into pinned host memory asynchronously; the host reads them
one step later, after it has queued the next step's work, or at once before anything is written
(checkpoint, export, metrics). A diverged step is therefore reported at most one step late, always
before a checkpoint could contain it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .distributed import DistContext


@dataclass
class StepFlags:
    step: int
    nonfinite_loss: bool
    nonfinite_grad_norm: bool
    stop: bool
    corrupt_skipped: int
    terms: dict[str, torch.Tensor]
    norms: dict[str, torch.Tensor]


@dataclass
class _Pending:
    step: int
    host: (
        torch.Tensor
    )  # [nonfinite loss, nonfinite grad norm, stop, corrupt skipped], summed over ranks
    event: torch.cuda.Event | None
    terms: dict[str, torch.Tensor]
    norms: dict[str, torch.Tensor]


class StepChecks:
    def __init__(self, ctx: DistContext):
        self.ctx = ctx
        self.cuda = ctx.device.type == "cuda"
        self._pending: list[_Pending] = []

    def queue(
        self,
        step: int,
        loss: torch.Tensor,
        terms: dict,
        norms: dict,
        stop_requested: bool,
        corrupt_skipped: int,
    ) -> None:
        """Compute this step's flags on the device and start their reduction and copy to the host;
        no wait."""
        host_values = torch.tensor(
            [float(stop_requested), float(corrupt_skipped)], pin_memory=self.cuda
        )
        device_values = host_values.to(loss.device, non_blocking=True)
        finite_norms = [torch.isfinite(n.detach()).all() for n in norms.values()]
        grad_ok = (
            torch.stack(finite_norms).all()
            if finite_norms
            else torch.ones((), dtype=torch.bool, device=loss.device)
        )
        flags = torch.cat(
            [
                torch.stack(
                    [torch.logical_not(torch.isfinite(loss.detach())), torch.logical_not(grad_ok)]
                ).float(),
                device_values,
            ]
        )
        if self.ctx.is_distributed:
            torch.distributed.all_reduce(flags)
        host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=self.cuda)
        host.copy_(flags, non_blocking=True)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        self._pending.append(_Pending(step, host, event, terms, norms))

    def resolve_previous(self) -> list[StepFlags]:
        """After a step is queued: read the earlier steps' flags. On CUDA the newest step stays
        queued (its flags are not on the host yet, and waiting for them would stall the host); on a
        CPU everything is already done."""
        return self.resolve(keep_last=1 if self.cuda else 0)

    def resolve(self, keep_last: int = 0) -> list[StepFlags]:
        """Read every queued step's flags except the newest `keep_last` (waiting for the GPU to
        reach them)."""
        ready, self._pending = (
            self._pending[: len(self._pending) - keep_last],
            self._pending[len(self._pending) - keep_last :],
        )
        out = []
        for p in ready:
            if p.event is not None:
                p.event.synchronize()
            bad_loss, bad_grad, stop, skipped = p.host.tolist()
            out.append(
                StepFlags(
                    p.step, bad_loss > 0, bad_grad > 0, stop > 0, int(skipped), p.terms, p.norms
                )
            )
        return out


STOP_SIGNALS = {
    signal.SIGTERM: 143,
    signal.SIGINT: 130,
}  # the exit code of a run they stop: 128 + the signal


@contextlib.contextmanager
def on_stop_signals(request_stop: Callable[[int], None]):
    """Inside the block SIGTERM (Slurm's preemption, `kill`) and a first SIGINT (Ctrl-C) only call
    `request_stop(signum)` (the trainer's stop flag, agreed on over the ranks in the step's flags):
    the loop stops at a step boundary after a checkpoint. A second SIGINT interrupts at once
    (KeyboardInterrupt): the way out of a step that does not end. Outside the main thread signals
    are left alone (Python delivers them to the main thread)."""

    def handler(signum, frame):
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        request_stop(signum)

    try:
        previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
