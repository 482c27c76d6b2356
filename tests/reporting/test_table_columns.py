"""The table's columns are defined once: every row, a baseline's included, has one cell per header,
each under its own header, whichever optional columns (published, same teacher, speed) the table
shows."""

import pytest

from reporting.table import BaselineRow, TableRow
from reporting.table_format import markdown

RUN = dict(
    run="r",
    schedule="70% sparse",
    status="complete",
    sparse_fraction=0.7,
    seed=0,
    sparse_steps=70,
    dense_steps=30,
    total_steps=100,
    steps_done=100,
    top1=71.5,
    top5=95.0,
    knn_top1=65.25,
    knn_k=20,
    delta_top1=-0.8,
    delta_knn_top1=-0.5,
    time_s=None,
    sparse_time_s=None,
    dense_time_s=None,
    images_per_s=None,
    sparse_images_per_s=None,
    dense_images_per_s=None,
    speedup=None,
    final_loss=9.5,
    best_C=1.0,
    eval_seconds=None,
    knn={20: 65.25},
)


def table_cells(text: str) -> list[dict[str, str]]:
    """{header: cell} of each body row of the first markdown table in `text`."""
    lines = [line for line in text.split("\n\n")[0].splitlines() if line.startswith("|")]
    header = [h.strip() for h in lines[0].strip("|").split(" | ")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert len(cells) == len(header), line
        rows.append(dict(zip(header, cells)))
    return rows


@pytest.mark.parametrize(
    "optional",
    [
        {},
        {"delta_top1_same_teacher": -1.85},
        {"published_top1": 82.7, "published_delta_top1": -0.1},
        {"delta_top1_same_teacher": -1.85, "published_top1": 82.7, "published_delta_top1": -0.1},
    ],
)
@pytest.mark.parametrize("speeds", [True, False])
def test_a_baselines_cells_sit_under_their_headers(optional, speeds):
    baseline = BaselineRow(
        key="pixels",
        label="raw pixels",
        run="dense_s0",
        top1=41.4,
        top5=None,
        knn_top1=45.4,
        knn_k=20,
        best_C=None,
    )
    run, pixels = table_cells(
        markdown([TableRow(**RUN, **optional)], [], [baseline], [], speeds=speeds)
    )
    assert (
        run["Linear top-1 (%)"] == "71.5"
        and run["k-NN top-1 (%, k=20)"] == "65.2"
        and run["Seed"] == "0"
    )
    assert pixels["Schedule"] == "*raw pixels*" and pixels["Linear top-1 (%)"] == "41.4"
    assert (
        pixels["k-NN top-1 (%, k=20)"] == "45.4"
        and pixels["Status"] == "baseline, evaluated in dense_s0"
    )
    shown = {"Schedule", "Linear top-1 (%)", "k-NN top-1 (%, k=20)", "Status"}
    assert all(cell == "–" for header, cell in pixels.items() if header not in shown), pixels
    if "delta_top1_same_teacher" in optional:
        assert run["Δ top-1 vs dense with the same teacher momentum (pp)"] == "-1.9"
    if "published_top1" in optional:
        assert (run["Published top-1 (%)"], run["Published Δ (pp)"]) == ("82.7", "-0.1")
    assert ("Images/s, sparse phase" in run) == speeds
