"""An infinite, sharded, resumable sample stream."""

from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from .seeding import TAG_PERMUTATION, numpy_rng


class InfiniteShardedSampler:
    """Infinite stream of `(dataset index, stream position)` pairs for one rank.

    The global stream is the concatenation of one permutation of `range(dataset_size)` per pass `e`, each drawn
    from a generator seeded by (seed, e). Rank r takes global positions r, r + world_size, r + 2 * world_size, ...,
    so within a pass every index goes to exactly one rank, and all ranks walk through the passes in lockstep
    (sample p of every rank lies in pass (p * world_size + r) // dataset_size).

    `start` (and `position`) count the samples this rank has already consumed: a sampler built with start=s
    yields exactly what one built with start=0 yields after its first s items. The yielded position is the
    *global* stream position p * world_size + r: unique across ranks, it seeds that sample's augmentation.

    Note: a DataLoader iterates its sampler ahead of the batches it has delivered (prefetch), so `position`
    runs ahead of training; checkpoint the consumed position (step * batch size) instead, as `SSLLoader` does.
    """

    def __init__(self, dataset_size: int, rank: int = 0, world_size: int = 1, seed: int = 0, start: int = 0):
        if dataset_size <= 0:
            raise ValueError(f"dataset_size must be > 0, got {dataset_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        if start < 0 or seed < 0:
            raise ValueError(f"start and seed must be >= 0, got start={start}, seed={seed}")
        self.dataset_size, self.rank = int(dataset_size), int(rank)
        self.world_size, self.seed = int(world_size), int(seed)
        self.position = int(start)
        self._perm_cache: Tuple[Optional[int], Optional[np.ndarray]] = (None, None)

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of pass `epoch` over the dataset (cached for the current pass)."""
        cached_epoch, perm = self._perm_cache
        if cached_epoch != epoch:
            perm = numpy_rng(TAG_PERMUTATION, self.seed, epoch).permutation(self.dataset_size)
            self._perm_cache = (epoch, perm)
        return perm

    def global_position(self, position: int) -> int:
        return position * self.world_size + self.rank

    def __getitem__(self, position: int) -> Tuple[int, int]:
        """The item this rank gets at its `position` (random access; does not move the sampler)."""
        g = self.global_position(position)
        epoch, k = divmod(g, self.dataset_size)
        return int(self.permutation(epoch)[k]), g

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        """Yields from the current `position` on, advancing it as items are taken."""
        while True:
            g = self.global_position(self.position)
            epoch, k = divmod(g, self.dataset_size)
            perm = self.permutation(epoch)
            # every position of this rank inside pass `epoch`, from k on
            for idx in perm[k::self.world_size].tolist():
                self.position += 1
                yield idx, g
                g += self.world_size

    def state_dict(self) -> Dict[str, int]:
        return {"position": self.position, "dataset_size": self.dataset_size, "rank": self.rank,
                "world_size": self.world_size, "seed": self.seed}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        for key in ("dataset_size", "world_size", "seed"):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(f"sampler state was saved with {key}={state[key]}, this run has "
                                 f"{key}={getattr(self, key)}: the sample stream would not continue")
        self.position = int(state["position"])
