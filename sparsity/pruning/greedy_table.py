"""The 4x4-tile greedy walk on the CPU, driven by a transition table: the same masks as
`reference._greedy_walk`.

The walk's state at any step is the kept count of each of the tile's 4 rows and 4 columns (0, 1 or 2
each), so 3^8 = 6,561 states; for each state and position (0..15) a table says whether the entry is
kept and which state follows. The reference's 16 steps of gather / compare / scatter-add on counts
become 16 table lookups (about 2.5x faster on two CPU cores, where the sparse phase's per-step
pruning of every linear dominated its cost over dense).
"""

from __future__ import annotations

import functools

import torch

from .reference import _abs32, _from_tiles, _to_tiles

METHODS = frozenset({"tile_greedy", "tile_greedy_signed"})

_N_STATES = 3**8  # digits: the 4 row counts (3^0..3^3), then the 4 column counts (3^4..3^7)


@functools.cache
def _tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, next_state * 16), both flat over index state * 16 + position."""
    state = torch.arange(_N_STATES)
    place = 3 ** torch.arange(8)
    counts = (state[:, None] // place) % 3  # (states, 8)
    pos = torch.arange(16)
    row, col = pos // 4, pos % 4
    kept = (counts[:, row] < 2) & (counts[:, 4 + col] < 2)  # (states, 16)
    nxt = state[:, None] + kept * (place[row] + place[4 + col])
    return kept.reshape(-1), (nxt * 16).reshape(-1)


def greedy_walk(v: torch.Tensor) -> torch.Tensor:
    """(T, 16) ordering keys of tiles -> (T, 16) kept: the greedy walk, largest key first, ties to
    the lower index."""
    kept_table, next16_table = _tables()
    order = torch.sort(v, dim=1, descending=True, stable=True).indices
    n = v.shape[0]
    state16 = torch.zeros(n, dtype=torch.int64)
    kept_by_step = torch.empty(n, 16, dtype=torch.bool)
    for step in range(16):
        index = state16 + order[:, step]
        kept_by_step[:, step] = kept_table[index]
        state16 = next16_table[index]
    kept = torch.empty(n, 16, dtype=torch.bool)
    return kept.scatter_(1, order, kept_by_step)


def greedy_mask(w: torch.Tensor, method: str) -> torch.Tensor:
    """`reference.tile_greedy_mask` ("tile_greedy", by |w|) or `tile_greedy_signed_mask` (by w) of a
    CPU tensor."""
    if method not in METHODS:
        raise ValueError(f"the table walk runs {sorted(METHODS)}, not {method!r}")
    # the reference's ordering keys: fp32 |w| for tile_greedy, fp32 w for the signed walk
    keys = _abs32(w) if method == "tile_greedy" else w.detach().to(torch.float32)
    return _from_tiles(greedy_walk(_to_tiles(keys)), w.shape)
