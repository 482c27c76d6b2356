"""InfiniteShardedSampler: deterministic, resumable from any position, disjoint shards covering each
pass."""

import itertools

import pytest

from data import InfiniteShardedSampler


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


@pytest.mark.parametrize("size, world", [(10, 1), (10, 3), (7, 4), (3, 5)])
def test_shards_partition_every_pass(size, world):
    per_rank = [
        take(InfiniteShardedSampler(size, r, world, seed=1), 4 * size) for r in range(world)
    ]
    stream = {}
    for items in per_rank:
        for index, g in items:
            assert g not in stream  # global positions are unique across ranks
            stream[g] = index
    # the union over ranks covers global positions 0 .. 4 * size * world - 1; every pass is a
    # permutation
    assert sorted(stream) == list(range(4 * size * world))
    for e in range(4 * world):
        assert sorted(stream[g] for g in range(e * size, (e + 1) * size)) == list(range(size))
    # ranks move through passes in lockstep: sample p of rank r is global position p * world + r
    for r, items in enumerate(per_rank):
        assert [g for _, g in items] == [p * world + r for p in range(4 * size)]


def test_passes_differ_and_seed_matters():
    s = InfiniteShardedSampler(50, 0, 1, seed=0)
    assert list(s.permutation(0)) != list(s.permutation(1))
    assert list(s.permutation(0)) != list(InfiniteShardedSampler(50, 0, 1, seed=1).permutation(0))
    assert take(InfiniteShardedSampler(50, 0, 1, seed=3), 120) == take(
        InfiniteShardedSampler(50, 0, 1, seed=3), 120
    )


@pytest.mark.parametrize("world, rank", [(1, 0), (3, 2)])
def test_resume_from_any_position(world, rank):
    reference = take(InfiniteShardedSampler(11, rank, world, seed=5), 60)
    for start in (0, 1, 3, 10, 11, 12, 37):
        assert (
            take(InfiniteShardedSampler(11, rank, world, seed=5, start=start), 60 - start)
            == reference[start:]
        )
        assert InfiniteShardedSampler(11, rank, world, seed=5)[start] == reference[start]


def test_state_dict_round_trip():
    a = InfiniteShardedSampler(9, 1, 2, seed=4)
    it = iter(a)
    first = [next(it) for _ in range(13)]
    assert a.position == 13  # counts items taken
    state = a.state_dict()
    assert state == {
        "position": 13,
        "dataset_size": 9,
        "rank": 1,
        "world_size": 2,
        "seed": 4,
        "samples_consumed": 26,
    }
    b = InfiniteShardedSampler(9, 1, 2, seed=4)
    b.load_state_dict(state)
    assert take(b, 20) == [next(it) for _ in range(20)]
    assert first == take(InfiniteShardedSampler(9, 1, 2, seed=4), 13)
    with pytest.raises(ValueError, match="26 samples consumed cannot be continued by 4 ranks"):
        InfiniteShardedSampler(9, 0, 4, seed=4).load_state_dict(
            state
        )  # translating world sizes: test_distributed_*
    with pytest.raises(ValueError, match="seed"):
        InfiniteShardedSampler(9, 1, 2, seed=5).load_state_dict(state)


def test_argument_checks():
    with pytest.raises(ValueError):
        InfiniteShardedSampler(0, 0, 1)
    with pytest.raises(ValueError):
        InfiniteShardedSampler(5, 2, 2)
    with pytest.raises(ValueError):
        InfiniteShardedSampler(5, 0, 1, start=-1)
