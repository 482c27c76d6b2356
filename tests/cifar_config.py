"""configs/cifar10.yaml as the tests load it (shared by tests/, tests/data and tests/gpu): its data
root need not exist, as nothing here reads the images."""

from pathlib import Path

from configs import load_config

CIFAR_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cifar10.yaml"


def cifar_config(*overrides: str):
    return load_config(CIFAR_CONFIG, ["data.root=cifar10", *overrides])


def cifar_augmentation(*overrides: str):
    """The config's device augmentation with `overrides`, built as training builds it."""
    from data.loader import build_batched_augmentation

    return build_batched_augmentation(cifar_config(*overrides))
