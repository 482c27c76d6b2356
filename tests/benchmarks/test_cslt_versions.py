"""CPU tests of the cuSPARSELt version comparison: reading the algorithm probes back (which ids
crashed, gave wrong results), the crash-restart loop, the bad-algorithm list handed to the sweep,
the library picked from a wheel, and the side-by-side table (scripts/experiments/cslt_versions.py,
scripts/benchmarks/bad_algs.py)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # the repository root: scripts.benchmarks

from scripts.benchmarks import bad_algs  # noqa: E402
from scripts.experiments import cslt_versions as V  # noqa: E402
from sparsity.backends.cusparselt import library, search  # noqa: E402

TAG = dict(dtype="fp16", kind="fwd", out_features=4096, in_features=1024, tokens=4096)
LIB = dict(arch="sm90", cusparselt=1000, library="nvidia/cu13/lib/libcusparseLt.so.0")


def _write(path, lines):
    with open(path, "a") as f:
        for line in lines:
            f.write(json.dumps({**TAG, **line}) + "\n")


def _probe_lines_with_two_crashes():
    """Ids 0-5: 0 correct, 1 wrong, 2 no plan, 3 dies without a line (restart), 4 a CUDA error
    (exit), 5 correct."""
    return [
        [
            dict(event="max_alg", max_alg=5, default_alg=0, alg=-1, **LIB),
            dict(alg=0, event="try"),
            dict(alg=0, event="ok", rel_err=0.002, ms=0.5),
            dict(alg=1, event="try"),
            dict(alg=1, event="ok", rel_err=0.9, ms=0.4),
            dict(alg=2, event="try"),
            dict(alg=2, event="plan_error", error="cuSPARSELtError: NOT_SUPPORTED"),
            dict(alg=3, event="try"),
        ],
        [
            dict(event="max_alg", max_alg=5, default_alg=0, alg=3, **LIB),
            dict(alg=4, event="try"),
            dict(alg=4, event="run_error", error="AcceleratorError('illegal instruction')"),
        ],
        [
            dict(event="max_alg", max_alg=5, default_alg=0, alg=4, **LIB),
            dict(alg=5, event="try"),
            dict(alg=5, event="ok", rel_err=0.003, ms=0.45),
            dict(alg=5, event="done"),
        ],
    ]


def test_summarize_sorts_every_outcome(tmp_path):
    f = tmp_path / "probe.jsonl"
    for part in _probe_lines_with_two_crashes():
        _write(f, part)
    (s,) = bad_algs.summarize(str(f))
    assert (
        sorted(s["ok"]) == [0, 5] and sorted(s["wrong"]) == [1] and sorted(s["plan_error"]) == [2]
    )
    assert s["crashed"] == [3, 4] and s["run_error"] == {}
    assert s["done"] and s["max_alg"] == 5 and s["cusparselt"] == 1000 and s["last_try"] == 5


def test_summarize_counts_the_last_attempt_of_an_unfinished_probe_as_a_crash(tmp_path):
    f = tmp_path / "probe.jsonl"
    _write(f, _probe_lines_with_two_crashes()[0])
    (s,) = bad_algs.summarize(str(f))
    assert s["crashed"] == [3] and not s["done"]


def test_a_cusparselt_status_is_a_failure_not_a_crash(tmp_path):
    f = tmp_path / "probe.jsonl"
    _write(
        f,
        [
            dict(event="max_alg", max_alg=0, default_alg=0, alg=-1, **LIB),
            dict(alg=0, event="try"),
            dict(alg=0, event="run_error", error="cuSPARSELtError: INTERNAL_ERROR"),
            dict(alg=0, event="done"),
        ],
    )
    (s,) = bad_algs.summarize(str(f))
    assert s["crashed"] == [] and list(s["run_error"]) == [0]


def test_probe_restarts_after_each_crash(tmp_path, monkeypatch):
    out = tmp_path / "probe.jsonl"
    parts = iter(_probe_lines_with_two_crashes())
    starts = []

    def fake_run(cmd, **kw):
        starts.append(int(cmd[cmd.index("--start") + 1]))
        lines = next(parts)
        _write(out, lines)
        return subprocess.CompletedProcess(cmd, 0 if lines[-1].get("event") == "done" else -11)

    monkeypatch.setattr(V.subprocess, "run", fake_run)
    V.probe({}, out, "fp16", "fwd", 4096, 1024, 4096)
    assert starts == [0, 4, 5]


def test_probe_fails_clearly_when_nothing_ran(tmp_path, monkeypatch):
    monkeypatch.setattr(V.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(SystemExit, match="before trying any algorithm"):
        V.probe({}, tmp_path / "p.jsonl", "fp16", "fwd", 4096, 1024, 4096)


def test_bad_algs_file_lists_the_crashes_per_dtype(tmp_path):
    f = tmp_path / "probe.jsonl"
    for part in _probe_lines_with_two_crashes():
        _write(f, part)
    doc = bad_algs.bad_algs_file(bad_algs.summarize(str(f)), str(tmp_path / "bad.json"))
    assert doc["bad"] == {"fp16": [3, 4]} and doc["cusparselt"] == 1000 and doc["unfinished"] == []
    assert json.loads((tmp_path / "bad.json").read_text()) == doc


def test_bad_algs_file_refuses_probes_of_two_versions(tmp_path):
    f = tmp_path / "probe.jsonl"
    _write(f, [dict(event="max_alg", max_alg=0, default_alg=0, alg=-1, **LIB)])
    with open(f, "a") as h:
        h.write(
            json.dumps(
                {
                    **TAG,
                    "kind": "dgrad",
                    "event": "max_alg",
                    "max_alg": 0,
                    "alg": -1,
                    **{**LIB, "cusparselt": 800},
                }
            )
            + "\n"
        )
    with pytest.raises(ValueError, match="one known architecture and library version"):
        bad_algs.bad_algs_file(bad_algs.summarize(str(f)), str(tmp_path / "bad.json"))


def test_registered_ids_open_the_sweep_on_an_unlisted_version(monkeypatch):
    monkeypatch.setattr(search, "BAD_ALGS", dict(search.BAD_ALGS))
    monkeypatch.setattr(search, "version", lambda: 1100)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    assert (
        search.sweep_blocklist(0, torch.float16, "sweep") is None
    )  # no list: the default algorithm only
    search.register_bad_algs("sm90", 1100, torch.float16, [40, 41])
    search.register_bad_algs("sm90", 1100, torch.float16, [7])
    assert search.sweep_blocklist(0, torch.float16, "sweep") == frozenset({7, 40, 41})
    assert search.sweep_blocklist(0, torch.bfloat16, "sweep") is None


@pytest.mark.parametrize(
    "args, match",
    [
        (("90", 1000, torch.float16, [1]), "arch"),
        (("sm90", "0.10", torch.float16, [1]), "version"),
        (("sm90", 1000, torch.float32, [1]), "dtype"),
        (("sm90", 1000, torch.float16, [-1]), "alg_ids"),
    ],
)
def test_register_bad_algs_refuses_what_cannot_be_a_list(args, match):
    with pytest.raises(ValueError, match=match):
        search.register_bad_algs(*args)


def test_loaded_library_path_reads_the_process_maps():
    maps = (
        "7f00-7f10 r-xp 00000000 08:01 123 /usr/lib/libc.so.6\n"
        "7f20-7f30 r--p 00000000 00:00 0 \n"
        "7f40-7f50 r-xp 00000000 08:01 456 /opt/x y/nvidia/cu13/lib/libcusparseLt.so.0\n"
    )
    assert library.loaded_library_path(maps) == "/opt/x y/nvidia/cu13/lib/libcusparseLt.so.0"
    assert (
        library.loaded_library_path("7f00-7f10 r-xp 00000000 08:01 123 /usr/lib/libc.so.6\n")
        is None
    )
    assert (
        bad_algs.short_library_path("/opt/x y/nvidia/cu13/lib/libcusparseLt.so.0")
        == "nvidia/cu13/lib/libcusparseLt.so.0"
    )


def test_library_file_takes_the_library_out_of_a_wheel(tmp_path):
    whl = tmp_path / "nvidia_cusparselt_cu13-0.10.0-py3-none-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("nvidia/cu13/include/cusparseLt.h", "/* header */")
        z.writestr("nvidia/cu13/lib/libcusparseLt.so.0", b"\x7fELF fake")
    so = V.library_file("0.10.0", str(whl), tmp_path / "work")
    assert so.endswith("libcusparseLt.so.0") and Path(so).read_bytes() == b"\x7fELF fake"
    assert V.library_file("0.8.0", "bundled", tmp_path / "work") is None
    with pytest.raises(SystemExit, match="no such file"):
        V.library_file("x", str(tmp_path / "missing.whl"), tmp_path / "work")
    env = V.env_for(so)
    assert env["LD_PRELOAD"].split()[0] == so
    # torch opens the first nvidia/cusparselt/lib it finds on sys.path: that entry must be this
    # library
    site = env["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(site) / "nvidia" / "cusparselt" / "lib" / "libcusparseLt.so.0").resolve() == Path(
        so
    ).resolve()
    assert V.env_for(so)["PYTHONPATH"].split(os.pathsep)[0] == site  # a second process reuses it


def test_the_table_puts_each_librarys_speedup_and_algorithm_side_by_side(tmp_path):
    def gemm_json(name, sparse_ms, alg):
        rows = [
            dict(
                op="gemm",
                backend="dense",
                gemm="fwd",
                dtype="bfloat16",
                out_features=4096,
                in_features=1024,
                tokens=32768,
                graph=True,
                ms=1.0,
                dense_ms=1.0,
                speedup=1.0,
            ),
            dict(
                op="gemm",
                backend="cusparselt",
                gemm="fwd",
                dtype="bfloat16",
                out_features=4096,
                in_features=1024,
                tokens=32768,
                graph=True,
                ms=sparse_ms,
                dense_ms=1.0,
                speedup=round(1.0 / sparse_ms, 4),
            ),
        ]
        plans = {
            "k": dict(
                alg_id=alg,
                kind="fwd",
                out_features=4096,
                in_features=1024,
                tokens=32768,
                dtype="bfloat16",
            )
        }
        (tmp_path / name).mkdir()
        (tmp_path / name / "gemm.json").write_text(
            json.dumps({"rows": rows, "cusparselt_describe": {"plans": plans}})
        )
        return {
            "name": name,
            "source": "bundled",
            "cusparselt": 800,
            "arch": "sm90",
            "gemm_json": f"{name}/gemm.json",
        }

    records = [gemm_json("0.8.0", 0.8, 12), gemm_json("0.10.0", 1.25, 3)]
    table = V.gemm_table(records, tmp_path)
    assert len(table) == 1
    assert table[0]["libraries"]["0.8.0"] == {
        "ms": 0.8,
        "dense_ms": 1.0,
        "speedup": 1.25,
        "alg": 12,
    }
    assert table[0]["libraries"]["0.10.0"]["speedup"] == 0.8
    V.write_markdown(records, table, tmp_path / "versions.md")
    md = (tmp_path / "versions.md").read_text()
    assert (
        "| bfloat16 | fwd | 4096x1024 | 32768 | yes | 0.800 / 1.000 = 1.25x (alg 12) | "
        "1.250 / 1.000 = 0.80x (alg 3) |" in md
    )


def test_a_preload_the_loader_ignored_is_an_error_not_a_mislabelled_row(tmp_path, monkeypatch):
    info = {
        "arch": "sm90",
        "cusparselt": 800,
        "known": {"bf16": True, "fp16": True},
        "file": "/site/nvidia/cu13/lib/libcusparseLt.so.0",
    }
    monkeypatch.setattr(V, "library_info", lambda env: info)
    args = type("A", (), {"sources": {"0.10.0": "x.whl"}, "dtypes": ["bf16"], "probe": "unknown"})()
    with pytest.raises(SystemExit, match="not the preloaded"):
        V.run_library("0.10.0", str(tmp_path / "libcusparseLt.so.0"), args, tmp_path)


def test_two_copies_of_the_library_in_one_process_are_an_error(tmp_path, monkeypatch):
    """Seen on the H100: with the preload alone nvmath ran the preloaded 0.10.0 and torch its own
    0.8.0."""
    so = tmp_path / "libcusparseLt.so.0"
    so.write_bytes(b"x")
    info = {
        "arch": "sm90",
        "cusparselt": 1000,
        "known": {"bf16": True, "fp16": True},
        "file": str(so),
        "mapped": [str(so), "/site/nvidia/cusparselt/lib/libcusparseLt.so.0"],
    }
    monkeypatch.setattr(V, "library_info", lambda env: info)
    args = type("A", (), {"sources": {"0.10.0": "x.whl"}, "dtypes": ["bf16"], "probe": "unknown"})()
    with pytest.raises(SystemExit, match="maps two cuSPARSELt libraries"):
        V.run_library("0.10.0", str(so), args, tmp_path)


def test_a_relative_out_dir_is_the_callers_not_the_repository_roots(tmp_path, monkeypatch):
    """The benchmarks run with the repository root as their working directory: paths handed to them
    are absolute."""
    seen = []
    monkeypatch.setattr(
        V, "run_library", lambda name, so, args, out_dir: seen.append(out_dir) or {"name": name}
    )
    monkeypatch.setattr(V, "gemm_table", lambda records, out_dir: [])
    monkeypatch.setattr(
        V, "write_markdown", lambda records, table, path: path.write_text("table\n")
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys, "argv", ["cslt_versions.py", "--lib", "0.8.0=bundled", "--out-dir", "rel"]
    )
    V.main()
    assert seen == [tmp_path / "rel"] and (tmp_path / "rel" / "versions.json").exists()
