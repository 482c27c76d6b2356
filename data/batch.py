"""The training batch: what `collate.SSLCollate` builds, the DataLoader pins,
`loader.SSLLoader.to_device` moves to the training device once (and augments there with
`data.augment_on=device`), and `models.SSLMetaArch` consumes."""

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

# the fields the model reads; `to` moves these (and `images`), the host-side bookkeeping stays where
# it is
DEVICE_FIELDS = (
    "global_crops",
    "local_crops",
    "masks",
    "mask_indices",
    "masks_weight",
    "n_masked_patches",
    "images",
)
TENSOR_FIELDS = DEVICE_FIELDS + ("labels", "corrupt_skipped")


@dataclass
class SSLBatch:
    """One batch of the SSL stream (B = batch size, nL = local crops per image, p = patch size,
    Ng = (Hg // p) * (Wg // p) patches of a global crop, M = masked patches of the batch).

    global_crops      float (2B, 3, Hg, Wg)   [crop0 of every sample..., crop1 of every sample...]
    local_crops       float (nL*B, 3, Hl, Wl) [local0 of every sample..., local1 ...]; (0, 3, Hl,
    Wl) if nL = 0 masks             bool  (2B, Ng)   patch tokens (no cls) of each global crop; True
    = masked (student only) mask_indices      long  (M,)       indices into masks.flatten() of the M
    masked patches masks_weight      float (M,)       1 / (#masked patches of the patch's image):
    sums to #masked images n_masked_patches  long  ()         M upperbound        int
    the reference's bound on M (sum over masked images of int(Ng * ratio_max_i)) labels
    long  (B,)       class labels (unused by SSL; stays on the host) corrupt_skipped   long  ()
    unreadable images met (and replaced) while loading this batch (host)

    With `data.augment_on=device` the loader leaves the crops to the training device: the batch then
    holds `images` uint8 (B, 3, H, W) and `first_position` (the stream position of its first sample,
    which seeds the device augmentation) and no crops, until `loader.SSLLoader.to_device` makes
    them.
    """

    masks: Tensor
    mask_indices: Tensor
    masks_weight: Tensor
    n_masked_patches: Tensor
    upperbound: int
    labels: Tensor
    corrupt_skipped: Tensor
    global_crops: Tensor | None = None
    local_crops: Tensor | None = None
    images: Tensor | None = None
    first_position: int | None = None

    @property
    def device(self) -> torch.device:
        return self.masks.device

    @property
    def needs_augmentation(self) -> bool:
        """True while the crops are still to be made on the device (`images` instead of crops)."""
        return self.images is not None

    def _map(self, fn, names) -> "SSLBatch":
        return dataclasses.replace(
            self, **{k: fn(getattr(self, k)) for k in names if getattr(self, k) is not None}
        )

    def to(self, device) -> "SSLBatch":
        """The batch with the tensors the model reads on `device`, copied asynchronously
        (`non_blocking`: from pinned memory the copy overlaps the host; a tensor already there is
        not copied). `labels` and `corrupt_skipped` are read on the host and stay there."""
        return self._map(lambda t: t.to(device, non_blocking=True), DEVICE_FIELDS)

    def pin_memory(self) -> "SSLBatch":
        """Called by the DataLoader's pinning thread (`pin_memory=True`): page-locks every tensor
        (also the host-side ones, which DDP's own input copy would otherwise read from pageable
        memory)."""
        return self._map(lambda t: t.pin_memory(), TENSOR_FIELDS)

    def padded_to_bound(self) -> "SSLBatch":
        """The batch with `mask_indices` and `masks_weight` padded to `upperbound` entries (index 0,
        weight 0): every shape is then fixed by the config, not by how many patches this batch
        masked, so one CUDA graph serves every step; the model gives the same losses for both forms
        (`SSLMetaArch.forward`)."""
        m, bound = self.mask_indices.shape[0], int(self.upperbound)
        if m > bound:
            raise ValueError(f"{m} masked patches exceed the batch's upperbound {bound}")
        pad = bound - m
        return dataclasses.replace(
            self,
            mask_indices=torch.cat([self.mask_indices, self.mask_indices.new_zeros(pad)]),
            masks_weight=torch.cat([self.masks_weight, self.masks_weight.new_zeros(pad)]),
        )

    def fields(self) -> dict:
        """Field name -> value (for comparisons and logging)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
