"""What `probe_algs.py` found for one cuSPARSELt library, and handing its crashing ids to the sweep
(GPU-free).

`summarize(probe_jsonl)` reads the lines `probe_algs.py` appended (one GEMM configuration after
another, restarted after each crash) and says per configuration which algorithm ids ran correctly,
gave wrong results, failed to build or run, and which killed the process. A crash shows as an
attempt ("try") with no outcome line after it, or as a run error that is not a cuSPARSELt status (a
CUDA error: the context is gone and the probe exits).

`bad_algs_file(summaries, path)` writes the crashing ids per dtype, keyed by the GPU architecture
and library version the probes ran on; `apply(path)` registers them with the search
(`register_bad_algs`) in a benchmark's process, so that "sweep" runs on a library version the code
has no list for yet. A file for another architecture or version than the running one is refused.
"""

from __future__ import annotations

import json

WRONG_REL_ERR = 1e-2  # as the search's own check


def _config_key(r: dict) -> tuple:
    return (r["dtype"], r["kind"], r["out_features"], r["in_features"], r["tokens"])


def summarize(path: str) -> list[dict]:
    """One dict per probed configuration: its ids by outcome, the library it ran on, and whether it
    finished."""
    configs: dict[tuple, dict] = {}
    with open(path) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    for r in lines:
        c = configs.setdefault(
            _config_key(r),
            {
                "dtype": r["dtype"],
                "kind": r["kind"],
                "out_features": r["out_features"],
                "in_features": r["in_features"],
                "tokens": r["tokens"],
                "ok": {},
                "wrong": {},
                "plan_error": {},
                "run_error": {},
                "crashed": [],
                "pending": None,
                "done": False,
                "max_alg": None,
                "default_alg": None,
                "cusparselt": None,
                "library": None,
                "arch": None,
                "last_try": -1,
            },
        )
        event = r.get("event")
        if event == "max_alg":
            for k in ("max_alg", "default_alg", "cusparselt", "library", "arch"):
                c[k] = r.get(k, c[k])
            if c["pending"] is not None:  # restarted: the attempt before the restart never finished
                c["crashed"].append(c["pending"])
                c["pending"] = None
        elif event == "try":
            if c["pending"] is not None:
                c["crashed"].append(c["pending"])
            c["pending"] = c["last_try"] = r["alg"]
        elif event in ("ok", "plan_error", "run_error"):
            c["pending"] = None
            if event == "ok":
                bucket = "ok" if r["rel_err"] < WRONG_REL_ERR else "wrong"
                c[bucket][r["alg"]] = {"rel_err": r["rel_err"], "ms": r.get("ms")}
            elif event == "run_error" and "cuSPARSELt" not in r.get("error", ""):
                c["crashed"].append(
                    r["alg"]
                )  # a CUDA error: the probe exited, the context was lost
            else:
                c[event][r["alg"]] = r.get("error", "")
        elif event == "done":
            c["done"] = True
    out = []
    for c in configs.values():
        if c["pending"] is not None and not c["done"]:  # the last attempt of an unfinished probe
            c["crashed"].append(c.pop("pending"))
        c.pop("pending", None)
        c["crashed"] = sorted(set(c["crashed"]))
        out.append(c)
    return out


def short_library_path(path: str | None) -> str | None:
    """A library file named for a results file: its last directories (e.g.
    nvidia/cu13/lib/libcusparseLt.so.0), not the machine's absolute path."""
    return None if path is None else "/".join(path.split("/")[-4:])


def bad_algs_file(summaries: list[dict], path: str) -> dict:
    """Write {arch, cusparselt, library, bad: {dtype: [ids]}} from the summaries of one library's
    probes."""
    libs = {(s["arch"], s["cusparselt"]) for s in summaries}
    if len(libs) != 1 or None in next(iter(libs)):
        raise ValueError(
            f"the probes must come from one known architecture and library version, got "
            f"{sorted(libs)}"
        )
    arch, ver = libs.pop()
    bad: dict[str, set] = {}
    for s in summaries:
        bad.setdefault(s["dtype"], set()).update(s["crashed"])
    doc = {
        "arch": arch,
        "cusparselt": ver,
        "library": short_library_path(summaries[0]["library"]),
        "bad": {d: sorted(ids) for d, ids in sorted(bad.items())},
        "unfinished": [
            f"{s['dtype']} {s['kind']} {s['out_features']}x{s['in_features']}"
            for s in summaries
            if not s["done"]
        ],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return doc


def add_argument(parser) -> None:
    """A benchmark's `--bad-algs JSON` option, read by `apply`."""
    parser.add_argument(
        "--bad-algs",
        default=None,
        metavar="JSON",
        help="cuSPARSELt algorithm ids that crash on this GPU and library version "
        "(scripts/benchmarks/bad_algs.py), so that the sweep runs on a version without a list",
    )


def apply(path: str | None) -> dict | None:
    """Register a bad-algorithm file's ids for the running GPU and library; None without a file."""
    if not path:
        return None
    import torch  # noqa: PLC0415 - the summary functions above run without torch

    from sparsity.backends.cusparselt.library import arch_of, version  # noqa: PLC0415
    from sparsity.backends.cusparselt.search import register_bad_algs  # noqa: PLC0415

    with open(path) as f:
        doc = json.load(f)
    arch = arch_of(torch.cuda.current_device())
    if (doc["arch"], doc["cusparselt"]) != (arch, version()):
        raise SystemExit(
            f"{path} lists algorithms of cuSPARSELt {doc['cusparselt']} on {doc['arch']}; this "
            f"process "
            f"runs cuSPARSELt {version()} on {arch}"
        )
    if doc.get("unfinished"):
        raise SystemExit(
            f"{path}: the probes of {doc['unfinished']} did not finish, so an id that crashes "
            f"there may "
            "be missing; probe again before sweeping"
        )
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for name, ids in doc["bad"].items():
        register_bad_algs(arch, doc["cusparselt"], dtypes[name], ids)
    return doc
