"""The sample stream continues exactly across a change of world size: positions counted globally."""

import itertools

import pytest

from data.samplers import InfiniteShardedSampler, local_start


def _global_stream(world: int, per_rank: int, start: int = 0, size: int = 7) -> list:
    """What `world` ranks consume in lockstep from local position `start`, as (global position,
    index), sorted."""
    items = []
    for rank in range(world):
        sampler = InfiniteShardedSampler(size, rank, world, seed=3, start=start)
        items += [(g, idx) for idx, g in itertools.islice(iter(sampler), per_rank)]
    return sorted(items)


def test_two_ranks_then_one_then_four_walk_the_one_rank_stream():
    reference = _global_stream(1, 40)
    first = _global_stream(2, 6)  # global positions 0..11
    second = _global_stream(1, 8, start=local_start(12, 1))  # 12..19
    third = _global_stream(4, 5, start=local_start(20, 4))  # 20..39
    assert first + second + third == reference


def test_load_state_dict_translates_the_position_to_another_world_size():
    saved = InfiniteShardedSampler(7, 1, 2, seed=3)
    list(itertools.islice(iter(saved), 6))
    state = saved.state_dict()
    assert state["samples_consumed"] == 12
    for world in (1, 3, 4, 6):
        resumed = [InfiniteShardedSampler(7, r, world, seed=3) for r in range(world)]
        for s in resumed:
            s.load_state_dict(state)
        assert {s.position for s in resumed} == {12 // world}
        got = sorted(g for s in resumed for _, g in itertools.islice(iter(s), 2))
        assert got == list(range(12, 12 + 2 * world))  # nothing repeated, nothing skipped


def test_a_world_size_that_does_not_divide_the_consumed_samples_is_refused():
    with pytest.raises(ValueError, match="12 samples consumed cannot be continued by 5 ranks"):
        local_start(12, 5)
    state = InfiniteShardedSampler(7, 0, 2, seed=3, start=6).state_dict()
    with pytest.raises(ValueError, match="by 5 ranks"):
        InfiniteShardedSampler(7, 0, 5, seed=3).load_state_dict(state)
