"""The device augmentation compiled by inductor on a CUDA GPU (`data.augment_compile=true`): the
CIFAR config's 512-image batch gives the eager path's crops from the same draws, to float rounding
(fused kernels reorder the arithmetic), and a second batch does not compile again. Run with
`pytest -m gpu`."""

import pytest
import torch

from data.batched_augment import BatchedAugmentationDINO

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]


def test_inductor_crops_equal_the_eager_ones():
    device = torch.device("cuda")
    kw = dict(
        global_crops_scale=(0.32, 1.0),
        local_crops_scale=(0.1, 0.32),
        local_crops_number=8,
        global_crops_size=32,
        local_crops_size=16,
        blur_probabilities=(1.0, 0.1, 0.5),
        solarize_probability=0.2,
    )
    images = torch.randint(0, 256, (512, 3, 32, 32), dtype=torch.uint8, device=device)
    eager = BatchedAugmentationDINO(**kw)
    compiled = BatchedAugmentationDINO(**kw, compile=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for seed in (0, 1):
        a = eager(images, torch.Generator(device=device).manual_seed(seed))
        b = compiled(images, torch.Generator(device=device).manual_seed(seed))
        for name in a:
            # normalised units: 1/255 of a pixel is ~0.017 here; rounding differences are ~1e-5
            torch.testing.assert_close(b[name], a[name], atol=1e-4, rtol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1
