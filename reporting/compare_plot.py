"""The figure of `scripts/compare_losses.py`: every loss term of the candidate, the baseline and the
baseline's other seeds, smoothed as they are compared, and under each term the difference of each
run to the baseline, so the candidate's distance can be read against the seeds' own."""

from collections.abc import Sequence
from pathlib import Path

from .compare import TOTAL, loss_curves, smoothed

TERM_TITLES = {
    TOTAL: "total loss",
    "dino_local_crops_loss": "DINO, local crops",
    "dino_global_crops_loss": "DINO, global crops",
    "ibot_loss": "iBOT masked patches",
    "koleo_loss": "KoLeo",
}


def plot_comparison(
    candidate: Path, baseline: Path, other_seeds: Sequence[Path], window: int, png: Path
) -> list[str]:
    """Write `png`: one column per loss term all runs log (the total first), curves above,
    differences below. Returns the terms drawn."""
    from .figures import (
        plt,
        save_png,
    )  # matplotlib, on the Agg backend: only where a figure is drawn

    runs = [(Path(candidate), "candidate", "C3", "-"), (Path(baseline), "baseline", "black", "-")]
    runs += [(Path(r), "another seed of the baseline", "0.55", "--") for r in other_seeds]
    curves = [loss_curves(path) for path, *_ in runs]
    terms = sorted(set.intersection(*(set(c) for c in curves)), key=lambda t: (t != TOTAL, t))
    fig, axes = plt.subplots(
        2, len(terms), figsize=(3.6 * len(terms), 6.4), squeeze=False, sharex=True
    )
    for col, term in enumerate(terms):
        steps = sorted(set.intersection(*(set(c[term]) for c in curves)))
        values = [smoothed([c[term][s] for s in steps], window) for c in curves]
        top, bottom = axes[0][col], axes[1][col]
        tail = slice(len(steps) // 10, None)  # y range without the first 10% of steps
        for (path, role, color, style), v in zip(runs, values):
            top.plot(steps, v, style, color=color, lw=1.1, label=f"{path.name} ({role})")
            if role != "baseline":
                bottom.plot(
                    steps, [a - b for a, b in zip(v, values[1])], style, color=color, lw=1.0
                )
        low = min(min(v[tail]) for v in values)
        high = max(max(v[tail]) for v in values)
        pad = (
            0.05 * (high - low) or 0.05 * abs(high) or 0.05
        )  # a flat term still gets a visible range
        top.set_ylim(low - pad, high + pad)
        top.set_title(TERM_TITLES.get(term, term), fontsize=10)
        bottom.axhline(0.0, color="black", lw=0.8)
        bottom.set_xlabel("training step")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("loss")
    axes[1][0].set_ylabel("difference to the baseline")
    handles, labels = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(
        unique.values(),
        unique.keys(),
        loc="lower center",
        ncol=len(unique),
        fontsize=9,
        frameon=False,
    )
    fig.suptitle(
        f"Does {Path(candidate).name} train like {Path(baseline).name}? "
        f"Moving average over {window} logged values",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_png(fig, png, dpi=130, tight=False)
    return terms
