#!/usr/bin/env python3
"""cuSPARSELt library versions side by side on the ViT-L MLP GEMMs (GPU): which algorithm ids each
version runs safely, how fast its best correct algorithm is against dense cuBLAS, and optionally the
training step with it.

    python -m scripts.experiments.cslt_versions --lib 0.8.0=bundled \\
        --lib 0.10.0=nvidia_cusparselt_cu13-0.10.0-py3-none-manylinux2014_x86_64.whl \\
        --out-dir results/bench/cslt_versions_h100 [--train-step]

Each library runs in processes of its own, started with `LD_PRELOAD=<its libcusparseLt.so.0>` and a
first PYTHONPATH entry holding it as `nvidia/cusparselt/lib/libcusparseLt.so.0` (torch opens its
copy by that path, and a preload alone left torch's calls on torch's copy), so that torch and nvmath
both use it and the process maps no other (`bundled`: the copy torch's wheel ships; a wheel's
library is extracted into --work-dir). Per library:
  1. unless the code already lists the crashing ids of that (GPU, version, dtype)
     (`search.BAD_ALGS`), every algorithm id of the eight GEMMs (fc1 1024->4096 and fc2 4096->1024,
     fwd and dgrad, bf16 and fp16) is run once at --probe-tokens, one process per crash
     (`scripts/experiments/probes/probe_algs.py`), and the crashing ids written to
     `NAME/bad_algs.json` (`scripts/benchmarks/bad_algs.py`); some ids of 0.8.0 kill the CUDA
     context;
  2. `scripts/bench_sparse.py --ops gemm` with the sweep on: each GEMM's fastest correct algorithm
     (every id checked against the dense product first) against dense cuBLAS measured in the same
     process, at --tokens;
  3. with --train-step, `scripts/bench_train_step.py` rows compiled-dense and compiled-cusparselt
     (ViT-L/16).
Then `versions.md` and `versions.json` in --out-dir: per GEMM and library the sparse and dense
times, the speed-up and the chosen algorithm; per library and dtype the ids that ran correctly, gave
wrong results, failed or crashed. Compare speed-ups, not times, across libraries: each is measured
against dense in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from scripts.benchmarks import bad_algs

ROOT = (
    Path(__file__).resolve().parents[2]
)  # the repository root: its subprocesses run `python -m scripts.<name>` there

GEMMS = [(4096, 1024), (1024, 4096)]  # the weight's (out, in): fc1, fc2
KINDS = ("fwd", "dgrad")
PROBE_TIMEOUT_S = 600  # an algorithm that hangs is killed and counted as crashed


def library_file(name: str, source: str, work_dir: Path) -> str | None:
    """The libcusparseLt.so.0 a library runs: None for torch's own copy, a file as given, or a
    wheel's library."""
    if source == "bundled":
        return None
    path = Path(source)
    if not path.is_file():
        raise SystemExit(
            f"--lib {name}={source}: no such file (give 'bundled', a libcusparseLt.so.0 or a wheel)"
        )
    if path.suffix != ".whl":
        return str(path.resolve())
    with zipfile.ZipFile(path) as z:
        members = [m for m in z.namelist() if Path(m).name.startswith("libcusparseLt.so")]
        if not members:
            raise SystemExit(f"--lib {name}={source}: the wheel holds no libcusparseLt.so")
        dest = work_dir / name
        dest.mkdir(parents=True, exist_ok=True)
        return str(Path(z.extract(members[0], dest)).resolve())


def env_for(so: str | None) -> dict:
    env = dict(os.environ)
    if so:
        env["LD_PRELOAD"] = so + (" " + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
        # torch opens its cuSPARSELt by full path from the first sys.path entry holding
        # nvidia/cusparselt/lib, and its calls bind to that copy even beside a preload: a path entry
        # of our own makes that copy the preloaded file
        site = Path(so).resolve().parent / "torch_site"
        lib = site / "nvidia" / "cusparselt" / "lib"
        lib.mkdir(parents=True, exist_ok=True)
        if not (lib / "libcusparseLt.so.0").exists():
            (lib / "libcusparseLt.so.0").symlink_to(Path(so).resolve())
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    return env


def library_info(env: dict) -> dict:
    """The version and GPU the library reports, and whether the code already lists its crashing ids,
    per dtype."""
    code = (
        "import json, torch\n"
        "from sparsity.backends.cusparselt.library import arch_of, loaded_library_path, version\n"
        "from sparsity.backends.cusparselt.search import BAD_ALGS\n"
        "arch = arch_of(torch.cuda.current_device())\n"
        "dtypes = (('bf16', torch.bfloat16), ('fp16', torch.float16))\n"
        "known = {n: (arch, version(), d) in BAD_ALGS for n, d in dtypes}\n"
        "file = loaded_library_path()\n"
        "mapped = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libcusparseLt' in "
        "l})\n"
        "print(json.dumps({'arch': arch, 'cusparselt': version(), 'known': known, 'file': file, "
        "'mapped': mapped}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"the library does not load: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe(env: dict, out: Path, dtype: str, kind: str, o: int, i: int, tokens: int) -> None:
    """Every algorithm id of one GEMM, restarting after each crash until the probe reports it is
    done."""
    start = 0
    while True:
        cmd = [
            sys.executable,
            "-m",
            "scripts.experiments.probes.probe_algs",
            "--dtype",
            dtype,
            "--kind",
            kind,
            "--out-features",
            str(o),
            "--in-features",
            str(i),
            "--tokens",
            str(tokens),
            "--out",
            str(out),
            "--start",
            str(start),
        ]
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=PROBE_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        this = (dtype, kind, o, i, tokens)
        mine = [
            s
            for s in (bad_algs.summarize(str(out)) if out.exists() else [])
            if (s["dtype"], s["kind"], s["out_features"], s["in_features"], s["tokens"]) == this
        ]
        if rc == 0 and mine and mine[0]["done"]:
            return
        if not mine or mine[0]["max_alg"] is None:
            raise SystemExit(
                f"the probe of {dtype} {kind} {o}x{i} failed before trying any algorithm (exit "
                f"{rc})"
            )
        start = mine[0]["last_try"] + 1
        print(
            f"  {dtype} {kind} {o}x{i}: the probe died (exit {rc}); again from algorithm {start}",
            flush=True,
        )


def run_library(name: str, so: str | None, args, out_dir: Path) -> dict:
    env = env_for(so)
    lib_dir = out_dir / name
    lib_dir.mkdir(parents=True, exist_ok=True)
    info = library_info(env)
    if so and (info["file"] is None or os.path.realpath(info["file"]) != os.path.realpath(so)):
        # the loader ignores a preload it cannot load (a missing dependency) and the process runs
        # torch's copy
        raise SystemExit(f"{name}: the process runs {info['file']}, not the preloaded {so}")
    if len({os.path.realpath(f) for f in info.get("mapped", [])}) > 1:
        # torch's calls may bind to one copy and nvmath's to the other: neither benchmark would
        # measure the library
        raise SystemExit(f"{name}: the process maps two cuSPARSELt libraries: {info['mapped']}")
    print(f"{name}: cuSPARSELt {info['cusparselt']} on {info['arch']}", flush=True)
    record = {
        "name": name,
        "source": Path(args.sources[name]).name,
        "cusparselt": info["cusparselt"],
        "arch": info["arch"],
        "known_lists": info["known"],
    }
    bad_file = None
    to_probe = [
        d
        for d in args.dtypes
        if args.probe == "all" or (args.probe == "unknown" and not info["known"][d])
    ]
    if to_probe:
        probe_file = lib_dir / "probe.jsonl"
        probe_file.unlink(missing_ok=True)
        for dtype in to_probe:
            for o, i in GEMMS:
                for kind in KINDS:
                    print(
                        f"{name}: probing {dtype} {kind} {o}x{i} at {args.probe_tokens} tokens",
                        flush=True,
                    )
                    probe(env, probe_file, dtype, kind, o, i, args.probe_tokens)
        summaries = bad_algs.summarize(str(probe_file))
        bad_file = lib_dir / "bad_algs.json"
        doc = bad_algs.bad_algs_file(summaries, str(bad_file))
        record["probes"] = [_probe_row(s) for s in summaries]
        record["crashing"] = doc["bad"]
    extra = ["--bad-algs", str(bad_file)] if bad_file else []
    gemm_json = lib_dir / "gemm.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.bench_sparse",
            "--ops",
            "gemm",
            "--tokens",
            *map(str, args.tokens),
            "--dtypes",
            *args.dtypes,
            "--out",
            str(gemm_json),
            *extra,
        ],
        cwd=ROOT,
        env=env,
        check=True,
    )
    record["gemm_json"] = str(gemm_json.relative_to(out_dir))
    if args.train_step:
        step_json = lib_dir / "train_step.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "scripts.bench_train_step",
                "--config",
                "configs/vitl16_imagenet.yaml",
                "--rows",
                "compiled-dense",
                "compiled-cusparselt",
                "--warmup",
                "5",
                "--iters",
                "20",
                "--profile",
                "0",
                "--out",
                str(step_json),
                *extra,
            ],
            cwd=ROOT,
            env=env,
            check=True,
        )
        record["train_step_json"] = str(step_json.relative_to(out_dir))
    return record


def _probe_row(s: dict) -> dict:
    return {
        "dtype": s["dtype"],
        "kind": s["kind"],
        "weight": f"{s['out_features']}x{s['in_features']}",
        "tokens": s["tokens"],
        "ids": (s["max_alg"] or 0) + 1,
        "default_alg": s["default_alg"],
        "correct": len(s["ok"]),
        "wrong": sorted(int(a) for a in s["wrong"]),
        "failed": len(s["plan_error"]) + len(s["run_error"]),
        "crashed": s["crashed"],
    }


def gemm_table(records: list[dict], out_dir: Path) -> list[dict]:
    """One row per GEMM: each library's sparse ms, dense ms, speed-up and chosen algorithm."""
    rows: dict[tuple, dict] = {}
    for rec in records:
        doc = json.loads((out_dir / rec["gemm_json"]).read_text())
        plans = doc.get("cusparselt_describe", {}).get("plans", {}).values()
        for r in doc["rows"]:
            if r.get("op") != "gemm" or r.get("backend") != "cusparselt":
                continue
            key = (
                r["dtype"],
                r["gemm"],
                r["out_features"],
                r["in_features"],
                r["tokens"],
                r["graph"],
            )
            alg = next(
                (
                    p.get("alg_id")
                    for p in plans
                    if (
                        p.get("dtype"),
                        p.get("kind"),
                        p.get("out_features"),
                        p.get("in_features"),
                        p.get("tokens"),
                    )
                    == key[:5]
                ),
                None,
            )
            row = rows.setdefault(
                key,
                dict(
                    zip(("dtype", "gemm", "out_features", "in_features", "tokens", "graph"), key),
                    libraries={},
                ),
            )
            row["libraries"][rec["name"]] = {
                "ms": r.get("ms"),
                "dense_ms": r.get("dense_ms"),
                "speedup": r.get("speedup"),
                "alg": alg,
            }
    return list(rows.values())


def write_markdown(records: list[dict], table: list[dict], path: Path) -> None:
    names = [r["name"] for r in records]
    lines = [
        "# cuSPARSELt versions side by side",
        "",
        "Generated by `scripts/experiments/cslt_versions.py`. Each cell: sparse ms / dense ms "
        "(dense cuBLAS on "
        "the same pruned weight, measured in the same process) = speed-up, and the algorithm the "
        "sweep chose. "
        "fwd: x @ W^T; dgrad: dy @ W; graph: replayed from a CUDA graph, else eager.",
        "",
        "| library | cuSPARSELt | GPU |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {r['name']} ({r['source']}) | {r['cusparselt']} | {r['arch']} |" for r in records]
    lines += [
        "",
        "| dtype | GEMM | W (out x in) | tokens | graph | " + " | ".join(names) + " |",
        "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for row in table:
        cells = []
        for n in names:
            c = row["libraries"].get(n)
            cells.append(
                "-"
                if not c or c["ms"] is None
                else f"{c['ms']:.3f} / {c['dense_ms']:.3f} = {c['speedup']:.2f}x (alg {c['alg']})"
            )
        lines.append(
            f"| {row['dtype']} | {row['gemm']} | {row['out_features']}x{row['in_features']} | "
            f"{row['tokens']} | {'yes' if row['graph'] else 'no'} | " + " | ".join(cells) + " |"
        )
    for rec in records:
        if "probes" not in rec:
            continue
        lines += [
            "",
            f"Algorithm ids of {rec['name']} (cuSPARSELt {rec['cusparselt']}), each run once at "
            f"{rec['probes'][0]['tokens']} tokens:",
            "",
            "| dtype | GEMM | W | ids | default | correct | wrong | failed | crashed |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {p['dtype']} | {p['kind']} | {p['weight']} | {p['ids']} | {p['default_alg']} | "
            f"{p['correct']} | "
            f"{p['wrong'] or '-'} | {p['failed']} | {p['crashed'] or '-'} |"
            for p in rec["probes"]
        ]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--lib",
        action="append",
        required=True,
        metavar="NAME=SOURCE",
        help="a library to measure: 'bundled', a libcusparseLt.so.0 or an nvidia-cusparselt wheel",
    )
    ap.add_argument("--out-dir", required=True)
    ap.add_argument(
        "--work-dir", default="/tmp/cslt_versions", help="where wheels' libraries are extracted"
    )
    ap.add_argument("--tokens", type=int, nargs="+", default=[32768, 58496])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=["bf16", "fp16"])
    ap.add_argument(
        "--probe",
        default="unknown",
        choices=["unknown", "all", "none"],
        help="probe every algorithm id where the code has no list for the version (unknown), "
        "always, "
        "or never (then the sweep runs only where a list exists)",
    )
    ap.add_argument("--probe-tokens", type=int, default=4096)
    ap.add_argument("--train-step", action="store_true")
    args = ap.parse_args()
    args.sources = {}
    for spec in args.lib:
        name, sep, source = spec.partition("=")
        if not sep or not name or not source or "/" in name:
            raise SystemExit(f"--lib {spec!r}: expected NAME=SOURCE, e.g. 0.8.0=bundled")
        if name in args.sources:
            raise SystemExit(f"--lib {name} is given twice")
        args.sources[name] = source
    out_dir = Path(args.out_dir).resolve()  # the benchmarks run from the repository root
    out_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for name, source in args.sources.items():
        records.append(
            run_library(name, library_file(name, source, Path(args.work_dir)), args, out_dir)
        )
        (out_dir / "versions.json").write_text(
            json.dumps({"libraries": records}, indent=1)
        )  # survives a later crash
    table = gemm_table(records, out_dir)
    (out_dir / "versions.json").write_text(
        json.dumps({"libraries": records, "gemms": table}, indent=1)
    )
    write_markdown(records, table, out_dir / "versions.md")
    print((out_dir / "versions.md").read_text())


if __name__ == "__main__":
    main()
