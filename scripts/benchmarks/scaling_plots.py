"""Figures and the phase comparison of `scripts/bench_scaling.py`'s JSON results.

One result is one command: one phase (dense unless `sparsity.sparse_fraction` was overridden; each
timing row records the phase it ran in), 1-2-4 GPUs, loss curves (which enter the phase of each
step, as training does). `compare_phases` puts several results of the same GPU, model and batch side
by side (the dense and the sparse phase, or one phase under two settings), with each one's step time
against the first result's at every GPU count.
"""

from __future__ import annotations

from pathlib import Path

SERIES_NAMES = {"small": "ViT-Ti/8 (embedded default)", "vitl16": "ViT-L/16 (ImageNet recipe)"}


def series_name(model: str) -> str:
    """Legend name of a benchmarked model: its architecture and patch, not the benchmark's short
    key."""
    return SERIES_NAMES.get(model, model)


def configured_phase(overrides: list[str]) -> str:
    """The phase a command's overrides ask for (the last `sparsity.sparse_fraction=` wins, as in the
    config loader): 'dense phase', '2:4-sparse phase', or the fraction of a schedule that
    switches."""
    values = [o.split("=", 1)[1] for o in overrides if o.startswith("sparsity.sparse_fraction=")]
    fraction = float(values[-1]) if values else 0.0
    if fraction == 0:
        return "dense phase"
    if fraction == 1:
        return "2:4-sparse phase"
    return f"sparse_fraction={fraction:g}"


def timed_phase(result: dict) -> str:
    """The phase the timing rows ran in, as they recorded it. Rows without a record come from before
    the timed trainer entered its configured phase: they all ran dense, whatever the overrides
    said."""
    recorded = {row.get("phase", "dense") for row in result["rows"]}
    if len(recorded) > 1:
        return "mixed phases"
    return {"dense": "dense phase", "sparse": "2:4-sparse phase"}.get(
        recorded.pop(), "unknown phase"
    )


def result_labels(results: list[dict]) -> list[str]:
    """Each result's phase as its rows recorded it, followed by the overrides of its command that
    differ between the results (a phase compared with itself under another setting:
    `train.ddp_split_compiled_graphs=false`)."""
    settings = []
    for result in results:
        pairs = (o.split("=", 1) for o in result.get("overrides", []) if "=" in o)
        settings.append(
            {k: v for k, v in pairs if k != "sparsity.sparse_fraction"}
        )  # the last value wins
    varying = sorted(k for k in set().union(*settings) if len({s.get(k) for s in settings}) > 1)
    return [
        ", ".join([timed_phase(r)] + [f"{k}={s[k]}" for k in varying if k in s])
        for r, s in zip(results, settings)
    ]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(result: dict, png: Path) -> None:
    """Weak-scaling efficiency per model and batch, and the loss curves beside it, of one
    command."""
    plt = _pyplot()
    if plt is None:
        print(f"matplotlib missing: no plot (redraw with --plot-only {png.with_suffix('.json')})")
        return
    rows, curves = result["rows"], result["loss_curves"]["runs"]
    rows_phase, curves_phase = timed_phase(result), configured_phase(result.get("overrides", []))
    fig, axes = plt.subplots(
        1, 2 if curves else 1, figsize=(12 if curves else 6.4, 4.5), squeeze=False
    )
    ax = axes[0][0]
    device = "GPU" if result["gpu"] != "cpu" else "CPU rank"
    for model, b in sorted({(r["model"], r["per_gpu_batch"]) for r in rows}):
        pts = sorted(
            (r["gpus"], r["efficiency"])
            for r in rows
            if (r["model"], r["per_gpu_batch"]) == (model, b)
        )
        ax.plot(
            [p[0] for p in pts],
            [100 * p[1] for p in pts],
            "o-",
            label=f"{series_name(model)}, {b} images/{device}",
        )
    ax.axhline(90, color="gray", ls=":", lw=1, label="90% (target)")
    where = "CPU, gloo" if result["gpu"] == "cpu" else result["gpu"]
    ax.set(
        xlabel=f"{device}s (data parallel)",
        ylabel="weak-scaling efficiency (%)",
        title=f"Weak scaling of the training step, {rows_phase} ({where})\n"
        f"images/s with N {device}s / (N x images/s with one)",
        xticks=sorted({r["gpus"] for r in rows}),
        ylim=(0, max(110, 5 + max(100 * r["efficiency"] for r in rows))),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    if curves:
        ax = axes[0][1]
        for c in curves:
            style = "--" if c["gpus"] == 1 and c["seed"] else "-"
            ax.plot(
                c["loss"],
                style,
                lw=1,
                label=f"{c['gpus']} x {c['per_gpu_batch']} images (seed {c['seed']})",
            )
        ax.set(
            xlabel="step",
            ylabel="training loss (global batch)",
            title=f"Same global batch split over N ranks, {curves_phase}:\nN x b images vs 1 x N*b "
            f"images",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    print(f"wrote {png}")


def _row_key(row: dict) -> tuple:
    return row["model"], row["per_gpu_batch"], row["gpus"]


def compare_phases(results: list[dict]) -> dict:
    """Rows of several commands on the same GPU, side by side per (model, per-GPU batch, GPU count);
    each row's `speedup_vs_first` is the first command's step time over its own at the same GPU
    count. Each result is labelled by its phase and the settings that differ between the commands
    (`result_labels`). Raises ValueError when the results were not measured on the same GPU, share
    no row, or two of them timed the same phase with the same settings."""
    if len(results) < 2:
        raise ValueError("compare needs at least two results (e.g. the dense and the sparse phase)")
    gpus = {r["gpu"] for r in results}
    if len(gpus) > 1:
        raise ValueError(f"results measured on different GPUs: {sorted(gpus)}")
    common = set.intersection(*({_row_key(row) for row in r["rows"]} for r in results))
    if not common:
        raise ValueError("the results share no (model, per-GPU batch, GPU count) row")
    phases = result_labels(results)
    if len(set(phases)) < len(phases):
        raise ValueError(f"two results timed the same phase with the same settings: {phases}")
    first = {_row_key(row): row for row in results[0]["rows"]}
    out = []
    for phase, result in zip(phases, results):
        for row in sorted(result["rows"], key=_row_key):
            key = _row_key(row)
            if key not in common:
                continue
            out.append(
                {
                    "phase": phase,
                    "model": row["model"],
                    "per_gpu_batch": row["per_gpu_batch"],
                    "gpus": row["gpus"],
                    "step_ms": row["step_ms"],
                    "images_per_s": row["images_per_s"],
                    "efficiency": row["efficiency"],
                    "speedup_vs_first": first[key]["step_ms"] / row["step_ms"],
                }
            )
    return {
        "gpu": results[0]["gpu"],
        "phases": phases,
        "baseline": phases[0],
        "rows": out,
        "methods": sorted({r.get("method", "") for r in results}),
    }


def plot_phases(summary: dict, png: Path) -> None:
    """images/s and weak-scaling efficiency against GPU count, one series per phase (and
    model/batch)."""
    plt = _pyplot()
    if plt is None:
        print("matplotlib missing: no plot")
        return
    series = sorted(
        {(r["phase"], r["model"], r["per_gpu_batch"]) for r in summary["rows"]},
        key=lambda s: (summary["phases"].index(s[0]), s[1], s[2]),
    )
    # one legend under both panels: series names run long (a phase plus the settings that differ)
    fig, (ax_rate, ax_eff) = plt.subplots(1, 2, figsize=(12, 4.2 + 0.25 * len(series)))
    for i, (phase, model, b) in enumerate(series):
        pts = sorted(
            (r["gpus"], r["images_per_s"], r["efficiency"])
            for r in summary["rows"]
            if (r["phase"], r["model"], r["per_gpu_batch"]) == (phase, model, b)
        )
        n = [p[0] for p in pts]
        label = f"{phase}, {series_name(model)}, {b}/GPU"
        (line,) = ax_rate.plot(n, [p[1] for p in pts], "os"[i % 2] + "-", label=label)
        ax_rate.plot(n, [pts[0][1] * k for k in n], ":", color=line.get_color(), lw=1)
        ax_eff.plot(n, [100 * p[2] for p in pts], "os"[i % 2] + "-", color=line.get_color())
    counts = sorted({r["gpus"] for r in summary["rows"]})
    lowest = min(100 * r["efficiency"] for r in summary["rows"])
    ax_rate.set(
        xlabel="GPUs (data parallel)",
        ylabel="images/s",
        xticks=counts,
        title=f"Training throughput ({summary['gpu']})\ndotted: N x the series' one-GPU rate",
    )
    ax_eff.axhline(90, color="gray", ls=":", lw=1, label="90% efficiency")
    # zoomed to the measured range: the series differ by a few points, invisible on a 0-100 axis
    ax_eff.set(
        xlabel="GPUs (data parallel)",
        ylabel="weak-scaling efficiency (%)",
        xticks=counts,
        ylim=(min(85.0, lowest - 3), 102),
        title="Weak-scaling efficiency\nimages/s(N) / (N x images/s(1))",
    )
    for ax in (ax_rate, ax_eff):
        ax.grid(alpha=0.3)
    handles = ax_rate.get_legend_handles_labels()[0] + ax_eff.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08 + 0.04 * len(series) / 2, 1, 1))
    fig.savefig(png, dpi=120)
    plt.close(fig)
    print(f"wrote {png}")
