"""DINO loss on CLS tokens (the reference's `dinov2/loss/dino_clstoken_loss.py::DINOLoss`).

Differences from the reference, none of which changes a loss value:
- the center EMA is applied synchronously in `update_center` (the reference queues an async
  all-reduce and applies it at the next `softmax_center_teacher`); the center used at each step is
  the same, and a checkpoint saved after a step now holds that step's update instead of losing the
  pending one;
- the cross-entropy and the teacher probabilities are computed in fp32 whatever the autocast dtype.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._dist import all_reduce_sum_, world_size


def sinkhorn_knopp(
    teacher_output: Tensor,
    teacher_temp,
    n_samples_total,
    n_iterations: int = 3,
    valid: Tensor | None = None,
) -> Tensor:
    """Sinkhorn-Knopp on (B, K) logits in fp32; sums all-reduced over ranks. Returns (B, K) rows
    summing to 1.

    `n_samples_total` is B summed over ranks (int or tensor), the reference's `B`. `valid` (B,) bool
    marks the rows that take part (the others are padding, kept so that shapes stay fixed): they add
    nothing to any sum and come back as zero rows. `teacher_temp` may be a 0-d device tensor
    (written before each replay of a CUDA graph).
    """
    teacher_output = teacher_output.float()
    Q = torch.exp(teacher_output / teacher_temp).t()  # K-by-B, the paper's notation
    if valid is not None:
        Q = torch.where(valid, Q, 0.0)
    K = Q.shape[0]
    sum_Q = all_reduce_sum_(torch.sum(Q))
    Q /= sum_Q
    for _ in range(n_iterations):
        # rows: total weight per prototype must be 1/K
        sum_of_rows = all_reduce_sum_(torch.sum(Q, dim=1, keepdim=True))
        Q /= sum_of_rows
        Q /= K
        # columns: total weight per sample must be 1/B
        col = torch.sum(Q, dim=0, keepdim=True)
        # a padding column sums to 0: kept at 0 instead of 0/0 (a real column's sum is far above
        # `tiny`)
        Q /= col if valid is None else col.clamp(min=torch.finfo(torch.float32).tiny)
        Q /= n_samples_total
    Q *= n_samples_total  # columns sum to 1: an assignment per sample
    return Q.t()


class DINOLoss(nn.Module):
    def __init__(self, out_dim: int, student_temp: float = 0.1, center_momentum: float = 0.9):
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))  # persistent: saved in checkpoints

    @torch.no_grad()
    def softmax_center_teacher(self, teacher_output: Tensor, teacher_temp: float) -> Tensor:
        """softmax((t - center) / temp) in fp32."""
        return F.softmax((teacher_output.float() - self.center) / teacher_temp, dim=-1)

    @torch.no_grad()
    def sinkhorn_knopp_teacher(
        self, teacher_output: Tensor, teacher_temp: float, n_iterations: int = 3
    ) -> Tensor:
        return sinkhorn_knopp(
            teacher_output, teacher_temp, teacher_output.shape[0] * world_size(), n_iterations
        )

    @torch.no_grad()
    def update_center(self, teacher_output: Tensor) -> None:
        """center <- m * center + (1 - m) * mean of `teacher_output` (B, K) over the global
        batch."""
        batch_center = all_reduce_sum_(torch.sum(teacher_output.float(), dim=0, keepdim=True))
        batch_center /= teacher_output.shape[0] * world_size()
        self.center.mul_(self.center_momentum).add_(batch_center, alpha=1 - self.center_momentum)

    def forward(self, student_output_list, teacher_out_softmaxed_centered_list) -> Tensor:
        """Sum over (student, teacher) pairs of the batch-mean cross-entropy -sum(t * log_softmax(s
        / T_s))."""
        total_loss = 0
        for s in student_output_list:
            lsm = F.log_softmax(s.float() / self.student_temp, dim=-1)
            for t in teacher_out_softmaxed_centered_list:
                total_loss = total_loss - torch.sum(t * lsm, dim=-1).mean()
        return total_loss


__all__ = ["DINOLoss", "sinkhorn_knopp"]
