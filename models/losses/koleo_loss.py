"""KoLeo regulariser (the reference's `dinov2/loss/koleo_loss.py::KoLeoLoss`), in fp32 with autocast
off."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class KoLeoLoss(nn.Module):
    """Kozachenko-Leonenko entropy estimator (Sablayrolles et al. 2018): -mean(log(nearest-neighbour
    distance))."""

    def __init__(self):
        super().__init__()
        self.pdist = nn.PairwiseDistance(2, eps=1e-8)

    @staticmethod
    def pairwise_NNs_inner(x: Tensor) -> Tensor:
        """Index of each row's nearest neighbour (max dot product, the row itself excluded) for
        L2-normalised x."""
        dots = torch.mm(x, x.t())
        n = x.shape[0]
        dots.view(-1)[:: (n + 1)].fill_(-1)  # diagonal -> -1
        return torch.max(dots, dim=1).indices

    def forward(self, student_output: Tensor, eps: float = 1e-8) -> Tensor:
        """student_output: (B, D) backbone features, B >= 2."""
        if student_output.dim() != 2 or student_output.shape[0] < 2:
            raise ValueError(
                f"KoLeo needs at least 2 samples per crop batch (got shape "
                f"{tuple(student_output.shape)}): "
                "with 1 sample there is no nearest neighbour and the loss is infinite (dinov2 "
                "issues #307/#314)"
            )
        with torch.autocast(device_type=student_output.device.type, enabled=False):
            x = F.normalize(student_output.float(), eps=eps, p=2, dim=-1)
            with torch.no_grad():  # only the distances carry gradient
                nn_idx = self.pairwise_NNs_inner(x)
            distances = self.pdist(x, x[nn_idx])
            return -torch.log(distances + eps).mean()
