"""Small shared transforms: ImageNet normalisation, DINOv2's GaussianBlur, and the eval transform
for probes."""

from torchvision import transforms

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)

BLUR_KERNEL_SIZE = 9
BLUR_SIGMA = (0.1, 2.0)


def make_normalize_transform() -> transforms.Normalize:
    return transforms.Normalize(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)


def make_to_tensor_normalize() -> transforms.Compose:
    """PIL image -> float tensor in [0, 1] -> ImageNet mean/std normalised."""
    return transforms.Compose([transforms.ToTensor(), make_normalize_transform()])


class GaussianBlur(transforms.RandomApply):
    """Gaussian blur (kernel 9, sigma uniform in [0.1, 2.0]) applied with probability `p`.

    `reference_inversion=True` reproduces the reference DINOv2 code, which passes `1 - p` to
    `RandomApply` (dinov2 PR #411): its blur probabilities are 0.0 / 0.9 / 0.5 where 1.0 / 0.1 / 0.5
    were meant, and the released checkpoints were trained that way. `self.p` is the probability
    actually applied.
    """

    def __init__(
        self,
        *,
        p: float = 0.5,
        reference_inversion: bool = False,
        radius_min: float = BLUR_SIGMA[0],
        radius_max: float = BLUR_SIGMA[1],
    ):
        blur = transforms.GaussianBlur(kernel_size=BLUR_KERNEL_SIZE, sigma=(radius_min, radius_max))
        self.intended_p = p
        super().__init__(transforms=[blur], p=(1.0 - p) if reference_inversion else p)


def make_eval_transform(resize: int = 256, crop: int = 224) -> transforms.Compose:
    """Evaluation transform of the reference's kNN / linear probes: Resize(resize, bicubic) on the
    short side, CenterCrop(crop), ToTensor, ImageNet normalisation. (Its log-regression probe uses
    resize=crop=224.)"""
    return transforms.Compose(
        [
            transforms.Resize(resize, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(crop),
            make_to_tensor_normalize(),
        ]
    )
