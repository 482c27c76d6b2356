"""The device augmentation compiled by inductor on a CUDA GPU (`data.augment_compile=true`): the
CIFAR config's 512-image batch gives the eager path's crops from the same draws, to float rounding
(fused kernels reorder the arithmetic), and a second batch does not compile again. Run with
`pytest -m gpu`."""

import pytest
import torch
from cifar_config import cifar_augmentation

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]


def test_inductor_crops_equal_the_eager_ones():
    device = torch.device("cuda")
    images = torch.randint(0, 256, (512, 3, 32, 32), dtype=torch.uint8, device=device)
    eager = cifar_augmentation()
    compiled = cifar_augmentation("data.augment_compile=true", "train.compile_backend=inductor")
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for seed in (0, 1):
        a = eager(images, torch.Generator(device=device).manual_seed(seed))
        b = compiled(images, torch.Generator(device=device).manual_seed(seed))
        for name in a:
            # normalised units: 1/255 of a pixel is ~0.017 here; rounding differences are ~1e-5
            torch.testing.assert_close(b[name], a[name], atol=1e-4, rtol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1
