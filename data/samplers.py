"""An infinite, sharded, resumable sample stream."""

from collections.abc import Iterator

import numpy as np

from .seeding import TAG_PERMUTATION, numpy_rng


def local_start(samples_consumed: int, world_size: int) -> int:
    """Where each of `world_size` ranks starts so that the run continues at global stream position
    `samples_consumed` (positions [0, samples_consumed) already used, whatever world size used
    them).

    Rank r then yields global positions samples_consumed + r, + r + world_size, ...: nothing
    repeated or skipped. Exact only if `world_size` divides `samples_consumed`; otherwise the ranks
    would have to start at different local positions and no longer advance in lockstep, so this
    refuses instead."""
    if samples_consumed < 0:
        raise ValueError(f"samples_consumed must be >= 0, got {samples_consumed}")
    if samples_consumed % world_size:
        raise ValueError(
            f"{samples_consumed} samples consumed cannot be continued by {world_size} ranks in "
            f"lockstep ({samples_consumed} % {world_size} != 0): samples would be repeated or "
            f"skipped"
        )
    return samples_consumed // world_size


class InfiniteShardedSampler:
    """Infinite stream of `(dataset index, stream position)` pairs for one rank.

    The global stream is the concatenation of one permutation of `range(dataset_size)` per pass `e`,
    each drawn from a generator seeded by (seed, e). Rank r takes global positions r, r +
    world_size, r + 2 * world_size, ..., so within a pass every index goes to exactly one rank, and
    all ranks walk through the passes in lockstep (sample p of every rank lies in pass (p *
    world_size + r) // dataset_size).

    `start` (and `position`) count the samples this rank has already consumed: a sampler built with
    start=s yields exactly what one built with start=0 yields after its first s items. The yielded
    position is the *global* stream position p * world_size + r: unique across ranks, it seeds that
    sample's augmentation.

    Since rank r's local position p is global position p * world_size + r, after every rank consumed
    p samples the global positions [0, p * world_size) are used: `state_dict` records that count
    (`samples_consumed`) and `load_state_dict` continues it on any world size that divides it
    (`local_start`).

    Note: a DataLoader iterates its sampler ahead of the batches it has delivered (prefetch), so
    `position` runs ahead of training; checkpoint the state at the delivered position instead, as
    `SSLLoader.state_dict` does.
    """

    def __init__(
        self, dataset_size: int, rank: int = 0, world_size: int = 1, seed: int = 0, start: int = 0
    ):
        if dataset_size <= 0:
            raise ValueError(f"dataset_size must be > 0, got {dataset_size}")
        if not 0 <= rank < world_size:
            raise ValueError(
                f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}"
            )
        if start < 0 or seed < 0:
            raise ValueError(f"start and seed must be >= 0, got start={start}, seed={seed}")
        self.dataset_size, self.rank = int(dataset_size), int(rank)
        self.world_size, self.seed = int(world_size), int(seed)
        self.position = int(start)
        self._perm_cache: tuple[int | None, np.ndarray | None] = (None, None)

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of pass `epoch` over the dataset (cached for the current pass)."""
        cached_epoch, perm = self._perm_cache
        if cached_epoch != epoch:
            perm = numpy_rng(TAG_PERMUTATION, self.seed, epoch).permutation(self.dataset_size)
            self._perm_cache = (epoch, perm)
        return perm

    def global_position(self, position: int) -> int:
        return position * self.world_size + self.rank

    def __getitem__(self, position: int) -> tuple[int, int]:
        """The item this rank gets at its `position` (random access; does not move the sampler)."""
        g = self.global_position(position)
        epoch, k = divmod(g, self.dataset_size)
        return int(self.permutation(epoch)[k]), g

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """Yields from the current `position` on, advancing it as items are taken."""
        while True:
            g = self.global_position(self.position)
            epoch, k = divmod(g, self.dataset_size)
            perm = self.permutation(epoch)
            # every position of this rank inside pass `epoch`, from k on
            for idx in perm[k :: self.world_size].tolist():
                self.position += 1
                yield idx, g
                g += self.world_size

    def state_dict(self, position: int | None = None) -> dict[str, int]:
        """The state at `position` (default: the current one; `SSLLoader` passes the position of the
        batches it has delivered, behind the DataLoader's prefetch)."""
        position = self.position if position is None else int(position)
        return {
            "position": position,
            "dataset_size": self.dataset_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "seed": self.seed,
            "samples_consumed": position * self.world_size,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the global stream of `state`, possibly saved with another world size (all ranks
        in lockstep)."""
        for key in ("dataset_size", "seed"):
            if key in state and int(state[key]) != getattr(self, key):
                raise ValueError(
                    f"sampler state was saved with {key}={state[key]}, this run has "
                    f"{key}={getattr(self, key)}: the sample stream would not continue"
                )
        consumed = int(state["position"]) * int(state.get("world_size", self.world_size))
        self.position = local_start(consumed, self.world_size)
