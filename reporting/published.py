"""The published 2:4 sparse-then-dense table that this project reproduces (data only; table.py and
plots.py read it).

torchao's sparse-training README: DINOv2 ViT-L/16 pre-trained on ImageNet-1k for 125k steps (4x
A100), ImageNet-1k top-1 of the linear probe per schedule. Its "40%" row ran 40k of the 125k steps
2:4-sparse (32%); the others ran their labelled share. A copy of the numbers:
../shared/reference/torchao_dinov2_vitl_accuracy.csv.
"""

from dataclasses import dataclass

SOURCE = "DINOv2 ViT-L/16 on ImageNet-1k, 125k steps (torchao sparse-training README)"
SHORT_SOURCE = "ViT-L/16, ImageNet-1k, 125k steps"
TOTAL_STEPS = 125_000


@dataclass(frozen=True)
class PublishedRow:
    label: str
    fraction: float  # as the row is labelled
    sparse_steps: int
    top1: float

    @property
    def step_fraction(self) -> float:
        return self.sparse_steps / TOTAL_STEPS

    @property
    def delta_top1(self) -> float:
        """pp against the published dense run."""
        return self.top1 - DENSE_TOP1


ROWS = (
    PublishedRow("0% sparse (dense baseline)", 0.0, 0, 82.8),
    PublishedRow("40% sparse", 0.4, 40_000, 82.9),
    PublishedRow("60% sparse", 0.6, 75_000, 82.8),
    PublishedRow("70% sparse", 0.7, 87_500, 82.7),
    PublishedRow("80% sparse", 0.8, 100_000, 82.7),
    PublishedRow("90% sparse", 0.9, 112_500, 82.0),
    PublishedRow("100% sparse (2:4-sparse model)", 1.0, 125_000, 82.3),
)
DENSE_TOP1 = ROWS[0].top1
FRACTIONS = tuple(row.fraction for row in ROWS)  # the schedules a reproduction trains
