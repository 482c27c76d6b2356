"""What the benchmarks (`scripts/bench_*.py`, run from the repository root as `python -m
scripts.bench_<name>`) share.

    timing          CUDA-event medians (the library's `sparsity.backends.timing`, plus rotation over input sets and
                    CUDA-graph replay), and the training-step timer
    batch           `synthetic_batch`: one multi-crop batch of the loader's shapes (real collate, random pixels)
    profiling       kernel time by category and GPU idle time from a torch.profiler run
    ledger          a step's kernels filed by what they compute (student / teacher MLP GEMMs by pass, attention, other
                    linears, heads, norms, optimizer), and the step ratios 2:4 coverage sets would give
    flops           a step's FLOPs (FlopCounterMode), the GPU's measured GEMM rate, nominal and executed MFU
    step_profiles   `bench_train_step.py --profile`: a training step's kernels, GPU stalls and host time
    gpu_state       clocks, temperature and throttle reasons a row ended in
    sparse_results  `bench_sparse.py`'s Markdown table, and several of its runs merged into one result
    linear_layers   the MLP linears `bench_sparse.py` times (dense or 2:4 on a backend) and their fwd + bwd step
    linear_profiles where a linear layer's time goes: kernel categories, host cost per step
    bad_algs        cuSPARSELt algorithm ids that crash a library version, handed to the sweep (`--bad-algs`)

The one-off GPU probes that found the facts the library relies on are in
`scripts/experiments/probes/`.
"""
