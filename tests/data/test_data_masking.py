"""iBOT masks and the collate: stratified ratios, block bounds, weights, shapes and crop order."""

import numpy as np
import pytest
import torch

from data import (
    MaskingGenerator,
    SSLBatch,
    SSLCollate,
    SSLSample,
    collate_ssl_samples,
    mask_targets,
)


class SpyGenerator:
    """Masks exactly the first `t` patches and records each requested `t`."""

    def __init__(self, side):
        self.num_patches = side * side
        self.side = side
        self.requested = []

    def __call__(self, t, rng=None):
        self.requested.append(t)
        m = np.zeros(self.num_patches, dtype=bool)
        m[:t] = True
        return m.reshape(self.side, self.side)


def _samples(batch, n_local=2, g=8, loc=4):
    """Crops filled with 100 * sample + 10 * crop (+ 5 for locals), so their order can be read
    back."""
    return [
        SSLSample(
            global_crops=[torch.full((3, g, g), 100.0 * s + 10 * c) for c in range(2)],
            local_crops=[torch.full((3, loc, loc), 100.0 * s + 10 * c + 5) for c in range(n_local)],
            label=s,
            position=1000 + s,
            corrupt_skipped=s % 2,
        )
        for s in range(batch)
    ]


def test_mask_targets_hand_checked():
    # B = 4 global crops, p = 0.5 -> 2 masked images; probs = linspace(0.1, 0.5, 3) = [0.1, 0.3,
    # 0.5]
    n = 100
    for seed in range(50):
        targets, upper = mask_targets(4, n, (0.1, 0.5), 0.5, np.random.default_rng(seed))
        assert len(targets) == 4 and targets[2:] == [0, 0]
        assert 10 <= targets[0] < 30 and 30 <= targets[1] < 50
        assert upper == 30 + 50


def test_collate_requests_stratified_counts_then_shuffles():
    spy = SpyGenerator(side=10)
    batch = collate_ssl_samples(
        _samples(2), spy, (0.1, 0.5), 0.5, np.random.default_rng(3), local_crops_size=4
    )
    t = spy.requested
    assert len(t) == 4 and 10 <= t[0] < 30 and 30 <= t[1] < 50 and t[2:] == [0, 0]
    assert sorted(batch.masks.sum(1).tolist()) == sorted(t)
    assert batch.upperbound == 80
    # shuffled: over many draws the masked images land in every row
    rows = set()
    for seed in range(40):
        b = collate_ssl_samples(
            _samples(2), SpyGenerator(10), (0.1, 0.5), 0.5, np.random.default_rng(seed), 4
        )
        rows |= set(b.masks.any(1).nonzero().flatten().tolist())
    assert rows == {0, 1, 2, 3}


def test_masking_generator_bounds_and_blocks():
    gen = MaskingGenerator(input_size=(14, 14), max_num_patches=0.5 * 196)
    rng = np.random.default_rng(0)
    assert not gen(0).any()  # no rng needed for an empty mask
    for target in (4, 19, 40, 58, 97, 98):
        for _ in range(20):
            m = gen(target, rng)
            assert m.shape == (14, 14) and m.dtype == bool
            assert 0 < m.sum() <= target
    for _ in range(200):  # one block: within the per-block budget, and narrower than the grid
        m = np.zeros((14, 14), dtype=bool)
        delta = gen._mask(m, 98, rng)
        rows, cols = m.any(1).sum(), m.any(0).sum()
        assert 0 < delta == m.sum() <= 98 and rows < 14 and cols < 14 and rows * cols == delta
    counts = [gen(60, rng).sum() for _ in range(100)]
    assert np.mean(counts) > 0.9 * 60  # blocks keep being added until (almost) the target is met
    with pytest.raises(ValueError, match="explicit numpy Generator"):
        gen(10)


def test_masking_generator_is_a_function_of_its_rng():
    gen = MaskingGenerator(input_size=(8, 8), max_num_patches=32)
    a = [gen(20, np.random.default_rng(5)) for _ in range(3)]
    assert all((x == a[0]).all() for x in a)
    assert any((gen(20, np.random.default_rng(s)) != a[0]).any() for s in range(6, 10))


def test_collate_shapes_order_and_weights():
    collate = SSLCollate(
        patches_per_side=4,
        local_crops_size=4,
        mask_ratio_min_max=(0.1, 0.5),
        mask_sample_probability=0.5,
        seed=0,
        rank=0,
    )
    B = 3
    batch = collate(_samples(B))
    assert isinstance(batch, SSLBatch)
    assert {k for k, v in batch.fields().items() if v is not None} == {
        "global_crops",
        "local_crops",
        "masks",
        "mask_indices",
        "masks_weight",
        "n_masked_patches",
        "upperbound",
        "labels",
        "corrupt_skipped",
    }
    g, loc = batch.global_crops, batch.local_crops
    assert g.shape == (2 * B, 3, 8, 8) and g.dtype == torch.float32
    assert loc.shape == (2 * B, 3, 4, 4) and loc.dtype == torch.float32
    # [crop0 of every sample..., crop1 of every sample...]
    assert g[:, 0, 0, 0].tolist() == [0, 100, 200, 10, 110, 210]
    assert loc[:, 0, 0, 0].tolist() == [5, 105, 205, 15, 115, 215]
    masks = batch.masks
    assert masks.shape == (2 * B, 16) and masks.dtype == torch.bool
    assert int(masks.any(1).sum()) == int(2 * B * 0.5)  # 3 of the 6 global crops are masked
    assert batch.mask_indices.dtype == torch.long
    assert torch.equal(batch.mask_indices, masks.flatten().nonzero().flatten())
    assert batch.n_masked_patches.shape == () and batch.n_masked_patches.dtype == torch.long
    assert int(batch.n_masked_patches) == int(masks.sum()) == batch.mask_indices.numel()
    w = batch.masks_weight
    assert w.shape == batch.mask_indices.shape and w.dtype == torch.float32
    # every masked patch weighs 1 / (#masked of its image): weights sum to the number of masked
    # images
    rows = batch.mask_indices // 16
    for r in rows.unique():
        assert torch.allclose(w[rows == r], torch.full_like(w[rows == r], 1.0 / masks[r].sum()))
    assert float(w.sum()) == pytest.approx(int(masks.any(1).sum()))
    assert isinstance(batch.upperbound, int) and int(masks.sum()) <= batch.upperbound
    assert batch.labels.tolist() == [0, 1, 2] and batch.labels.dtype == torch.long
    assert batch.corrupt_skipped.shape == () and int(batch.corrupt_skipped) == 1


def test_collate_without_local_crops_and_seeded_by_first_position():
    collate = SSLCollate(
        patches_per_side=4,
        local_crops_size=4,
        mask_ratio_min_max=(0.1, 0.5),
        mask_sample_probability=0.5,
        seed=0,
        rank=0,
    )
    batch = collate(_samples(2, n_local=0))
    assert batch.local_crops.shape == (0, 3, 4, 4)
    again = collate(_samples(2, n_local=0))
    assert torch.equal(batch.masks, again.masks)  # same first position -> same masks
    others = [
        SSLCollate(
            patches_per_side=4,
            local_crops_size=4,
            mask_ratio_min_max=(0.1, 0.5),
            mask_sample_probability=0.5,
            seed=s,
            rank=r,
        )(_samples(2, n_local=0)).masks
        for s, r in ((1, 0), (0, 1), (2, 0), (0, 2))
    ]
    assert any(not torch.equal(batch.masks, m) for m in others)


def test_reference_collate_numbers_for_vitl16():
    """ViT-L/16 at 224: 196 patches, at most 98 per block; batch 64 -> 64 of 128 global crops
    masked."""
    collate = SSLCollate(
        patches_per_side=14,
        local_crops_size=4,
        mask_ratio_min_max=(0.1, 0.5),
        mask_sample_probability=0.5,
        seed=0,
        rank=0,
    )
    assert (
        collate.mask_generator.num_patches == 196 and collate.mask_generator.max_num_patches == 98
    )
    targets, upper = mask_targets(128, 196, (0.1, 0.5), 0.5, np.random.default_rng(0))
    probs = np.linspace(0.1, 0.5, 65)
    assert upper == sum(int(196 * p) for p in probs[1:])
    assert all(
        int(196 * probs[i]) <= t <= int(196 * probs[i + 1]) for i, t in enumerate(targets[:64])
    )
