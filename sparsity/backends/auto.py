"""The `auto` backend: per GEMM shape, measure the sparse path against the dense masked path once,
keep the faster.

Key: (tokens, in, out, dtype, device) (`GemmKey`). The first time a key is seen (outside CUDA-graph
capture and torch.compile tracing), both ways of running a linear layer's two weight GEMMs are timed
as a training step runs them, on fresh random inputs of the real shapes:

    sparse = cusparselt.sparsify (fused prune + pack of W and W^T) + forward GEMM + input-gradient GEMM
    dense  = prune (W pruned dense)                                 + forward GEMM + input-gradient GEMM
    both   + the dense weight-gradient GEMM and the bias gradient, so that the step is as long as the real one
             (host overhead hides behind a long step and shows on a short one)

back to back, median of CUDA-event timings after warm-up, two interleaved rounds, in the two modes a
layer runs in:

    eager  each step launched from Python as training runs it (host time included: on a short step the sparse
           path's extra host work shows);
    graph  the same steps with the host kept ahead of the GPU (a sleep kernel holds the GPU while all repetitions
           are queued), i.e. device time only, which is what a replayed CUDA graph costs.

Each mode gets its own choice (`choice` for eager, `choice_graph` used while a CUDA graph is being
captured); the sparse path must be faster by MARGIN (2%) to be chosen. The decision is remembered
for the key; every decision is kept (`describe()`) and logged at INFO. The dense path prunes
tile_greedy with the fused kernel's dense-output mode (`prune_dense`, one read and one write of W)
rather than the generic pruning kernel, so that falling back costs little next to a plain dense
layer; other pruning methods use the `dense` backend. Where cuSPARSELt cannot run (CPU, missing
nvmath, compute capability < 8.0, shapes that are not multiples of 16, fp32) auto is the dense
backend, and the reason is recorded and logged (weights off CUDA: once per device type and dtype, in
`fallbacks`). A key first met inside graph capture or compilation uses dense (no timing is possible
there) without remembering it, so a later eager call can still decide.

Each timed decision also records the GPU memory held outside this process's allocator while it was
timed (`memory_outside_mb`); far above a process's own context (SHARED_DEVICE_MB), another process
shared the GPU, its kernels ran inside the timing, and auto warns: two runs sharing one H200 under MPS
chose differently from each other and from a run alone.

A key first met while torch.compile traces (`choice_for_trace`) is timed at its token count rounded up
to cuSPARSELt's multiple (`timed_tokens`): the compiled layer pads its input in the kernel that writes it
and runs one GEMM, where the eager layer runs the last n % 8 rows as a second, 8-row GEMM. Timing the
eager layer at an unaligned count would charge 2:4 for work the compiled step does not do.
"""

from __future__ import annotations

import logging
import threading

import torch

from sparsity.autograd import SemiSparseWeightFunction

from .base import Backend, BackendUnavailable, GemmKey, SparseWeight
from .cusparselt import CuSparseLtBackend
from .cusparselt.library import padded_token_count
from .dense import DenseBackend, FastDenseBackend, dense_sparsify
from .settings import BackendSettings
from .timing import device_memory_outside_mb, device_only_ms, median_cuda_ms

log = logging.getLogger(__name__)

MARGIN = 1.02  # sparse must be faster than dense by this ratio (dense_ms / sparse_ms) to be chosen
# Memory outside this process's allocator above which another process is taken to share the GPU: a
# process's own CUDA context and libraries hold about a GB (0.85 GB on one H200), two small training
# runs on one H200 saw 14 GB each. The same bound as reporting.speed_columns.SHARED_GPU_MB (which
# drops a shared run's speeds; the torch-free reporting cannot import this one).
SHARED_DEVICE_MB = 4096.0


def _timing_generator(device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(0)


def _timing_weight(
    out_features: int, in_features: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """A random weight of a layer's shape to time a key first met while tracing."""
    return torch.randn(
        out_features, in_features, device=device, dtype=dtype, generator=_timing_generator(device)
    )


class AutoSparseWeight(SparseWeight):
    """Defers the choice to the first product, where the token count (and so the key) is known."""

    def __init__(self, backend: AutoBackend, weight: torch.Tensor, pruning: str):
        self._backend = backend
        self._weight = weight
        self._pruning = pruning
        self.shape = weight.shape
        self._impl: SparseWeight | None = None
        self.choice: str | None = None

    def _resolve(self, tokens: int, has_bias: bool, in_backward: bool = False) -> SparseWeight:
        if self._impl is None:
            self.choice = self._backend.decide(
                self._weight, self._pruning, tokens, has_bias, in_backward
            )
            if self.choice == "dense":
                self._impl = dense_sparsify(self._weight, self._pruning)
            else:
                self._impl = self._backend.backend(self.choice).sparsify(
                    self._weight, self._pruning
                )
            self._weight = None  # the chosen representation is all that is needed from here on
        return self._impl

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._resolve(x.shape[0], bias is not None).matmul(x, bias)

    def matmul_t(self, dy: torch.Tensor) -> torch.Tensor:
        return self._resolve(dy.shape[0], False, in_backward=True).matmul_t(dy)

    def to_dense(self) -> torch.Tensor:
        return self._resolve(0, False).to_dense() if self._impl is None else self._impl.to_dense()

    def mask(self) -> torch.Tensor:
        return self._resolve(0, False).mask() if self._impl is None else self._impl.mask()


class AutoBackend(Backend):
    """Chooses per GEMM shape between its own `CuSparseLtBackend` and `DenseBackend`, both built
    with its settings (a cuSPARSELt choice runs with the same algorithm search and packing as the
    `cusparselt` backend)."""

    name = "auto"

    def __init__(self, settings: BackendSettings | None = None):
        super().__init__(settings)
        self._lock = threading.Lock()
        self.decisions: dict = {}  # GemmKey -> record
        # (device type, dtype) -> reason, for weights that cannot go to cuSPARSELt at all
        self.fallbacks: dict = {}
        self._backends: dict = {}
        self._warned_shared = False

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        return None  # dense always works

    def _not_on_cuda(self, device: torch.device, dtype: torch.dtype) -> None:
        """Weights off CUDA run dense: said once per (device type, dtype), with the reason."""
        key = (device.type, str(dtype).replace("torch.", ""))
        if key not in self.fallbacks:
            with self._lock:
                if key not in self.fallbacks:
                    reason = f"weights on {device.type}: cuSPARSELt runs only on CUDA GPUs"
                    self.fallbacks[key] = reason
                    log.info(
                        "auto backend: %s %s -> dense for every layer (%s)", key[0], key[1], reason
                    )

    def sparsify(self, weight: torch.Tensor, pruning: str) -> SparseWeight:
        if weight.device.type != "cuda":
            self._not_on_cuda(weight.device, weight.dtype)
            return self.backend("dense").sparsify(weight, pruning)
        return AutoSparseWeight(self, weight.detach(), pruning)

    def backend(self, name: str) -> Backend:
        """The backend a choice runs on: "cusparselt" or "dense", built with this backend's
        settings."""
        b = self._backends.get(name)
        if b is None:
            kinds = {"cusparselt": CuSparseLtBackend, "dense": DenseBackend}
            if name not in kinds:
                raise ValueError(f"auto chooses between {', '.join(kinds)}, not {name!r}")
            b = self._backends[name] = kinds[name](self.settings)
        return b

    def mvue_weight_grad(self, dy: torch.Tensor, x: torch.Tensor, seed: int) -> torch.Tensor | None:
        """On cuSPARSELt wherever it runs: the estimate is the same on either GEMM, and the 2:4 one
        measured 1.48-1.52x of the dense one at ViT-L's MLP shapes on one H200
        (`scripts/bench_sparse.py --ops wgrad`)."""
        cslt = self.backend("cusparselt")
        try:
            cslt.check(dy.device, dy.dtype)
        except BackendUnavailable:
            return None
        return cslt.mvue_weight_grad(dy, x, seed)

    # ----------------------------------------------------------------------------------------------
    def decide(
        self,
        weight: torch.Tensor,
        pruning: str,
        tokens: int,
        has_bias: bool,
        in_backward: bool = False,
    ) -> str:
        out_f, in_f = weight.shape
        dev = weight.device
        key = GemmKey(tokens, in_f, out_f, weight.dtype, dev.index if dev.index is not None else 0)
        rec = self.decisions.get(key)
        reason = None if rec is not None else self._sparse_unavailable(weight, tokens)
        if reason is not None:
            return self._record(key, "dense", reason=reason)
        capturing = torch.cuda.is_current_stream_capturing()
        if rec is not None:
            return rec["choice_graph" if capturing else "choice"]
        if capturing or torch.compiler.is_compiling():
            log.info(
                "auto: %s first seen inside graph capture/compilation: dense for now (not "
                "remembered)",
                key,
            )
            return "dense"
        return self._measure_and_record(key, weight, pruning, tokens, has_bias, in_backward)[
            "choice"
        ]

    def choice_for_trace(
        self,
        device: torch.device,
        dtype: torch.dtype,
        out_features: int,
        in_features: int,
        tokens: int,
        pruning: str,
        has_bias: bool,
    ) -> str:
        """The choice for a layer inside a torch.compile trace, called while the graph is traced
        (never inside it): the device-time decision (`choice_graph`; a compiled step keeps the GPU
        busy), timed now on a random weight of the layer's shape if this key is new, at the token
        count the compiled layer's GEMM runs (`padded_token_count`)."""
        if device.type != "cuda":
            self._not_on_cuda(device, dtype)
            return "dense"
        key = GemmKey(
            tokens,
            in_features,
            out_features,
            dtype,
            device.index if device.index is not None else 0,
        )
        rec = self.decisions.get(key)
        if rec is None:
            weight = _timing_weight(out_features, in_features, device, dtype)
            reason = self._sparse_unavailable(weight, tokens)
            if reason is not None:
                self._record(key, "dense", reason=reason)
            else:
                self._measure_and_record(
                    key,
                    weight,
                    pruning,
                    padded_token_count(tokens),  # `sparsity.traced` pads, then one GEMM
                    has_bias,
                    False,
                    mode="compiled",
                )
            rec = self.decisions[key]
        return rec["choice_graph"]

    def _measure_and_record(
        self,
        key: GemmKey,
        weight: torch.Tensor,
        pruning: str,
        tokens: int,
        has_bias: bool,
        in_backward: bool,
        mode: str = "eager",
    ) -> dict:
        with self._lock:
            rec = self.decisions.get(key)
            if rec is not None:
                return rec
            try:
                (t_sparse, t_dense), (g_sparse, g_dense), how = self._measure(
                    weight, pruning, tokens, has_bias, in_backward
                )
            except BackendUnavailable as e:
                self._record(key, "dense", reason=f"cusparselt unavailable: {e}")
                return self.decisions[key]
            choice = "cusparselt" if t_dense / t_sparse > MARGIN else "dense"
            choice_graph = "cusparselt" if g_dense / g_sparse > MARGIN else "dense"
            outside = device_memory_outside_mb(weight.device)
            if outside is not None:
                self._note_shared_device(key, outside)
            self._record(
                key,
                choice,
                choice_graph=choice_graph,
                sparse_ms=round(t_sparse, 4),
                dense_ms=round(t_dense, 4),
                speedup=round(t_dense / t_sparse, 3),
                sparse_gpu_ms=round(g_sparse, 4),
                dense_gpu_ms=round(g_dense, 4),
                speedup_graph=round(g_dense / g_sparse, 3),
                pruning=pruning,
                timed=how,
                timed_tokens=tokens,
                first_met=mode,
                **({} if outside is None else {"memory_outside_mb": round(outside)}),
            )
            return self.decisions[key]

    def _note_shared_device(self, key: GemmKey, outside_mb: float) -> None:
        """Warn, once a run, where a timing ran while another process seemed to hold the GPU: its
        kernels were inside the timing, so this run may choose (and compute with) other kernels than
        the same run alone would."""
        if outside_mb <= SHARED_DEVICE_MB or self._warned_shared:
            return
        self._warned_shared = True
        log.warning(
            "auto backend: timed tokens=%d in=%d out=%d while %.1f GB of GPU %d were held outside this "
            "process's allocator: another process probably shares the GPU, and its kernels ran inside "
            "the timing. The choices may differ from those of the same run alone; where runs share a "
            "GPU, set the backend explicitly (sparsity.backend=cusparselt or dense).",
            key.tokens,
            key.in_features,
            key.out_features,
            outside_mb / 1024,
            key.device_index,
        )

    def _sparse_unavailable(self, weight: torch.Tensor, tokens: int) -> str | None:
        try:
            cs = self.backend("cusparselt")
            cs.check(weight.device, weight.dtype)
            cs.check_shape(*weight.shape)
        except BackendUnavailable as e:
            return str(e)
        if tokens == 0:
            return "no tokens"
        return None

    def _measure(
        self,
        weight: torch.Tensor,
        pruning: str,
        tokens: int,
        has_bias: bool,
        in_backward: bool = False,
    ):
        out_f, in_f = weight.shape
        dev, dtype = weight.device, weight.dtype
        gen = _timing_generator(
            dev
        )  # not the global RNG: timing must not shift a run's random streams
        x = torch.randn(tokens, in_f, device=dev, dtype=dtype, generator=gen)
        dy = torch.randn(tokens, out_f, device=dev, dtype=dtype, generator=gen)
        bias = torch.randn(out_f, device=dev, dtype=dtype, generator=gen) if has_bias else None
        w = weight.detach()
        cs = self.backend("cusparselt")
        # warm the sparse path once (builds plans and chooses their algorithms: not part of a step's
        # cost)
        sw = cs.sparsify(w, pruning)
        sw.matmul(x, bias)
        sw.matmul_t(dy)

        def rest():  # the parts of a layer's step that are the same for both paths
            dy.t() @ x
            if bias is not None:
                dy.sum(0)

        def sparse_step():
            s = cs.sparsify(w, pruning)
            s.matmul(x, bias)
            s.matmul_t(dy)
            rest()

        def dense_step():
            s = dense_sparsify(w, pruning)
            s.matmul(x, bias)
            s.matmul_t(dy)
            rest()

        how = "layer steps (sparsify + GEMMs)"
        if not in_backward:
            # Preferred: the real autograd function, forward + backward, eagerly -- so that host
            # overhead counts as it does in training (on a slow host a short sparse step is
            # host-bound; on CPU-side profiles the sparse layer costs a few hundred microseconds
            # more host time than a dense one).
            try:
                real = self._autograd_steps(w, pruning, x, dy, bias)
            except Exception as e:  # noqa: BLE001 -- e.g. the autograd function's signature changed
                log.info(
                    "auto: timing through the autograd function failed (%r); timing layer steps", e
                )
                real = None
            if real is not None:
                sparse_step, dense_step = real
                how = "autograd fwd+bwd (eager)"

        # interleave two rounds to spread clock/thermal drift over both
        ts, td, gs, gd = [], [], [], []
        with torch.enable_grad():
            for _ in range(2):
                ts.append(median_cuda_ms(sparse_step))
                td.append(median_cuda_ms(dense_step))
                gs.append(device_only_ms(sparse_step))
                gd.append(device_only_ms(dense_step))
        return (min(ts), min(td)), (min(gs), min(gd)), how

    def _autograd_steps(self, w, pruning, x, dy, bias):
        cs, fd = self.backend("cusparselt"), FastDenseBackend(self.settings)
        xg = x.detach().requires_grad_()
        wg = w.detach().requires_grad_()
        bg = None if bias is None else bias.detach().requires_grad_()

        def make(backend):
            def step():
                xg.grad = wg.grad = None
                if bg is not None:
                    bg.grad = None
                y = SemiSparseWeightFunction.apply(
                    xg, wg, bg, backend, pruning, False, None, w.dtype
                )
                y.backward(dy)

            return step

        steps = make(cs), make(fd)
        with torch.enable_grad():
            for st in (
                steps
            ):  # one untimed call each (plans, kernels), and a check that the call works at all
                st()
        return steps

    def _record(self, key: GemmKey, choice: str, **info) -> str:
        rec = {"choice": choice, "choice_graph": info.pop("choice_graph", choice), **info}
        self.decisions[key] = rec
        dtype = str(key.dtype).replace("torch.", "")
        shape = (key.tokens, key.in_features, key.out_features)
        log.info("auto backend: tokens=%d in=%d out=%d %s -> %s %s", *shape, dtype, choice, info)
        return choice

    def describe(self) -> dict:
        """The settings, the devices that run dense for every layer, and the choice per GEMM
        shape."""
        return {
            "backend": self.name,
            "settings": self.settings_dict(),
            "fallbacks": [
                {"device": d, "dtype": t, "choice": "dense", "reason": r}
                for (d, t), r in self.fallbacks.items()
            ],
            "decisions": [
                {
                    "tokens": k.tokens,
                    "in_features": k.in_features,
                    "out_features": k.out_features,
                    "dtype": str(k.dtype).replace("torch.", ""),
                    "device": k.device_index,
                    **v,
                }
                for k, v in self.decisions.items()
            ],
        }
