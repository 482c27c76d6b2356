"""What the benchmarks (`scripts/bench_*.py`, run from the repository root as `python -m scripts.bench_<name>`) share.

    timing          CUDA-event medians (the library's `sparsity.backends.timing`, plus rotation over input sets and
                    CUDA-graph replay), and the training-step timer
    batch           `synthetic_batch`: one multi-crop batch of the loader's shapes (real collate, random pixels)
    profiling       kernel time by category and GPU idle time from a torch.profiler run
    gpu_state       clocks, temperature and throttle reasons a row ended in
    sparse_results  `bench_sparse.py`'s Markdown table, and several of its runs merged into one result
    bad_algs        cuSPARSELt algorithm ids that crash a library version, handed to the sweep (`--bad-algs`)

The one-off GPU probes that found the facts the library relies on are in `scripts/experiments/probes/`.
"""
