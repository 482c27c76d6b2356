"""The README and docs/ say what the repository does: every relative link and anchor resolves, the
"use it in your own model" example runs as written, and the numbers they quote are the committed
results (or, for the ImageNet cost estimates, recomputed here from the committed measurements)."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reporting import published

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
# The committed measurements the ImageNet estimates are computed from (docs/imagenet.md links the
# same files).
BENCH = REPO / "results" / "bench"
STEP_LAUNCHED = BENCH / "rounds_h100" / "train_step_rounds_heated_fp32_h100.json"
SCALING = BENCH / "scaling_dense" / "scaling_h200.json"  # the compiled step, dense phase
# the confirmatory table: the small-model recipe against the tuned dense, seeds 5-7
RECIPE_SUMMARY = REPO / "results" / "cifar10" / "recipe" / "confirm_lr_table" / "summary.json"
DIGITS_TABLE = REPO / "results" / "default" / "table.md"


# -------------------------------------------------------------------------------------------- links
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (word characters, spaces and
    hyphens kept), spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} +(.+?) *$", text, re.MULTILINE)}


def broken_links(path: Path) -> list[str]:
    """Relative links of a markdown file whose file (or heading, for `#anchor`) does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            broken.append(f"{target} (no heading #{anchor})")
    return broken


def test_the_slug_is_githubs():
    assert slug("Result tables: `make_table.py`") == "result-tables-make_tablepy"
    assert slug("The trainer's sparsity options") == "the-trainers-sparsity-options"
    assert (
        slug("The whole ViT-L/16 DINOv2 step on one H100")
        == "the-whole-vit-l16-dinov2-step-on-one-h100"
    )


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-section) [ok](#title) [web](https://example.org/x)\n# Title\n"
        "[gone](missing.md) [no heading](other.md#nowhere)\n```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md (no such file)",
        "other.md#nowhere (no heading #nowhere)",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert not broken_links(page), broken_links(page)


def test_the_readme_links_every_docs_page():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_readme_stays_a_first_screen():
    assert len(README.read_text().splitlines()) <= 200


# -------------------------------------------------------------------------------------- the example
def marked_block(text: str, name: str) -> str:
    match = re.search(
        rf"^<!-- {name}:begin -->\n(.*?)^<!-- {name}:end -->$", text, re.DOTALL | re.MULTILINE
    )
    assert match, f"no <!-- {name}:begin/end --> block"
    return match.group(1)


def test_own_model_snippet_runs_as_written(tmp_path):
    block = marked_block((DOCS / "sparsity.md").read_text(), "own-model-snippet")
    code = re.fullmatch(r"```python\n(.*?)```\n", block, re.DOTALL)
    assert code, "the own-model-snippet block must be a single ```python fence"
    # A fresh interpreter outside the repository, so only the installed package is importable (as
    # for a user), and without the TRITON_INTERPRET this test session sets.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        cwd=tmp_path,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]


# ----------------------------------------------------------------------------------- quoted numbers
def table_rows(text: str) -> dict[str, list[str]]:
    """Markdown table rows of `text` keyed by their first cell."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 2 and not set(cells[0]) <= set("-"):
            rows.setdefault(cells[0], cells)
    return rows


def test_quoted_digits_numbers_are_the_committed_tables_and_say_they_are_one_machines():
    """docs/embedded-default.md quotes the digits results twice (what to expect, and the committed
    table); both must be results/default/table.md, and the first must say that another machine gives
    other numbers inside the interval it quotes (CPU runs are not bit-identical across machines)."""
    text = (DOCS / "embedded-default.md").read_text()
    committed = DIGITS_TABLE.read_text()
    table = table_rows(
        committed[: committed.index("## Runs")]
    )  # the schedules' table, not the per-run one
    page_table = table_rows(text[text.index("The committed `results/default/`") :])
    schedules = [name for name in table if "sparse" in name or name.startswith("*")]
    assert len(schedules) == 9, schedules
    for name in schedules:
        # table.md: schedule, seed, steps, linear, delta, k-NN; the page: schedule, steps, linear,
        # delta, k-NN.
        assert page_table[name][1:5] == [table[name][2], *table[name][3:6]], name

    expect = re.search(
        r"linear-probe top-1 ([\d.]+)% and k-NN \(k=20\)\s+([\d.]+)% for the 70% schedule "
        r"\(([\d.]+)% and ([\d.]+)% dense\), above the untrained network \(([\d.]+)% and ([\d.]+)%",
        text,
    )
    assert expect, "the expected numbers are not where this test looks for them"
    linear70, knn70, linear0, knn0, linear_random, knn_random = expect.groups()
    assert (linear70, knn70) == (table["70% sparse"][3], table["70% sparse"][5])
    assert (linear0, knn0) == (
        table["0% sparse (dense baseline)"][3],
        table["0% sparse (dense baseline)"][5],
    )
    assert (linear_random, knn_random) == (
        table["*random-init network*"][3],
        table["*random-init network*"][5],
    )
    paragraph = text[expect.start() : text.index("\n\n", expect.start())]
    assert "not bit-identical across" in paragraph and "machines" in paragraph
    low, high = map(
        float, re.search(r"\(([\d.]+)-([\d.]+)% around the dense run", paragraph).groups()
    )
    other = re.search(r"e\.g\. ([\d.]+)% / [\d.]+% for the 70% schedule on another", paragraph)
    assert other and low <= float(other.group(1)) <= high, (
        "the other machine's number must lie inside the interval"
    )


README_SCHEDULES = {
    "0% sparse (dense)": "0% sparse (dense baseline)",
    "40%": "40% sparse",
    "60%": "60% sparse",
    "70%": "70% sparse",
    "80%": "80% sparse",
    "90%": "90% sparse",
    "100% (2:4 model)": "100% sparse (2:4-sparse model)",
}


def _fmt(x: float) -> str:
    return f"{x:+.2f}"


def _readme_cell(mean: dict) -> str:
    """A README cell of a schedule mean: "73.57 (-0.21 [-0.89, +0.48])", the dense baseline as its
    mean alone."""
    if mean["sparse_fraction"] == 0.0:
        return f"{mean['top1']:.2f}"
    interval = mean["delta_top1_interval"]
    if interval is None:  # one seed resolves nothing: the cell must say so
        assert mean["n_seeds"] == 1, mean["schedule"]
        return f"{mean['top1']:.2f} ({_fmt(mean['delta_top1'])}, one seed)"
    return f"{mean['top1']:.2f} ({_fmt(mean['delta_top1'])} [{_fmt(interval['low'])}, {_fmt(interval['high'])}])"


def _confirmatory_means() -> dict[float, dict]:
    """The confirmatory table's schedule means by sparse fraction: one configuration each (the
    recipe, or dense), no screening run among them."""
    summary = json.loads(RECIPE_SUMMARY.read_text())
    assert not any(row["screening"] for row in summary["rows"])
    means = {}
    for mean in summary["schedule_means"]:
        assert mean["sparse_fraction"] not in means, mean["schedule"]
        means[mean["sparse_fraction"]] = mean
    return means


def test_readme_table_is_the_published_numbers_and_the_confirmatory_table():
    """The README's table: the published numbers, and every CIFAR-10 cell the committed confirmatory
    table's mean, Δ and 95% interval against its one dense baseline (the tuned dense, three seeds);
    a schedule the table does not hold yet says "runs next"."""
    readme = table_rows(README.read_text())
    means = _confirmatory_means()
    rows = {row.label: row for row in published.ROWS}
    for ours, name in README_SCHEDULES.items():
        imagenet_cell, recipe_cell, seeds_cell = readme[ours][1:4]
        row = rows[name]
        expected = (
            f"{row.top1:.1f}"
            if row.sparse_steps == 0
            else f"{row.top1:.1f} ({row.delta_top1:+.1f})"
        )
        assert imagenet_cell == expected, (ours, imagenet_cell, expected)
        fraction = row.sparse_steps / published.TOTAL_STEPS if name != "40% sparse" else 0.4
        mean = means.get(round(fraction, 2))
        if mean is None:
            assert (recipe_cell, seeds_cell) == ("runs next", ""), (ours, recipe_cell)
        else:
            assert recipe_cell == _readme_cell(mean), (ours, recipe_cell)
            assert seeds_cell == ", ".join(str(seed) for seed in mean["seeds"]), ours
    dense = means[0.0]
    interval = dense["top1_interval"]
    assert dense["n_seeds"] == 3 and (
        f"({dense['top1']:.2f}, 95% interval {interval['low']:.2f}-{interval['high']:.2f})"
        in README.read_text().replace("\n", " ")
    )


def test_the_recipe_page_table_is_the_confirmatory_table():
    """docs/cifar10-recipe.md's confirmatory table: each schedule's seeds, means with their 95%
    intervals and Δs (linear and k-NN) as the committed summary has them."""
    page = table_rows((DOCS / "cifar10-recipe.md").read_text())
    labels = {0.0: "dense", 0.4: "40%", 0.6: "60%", 0.7: "70%", 0.8: "80%", 0.9: "90%"}
    labels[1.0] = "100% (the decay alone)"
    means = _confirmatory_means()

    def ci(interval: dict | None, signed: bool = False) -> str:
        if interval is None:  # one seed: no interval, and the Δ says it has one seed
            return "(one seed)" if signed else ""
        f = _fmt if signed else (lambda x: f"{x:.2f}")
        return f"[{f(interval['low'])}, {f(interval['high'])}]"

    def cell(value: str, interval: str) -> str:
        return f"{value} {interval}".strip()

    for fraction, label in labels.items():
        cells = page[label][1:6]
        mean = means.get(fraction)
        if mean is None:
            assert cells[0] == "runs next", label
            continue
        seeds = ", ".join(str(seed) for seed in mean["seeds"])
        assert mean["top1_interval"] is not None or mean["n_seeds"] == 1, label
        expected = [
            seeds,
            cell(f"{mean['top1']:.2f}", ci(mean["top1_interval"])),
            ""
            if fraction == 0.0
            else cell(_fmt(mean["delta_top1"]), ci(mean["delta_top1_interval"], True)),
            cell(f"{mean['knn_top1']:.2f}", ci(mean["knn_top1_interval"])),
            ""
            if fraction == 0.0
            else cell(_fmt(mean["delta_knn_top1"]), ci(mean["delta_knn_top1_interval"], True)),
        ]
        assert [cell.strip("*") for cell in cells] == expected, label


def test_the_recipe_page_floor_is_the_confirmatory_tables():
    """The one-shot floor the recipe page and the README read the 100% row against: the
    confirmatory table's dense runs pruned once (its summary's `one_shot_floor`), as losses with
    their 95% intervals."""
    [floor] = json.loads(RECIPE_SUMMARY.read_text())["one_shot_floor"]
    page = " ".join((DOCS / "cifar10-recipe.md").read_text().split())

    def loss(delta: float, interval: dict) -> str:
        return f"{-delta:.2f} [{-interval['high']:.2f}, {-interval['low']:.2f}]"

    expected = (
        f"lose {loss(floor['delta_top1'], floor['delta_top1_interval'])} linear and "
        f"{loss(floor['delta_knn_top1'], floor['delta_knn_top1_interval'])} k-NN "
        f"({floor['top1']:.2f} and {floor['knn_top1']:.2f})"
    )
    assert floor["seeds"] == _confirmatory_means()[0.0]["seeds"] and expected in page
    readme = " ".join(README.read_text().split())
    assert f"pruning the finished dense network once ({-floor['delta_top1']:.2f})" in readme


ABLATIONS_SUMMARY = REPO / "results" / "cifar10" / "ablations" / "summary.json"
PUBLISHED_RECIPE_SUMMARY = REPO / "results" / "cifar10" / "published_recipe_table" / "summary.json"
_TI40 = {"student.arch": "vit_tiny", "optim.epochs": 40}
_S40 = {"student.arch": "vit_small", "optim.epochs": 40}
# docs/cifar10.md's rows: (summary, sparse fraction, the configuration's differing keys)
CIFAR10_PAGE_ROWS = {
    "ViT-Ti/4, 40 epochs: dense": (ABLATIONS_SUMMARY, 0.0, _TI40),
    "ViT-Ti/4, 40 epochs: 70% sparse (teacher dense, the default)": (
        ABLATIONS_SUMMARY,
        0.7,
        {**_TI40, "sparsity.teacher": "dense", "sparsity.pruning": "tile_greedy"},
    ),
    "ViT-Ti/4, 40 epochs: 70% sparse, `sparsity.teacher=sparse`": (
        ABLATIONS_SUMMARY,
        0.7,
        {**_TI40, "sparsity.teacher": "sparse"},
    ),
    "ViT-Ti/4, 40 epochs: 70% sparse, `sparsity.pruning=tile_greedy_signed`": (
        ABLATIONS_SUMMARY,
        0.7,
        {**_TI40, "sparsity.pruning": "tile_greedy_signed"},
    ),
    "ViT-S/4, 40 epochs: dense": (ABLATIONS_SUMMARY, 0.0, _S40),
    "ViT-S/4, 40 epochs: 70% sparse": (ABLATIONS_SUMMARY, 0.7, _S40),
    "ViT-S/4, 40 epochs: 100% sparse (MLPs probed 2:4-pruned)": (ABLATIONS_SUMMARY, 1.0, _S40),
    **{
        f"ViT-Ti/4, 80 epochs: {label}": (PUBLISHED_RECIPE_SUMMARY, fraction, {})
        for label, fraction in (
            ("dense (seeds 0-2)", 0.0),
            ("40% sparse", 0.4),
            ("60% sparse", 0.6),
            ("70% sparse", 0.7),
            ("80% sparse", 0.8),
            ("90% sparse", 0.9),
            ("100% sparse (MLPs probed 2:4-pruned)", 1.0),
        )
    },
    **{
        f"ViT-Ti/4, 80 epochs: {percent}% sparse, `sparsity.switch_weights=pruned`": (
            PUBLISHED_RECIPE_SUMMARY,
            percent / 100,
            {"sparsity.switch_weights": "pruned"},
        )
        for percent in (70, 90)
    },
}


def _summary_mean(summary: Path, fraction: float, keys: dict) -> dict:
    """The one schedule mean of `summary` at `fraction` whose differing keys include `keys`
    (switch_weights=dense where `keys` leave it out)."""
    keys = {"sparsity.switch_weights": "dense", **keys}
    found = [
        m
        for m in json.loads(summary.read_text())["schedule_means"]
        if m["sparse_fraction"] == fraction
        and all(m["differing_config"].get(k, v) == v for k, v in keys.items())
    ]
    assert len(found) == 1, (summary, fraction, keys, len(found))
    return found[0]


def cifar10_page_cells(mean: dict) -> list[str]:
    """A docs/cifar10.md row after its label: seeds; linear mean ± half the range [95% interval];
    its Δ [95% interval] (blank for dense); the same for k-NN."""

    def value(name: str) -> str:
        interval = mean[f"{name}_interval"]
        return (
            f"{mean[name]:.2f} ± {mean[f'{name}_spread']:.2f} "
            f"[{interval['low']:.2f}, {interval['high']:.2f}]"
        )

    def delta(name: str) -> str:
        if mean["sparse_fraction"] == 0.0:
            return ""
        interval = mean[f"delta_{name}_interval"]
        return f"{_fmt(mean[f'delta_{name}'])} [{_fmt(interval['low'])}, {_fmt(interval['high'])}]"

    seeds = ", ".join(str(seed) for seed in mean["seeds"])
    return [seeds, value("top1"), delta("top1"), value("knn_top1"), delta("knn_top1")]


def test_the_cifar10_page_tables_are_the_committed_summaries():
    """docs/cifar10.md's three tables (the published recipe at small scale): every row's seeds,
    means with half range and 95% interval, and Δs with theirs, as the committed summaries have
    them; the baselines' row as the 80-epoch table's."""
    page = table_rows((DOCS / "cifar10.md").read_text())
    for label, (summary, fraction, keys) in CIFAR10_PAGE_ROWS.items():
        expected = cifar10_page_cells(_summary_mean(summary, fraction, keys))
        assert page[label][1:6] == expected, label
    baselines = {b["key"]: b for b in json.loads(PUBLISHED_RECIPE_SUMMARY.read_text())["baselines"]}
    untrained, pixels = baselines["random_init"], baselines["pixels"]
    assert page["untrained ViT-Ti/4 / raw pixels"][1:6] == [
        "–",
        f"{untrained['top1']:.2f} / {pixels['top1']:.2f}",
        "",
        f"{untrained['knn_top1']:.2f} / {pixels['knn_top1']:.2f}",
        "",
    ]


DENSE_TUNE_SUMMARY = REPO / "results" / "cifar10" / "recipe" / "dense_tune_table" / "summary.json"
_M992, _M980 = {"teacher.momentum_teacher": 0.992}, {"teacher.momentum_teacher": 0.98}
# the recipe page's tuned-dense search: each row's dense configuration in dense_tune_table
DENSE_TUNE_ROWS = {
    "dinov2's teacher-momentum cosine from 0.992 (the published config)": _M992,
    "the same, momentum restarted at 40% of the steps": {
        **_M992,
        "teacher.momentum_restart_fraction": 0.4,
    },
    "the same, momentum restarted at 70% of the steps": {
        **_M992,
        "teacher.momentum_restart_fraction": 0.7,
    },
    "momentum cosine from 0.98": _M980,
    "momentum cosine from 0.98, a second learning-rate cosine from half the peak at 70% "
    "(**the default**)": {**_M980, "optim.lr_restart_fraction": 0.7},
}


def test_the_recipe_page_dense_search_is_the_dense_tune_table():
    """docs/cifar10-recipe.md's tuned-dense table: seeds, linear mean with its 95% interval (one
    seed: the value alone) and k-NN as dense_tune_table has them; its last row, the default on
    fresh seeds, as the confirmatory table's dense."""
    page = table_rows((DOCS / "cifar10-recipe.md").read_text())
    defaults = {
        "teacher.momentum_restart_fraction": 0.0,
        "optim.lr_restart_fraction": 0.0,
    }

    def cells(mean: dict) -> list[str]:
        interval = mean["top1_interval"]
        top1 = f"{mean['top1']:.2f}"
        if interval is not None:
            top1 += f" [{interval['low']:.2f}, {interval['high']:.2f}]"
        seeds = ", ".join(str(seed) for seed in mean["seeds"])
        return [seeds, top1, f"{mean['knn_top1']:.2f}"]

    means = json.loads(DENSE_TUNE_SUMMARY.read_text())["schedule_means"]
    for label, keys in DENSE_TUNE_ROWS.items():
        want = {**defaults, **keys}
        [mean] = [
            m
            for m in means
            if m["sparse_fraction"] == 0.0
            and all(m["differing_config"][k] == v for k, v in want.items())
        ]
        assert page[label][1:4] == cells(mean), label
    assert page["the default, fresh seeds (the table above)"][1:4] == cells(
        _confirmatory_means()[0.0]
    )


CONFIRM_RUNS = REPO / "results" / "cifar10" / "recipe" / "confirm_lr"


def test_the_recipe_page_gap_table_is_the_runs_probes():
    """docs/cifar10-recipe.md's "where the gap opens": per seed, the k-NN (k=20) of the teacher
    exported at the switch's step (dense MLPs) and of the final teacher, dense run and 70% recipe,
    from the runs' own probe records, and the gaps between them."""
    page = table_rows((DOCS / "cifar10-recipe.md").read_text())

    def knn(run: str, name: str) -> float:
        return json.loads((CONFIRM_RUNS / run / name).read_text())["knn"]["20"]["top1"]

    for seed in (5, 6, 7):
        dense = f"dense_lr05restart70_m0980_s{seed}"
        recipe = f"sparse70_decay0005_restart_lr05restart70_m0980_s{seed}"
        switch = [knn(run, "eval_knn_step_00005432.json") for run in (dense, recipe)]
        end = [knn(run, "eval_linear.json") for run in (dense, recipe)]
        assert page[str(seed)][1:5] == [
            f"{switch[0]:.2f} / {switch[1]:.2f}",
            f"{switch[1] - switch[0]:.2f}",
            f"{end[0]:.2f} / {end[1]:.2f}",
            f"{end[1] - end[0]:.2f}",
        ], seed


def test_imagenet_expected_table_is_the_published_one():
    rows = table_rows((DOCS / "imagenet.md").read_text())
    for row in published.ROWS:
        cells = rows[row.label]
        assert cells[2].split(" → ")[0] == f"{row.sparse_steps:,}", row.label
        assert float(cells[3]) == row.top1 and float(cells[4]) == pytest.approx(
            row.delta_top1, abs=1e-9
        ), row.label


def measured_step_ms() -> tuple[float, float]:
    rows = {
        row["row"]: round(row["ms"], 1) for row in json.loads(STEP_LAUNCHED.read_text())["rows"]
    }  # as quoted
    return rows["compiled-dense"], rows["compiled-auto"]


def scaling_efficiency(gpus: int) -> float:
    rows = json.loads(SCALING.read_text())["rows"]
    return next(r["efficiency"] for r in rows if r["model"] == "vitl16" and r["gpus"] == gpus)


def test_imagenet_cost_table_is_computed_from_the_committed_measurements():
    """Each schedule's hours on 32 H100s and H100-hours in docs/imagenet.md, recomputed from the
    committed step times (one H100, compiled, launched) and the 4-GPU scaling efficiency."""
    text = (DOCS / "imagenet.md").read_text()
    dense_ms, sparse_ms = measured_step_ms()
    efficiency = round(scaling_efficiency(4), 2)
    assert f"{dense_ms} ms | {sparse_ms} ms" in text and f"**{efficiency:.2f} on 4**" in text
    rows = table_rows(
        text[text.index("### What is extrapolated") : text.index("How far these can be off")]
    )
    total_gpu_hours, seen = 0.0, 0
    for first, cells in rows.items():
        match = re.match(r"([\d.]+) ", first + " ")
        if not match:
            continue
        fraction = float(match.group(1))
        sparse_steps = round(fraction * published.TOTAL_STEPS)
        dense_steps = published.TOTAL_STEPS - sparse_steps
        hours = (sparse_steps * sparse_ms + dense_steps * dense_ms) / 1e3 / efficiency / 3600
        assert cells[1] == f"{sparse_steps:,} → {dense_steps:,}", first
        assert cells[2] == f"{hours:.2f}", first
        assert cells[3] == f"{32 * hours:.0f}", first
        speedup = (
            published.TOTAL_STEPS * dense_ms / (sparse_steps * sparse_ms + dense_steps * dense_ms)
        )
        assert cells[4] == f"{speedup:.3f}x", first
        if any(math.isclose(fraction, row.fraction) for row in published.ROWS):
            total_gpu_hours += 32 * hours
            seen += 1
    assert seen == 7
    assert f"**{total_gpu_hours:,.0f}**" in text


def test_imagenet_storage_is_computed_from_the_model():
    """The checkpoint and export sizes in docs/imagenet.md from the parameter counts of the ViT-L/16
    config (built on the meta device: no memory, no time)."""
    import torch

    from configs import load_config
    from models.ssl_meta_arch import SSLMetaArch

    cfg = load_config(REPO / "configs" / "vitl16_imagenet.yaml", ["data.root=unused"])
    with torch.device("meta"):
        model = SSLMetaArch(cfg)
    state = sum(v.numel() for v in model.state_dict().values())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    backbone = sum(p.numel() for p in model.teacher.backbone.parameters())
    text = (DOCS / "imagenet.md").read_text()
    assert (
        f"{state:,} floats" in text
        and f"{trained:,} trained parameters" in text
        and f"{backbone:,} floats" in text
    )
    checkpoint_gb = (state + 2 * trained) * 4 / 1e9  # model state + AdamW's two moments, fp32
    export_gb = backbone * 4 / 1e9
    assert f"| {checkpoint_gb:.2f} GB ({checkpoint_gb * 1e9 / 2**30:.2f} GiB) |" in text
    assert f"| {export_gb:.2f} GB |" in text
