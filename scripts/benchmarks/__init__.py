"""What the benchmarks (`scripts/bench_*.py`) share, and the GPU probes that found the facts the library relies on.

Shared:
    timing      CUDA-event medians (the library's `sparsity.backends.timing`, plus rotation over input sets and
                CUDA-graph replay), and the training-step timer
    batch       `synthetic_batch`: one multi-crop batch of the loader's shapes (real collate, random pixels)
    profiling   kernel time by category and GPU idle time from a torch.profiler run

Probes (run from the repository root as `python -m scripts.benchmarks.<name>`, on a GPU):
    probe_layout         dump cuSPARSELt's compressed layout for known inputs (-> sparsity/packing/layout.py)
    probe_gemm           first look at the cached-plan GEMMs: correctness, layouts, padding rules, graph capture
    probe_algs           every cuSPARSELt algorithm id of a GEMM, surviving crashes (-> search.BAD_ALGS)
    probe_cslt_fp32_out  does cuSPARSELt write an fp32 D from bf16 operands (no)
"""
