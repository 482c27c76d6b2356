"""iBOT loss on masked patch tokens (the reference's
`dinov2/loss/ibot_patch_loss.py::iBOTPatchLoss`).

Same centering options as DINOLoss (center shape (1, 1, K), synchronous EMA). The center update
averages the per-rank mean of the masked teacher tokens over ranks, as the reference; a rank with no
masked token contributes nothing (the reference would produce NaN there).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._dist import all_reduce_sum_
from .dino_clstoken_loss import sinkhorn_knopp


def _cross_entropy(t: Tensor, s: Tensor, temp: float) -> Tensor:
    """sum(t * log_softmax(s / temp)) over the last dim, fp32 (the reference's non-xFormers
    `lossfunc`)."""
    return torch.sum(t.float() * F.log_softmax(s.float() / temp, dim=-1), dim=-1)


class iBOTPatchLoss(nn.Module):
    def __init__(self, patch_out_dim: int, student_temp: float = 0.1, center_momentum: float = 0.9):
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer(
            "center", torch.zeros(1, 1, patch_out_dim)
        )  # persistent: saved in checkpoints

    @torch.no_grad()
    def softmax_center_teacher(self, teacher_patch_tokens: Tensor, teacher_temp: float) -> Tensor:
        """softmax((t - center) / temp) in fp32; `t` is (n, K) or (1, n, K)."""
        center = self.center if teacher_patch_tokens.dim() == 3 else self.center[0]
        return F.softmax((teacher_patch_tokens.float() - center) / teacher_temp, dim=-1)

    @torch.no_grad()
    def sinkhorn_knopp_teacher(
        self,
        teacher_output: Tensor,
        teacher_temp,
        n_masked_patches_tensor,
        n_iterations: int = 3,
        valid: Tensor | None = None,
    ) -> Tensor:
        """SK over the masked tokens (n, K); B = number of masked patches summed over ranks; rows
        where `valid` (n,) is False are padding: left out of every sum, returned as zeros."""
        if isinstance(n_masked_patches_tensor, Tensor):
            B = all_reduce_sum_(
                n_masked_patches_tensor.detach().to(teacher_output.device, torch.float32).clone()
            )
        else:
            B = all_reduce_sum_(
                torch.tensor(float(n_masked_patches_tensor), device=teacher_output.device)
            )
        return sinkhorn_knopp(teacher_output, teacher_temp, B, n_iterations, valid=valid)

    @torch.no_grad()
    def local_center_stats(
        self, teacher_patch_tokens: Tensor, valid: Tensor | None = None
    ) -> Tensor:
        """This rank's part of the center update: (K + 1,) fp32, the mean masked token and whether
        there was one. A method of its own, without the all-reduce, so that training can compile
        it: eagerly the cast, the masking and the sum are three passes over the (n, K) tokens."""
        t = teacher_patch_tokens.float().reshape(-1, teacher_patch_tokens.shape[-1])
        n = t.shape[0]
        if valid is not None:
            count = valid.sum().float()
            local = torch.where(valid[:, None], t, 0.0).sum(dim=0) / count.clamp(min=1.0)
            present = (count > 0).float().reshape(1)
        else:
            local = t.mean(dim=0) if n > 0 else t.new_zeros(t.shape[-1])
            # new_full, not new_tensor: a tensor built from a Python list is copied from host
            # memory, which waits for the GPU to drain (a host sync in the middle of every step)
            present = local.new_full((1,), 1.0 if n > 0 else 0.0)
        return torch.cat([local, present])

    @torch.no_grad()
    def update_center(self, teacher_patch_tokens: Tensor, valid: Tensor | None = None) -> None:
        """center <- m * center + (1 - m) * (mean over ranks of each rank's mean masked token); t is
        (n, K). Rows where `valid` (n,) is False are padding and left out (their count is on the
        device: no host sync)."""
        stats = self.local_center_stats(teacher_patch_tokens, valid)
        all_reduce_sum_(stats)
        count = stats[-1]
        batch_center = (stats[:-1] / count.clamp(min=1.0)).view(1, 1, -1)
        updated = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)
        self.center.copy_(torch.where(count > 0, updated, self.center))

    def forward(
        self, student_patch_tokens: Tensor, teacher_patch_tokens: Tensor, student_masks_flat: Tensor
    ) -> Tensor:
        """Dense form: (B, N, K) tokens, (B, N) masks; per-image mean over masked patches, then mean
        over images."""
        loss = _cross_entropy(teacher_patch_tokens, student_patch_tokens, self.student_temp)
        loss = torch.sum(loss * student_masks_flat.float(), dim=-1) / student_masks_flat.sum(
            dim=-1
        ).clamp(min=1.0)
        return -loss.mean()

    def forward_masked(
        self,
        student_patch_tokens_masked: Tensor,
        teacher_patch_tokens_masked: Tensor,
        student_masks_flat: Tensor,
        n_masked_patches=None,
        masks_weight=None,
    ) -> Tensor:
        """Masked tokens only: -sum_i w_i * CE_i / n_images, w_i = 1 / (#masked patches in patch i's
        image).

        `student_masks_flat` is (n_images, N) bool; only its row count is used when `masks_weight`
        is given.
        """
        loss = _cross_entropy(
            teacher_patch_tokens_masked, student_patch_tokens_masked, self.student_temp
        )
        if masks_weight is None:
            masks_weight = (
                (1 / student_masks_flat.sum(-1).clamp(min=1.0))
                .unsqueeze(-1)
                .expand_as(student_masks_flat)[student_masks_flat]
            )
        if n_masked_patches is not None:
            loss = loss[:n_masked_patches]
        loss = loss * masks_weight
        return -loss.sum() / student_masks_flat.shape[0]
