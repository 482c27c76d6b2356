"""What the study's figures share (plots.py, loss_plots.py): matplotlib on the Agg backend (no
display needed), the style, the palette and how a figure is saved with its caption."""

import io
import math

import matplotlib
from PIL import Image

from rundir.atomic import write_atomically

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 150
MAX_PIXELS = (
    2.0e6  # about 1,700 x 1,200: a figure of many panels is drawn at a lower dpi than DPI to fit
)
STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
LEGEND_WIDTH = 80  # characters of a legend entry before it wraps


def palette_png(fig, dpi: float = DPI, tight: bool = True) -> bytes:
    """The figure as a PNG of at most 256 colours: line plots use a few dozen plus their
    anti-aliasing, and the palette makes the file about a third of the full-colour one, with no
    visible change (no dithering). A figure larger than `MAX_PIXELS` at `dpi` is drawn at the
    resolution that fits it (its text stays the same size relative to it), so that no figure of many
    panels costs the repository more than a few hundred kilobytes."""
    width, height = fig.get_size_inches()
    dpi = min(dpi, math.sqrt(MAX_PIXELS / (width * height)))
    full = io.BytesIO()
    fig.savefig(full, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    # the fast octree palette and zlib's default level: a fifth of a second a figure, where median
    # cut with optimize=True took twice as long for files about a tenth smaller (the tests draw many
    # figures)
    image = (
        Image.open(full)
        .convert("RGB")
        .quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    )
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def save_png(fig, path, dpi: float = DPI, tight: bool = True) -> None:
    """Write the figure as a palette PNG the way every output is written (`rundir.atomic`: a
    temporary file renamed into place, so a link planted at `path` is replaced, not written through,
    and a kill leaves the old figure), then free it."""
    data = palette_png(fig, dpi, tight)
    write_atomically(path, lambda f: f.write(data))
    plt.close(fig)


def save_with_caption(fig, path, caption: str, y: float) -> None:
    """Lay out, put `caption` (if any) in grey under the axes, write the PNG and free the figure."""
    fig.tight_layout()
    if caption:
        fig.text(0.01, y, caption, fontsize=9, ha="left", va="top", color="0.25")
    save_png(fig, path)


def save_with_legend_below(fig, path, handles, ncol: int, caption: str) -> None:
    """Lay out, put the legend under the whole figure and `caption` under the legend, write the PNG,
    free the figure (for long legends, which would squash the axes they belonged to)."""
    fig.tight_layout()
    legend = fig.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, frameon=False
    )
    fig.canvas.draw()
    bottom = legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
    if caption:
        fig.text(0.01, bottom - 0.01, caption, fontsize=9, ha="left", va="top", color="0.25")
    save_png(fig, path)


# Okabe & Ito's colour-blind-safe set, strongest contrast on white first (its yellow last); Paul
# Tol's "muted" set (also colour-blind-safe) where more series are drawn; beyond 10, tab20, where no
# palette stays safe
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
TOL_MUTED = (
    "#332288",
    "#CC6677",
    "#117733",
    "#88CCEE",
    "#882255",
    "#44AA99",
    "#DDCC77",
    "#AA4499",
    "#999933",
    "#888888",
)


def palette(n: int) -> list:
    """n distinct colours: colour-blind-safe up to 10."""
    if n <= len(OKABE_ITO):
        return list(OKABE_ITO[:n])
    if n <= len(TOL_MUTED):
        return list(TOL_MUTED[:n])
    cmap = plt.get_cmap("tab20")
    return [cmap(i % cmap.N) for i in range(n)]
