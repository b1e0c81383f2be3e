"""glibc's malloc against a caching allocator (tcmalloc, jemalloc) on the benchmark's CPU workloads.

PyTorch's CPU tensors come from the C allocator. The routing steps allocate and free large temporaries in every
iteration; with glibc, freed blocks above its mmap threshold go back to the kernel and come back as fresh pages
(page faults), which a caching allocator avoids. This script measures the effect: it runs ``bench.py`` on the
chosen cases in a fresh process per allocator (``LD_PRELOAD``), in interleaved rounds (glibc, tcmalloc,
jemalloc, glibc, ...), and reports the median over rounds of capsule_lib's median step time per case. One more
variant keeps glibc but sets ``THP_MEM_ALLOC_ENABLE=1`` (PyTorch then asks for transparent huge pages on large
CPU tensors, where the kernel allows it: ``/sys/kernel/mm/transparent_hugepage/enabled`` = madvise or always)::

    .venv/bin/python benchmarks/allocator.py --threads 2 --rounds 3        # -> results/allocator_cpu.json
    .venv/bin/python benchmarks/allocator.py --quick                       # bench.py --quick cases (tests)

The allocators are the Debian packages ``libtcmalloc-minimal4`` and ``libjemalloc2``; one that is not installed
is skipped (and named in the JSON). The library does not depend on either.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from capsule_lib.cost import machine_info  # noqa: E402

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
ALLOCATORS = {
    "glibc": None,
    "glibc_thp": None,
    "tcmalloc": LIBDIR / "libtcmalloc_minimal.so.4",
    "jemalloc": LIBDIR / "libjemalloc.so.2",
}
#: environment of each allocator's process besides LD_PRELOAD: "glibc_thp" is glibc's malloc with PyTorch's own
#: switch for transparent huge pages on large CPU tensors (2 MiB pages: 512x fewer page faults per allocation)
ENV = {"glibc_thp": {"THP_MEM_ALLOC_ENABLE": "1"}}
DEFAULT_CASES = (
    "routing_dynamic,routing_heinsen_smallnorb,routing_inverted_conv,routing_em_convcaps1,model_capsnet_mnist"
)


def _env_note(name: str) -> str:
    return "".join(f", {e}={x}" for e, x in ENV.get(name, {}).items())


def run_bench(
    cases: str, threads: int | None, quick: bool, preload: Path | None, extra_env: dict | None = None
) -> dict[str, float]:
    """capsule_lib's median step time (s) per case, from one ``bench.py`` process with ``preload``."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    env.update(extra_env or {})
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [
            sys.executable,
            str(HERE / "bench.py"),
            "--device",
            "cpu",
            "--only",
            cases,
            "--no-memory",
            "--ours-only",
            "--check-dtype",
            "none",
            "--out",
            str(out),
        ]
        cmd += ["--quick"] if quick else []
        cmd += ["--threads", str(threads)] if threads else []
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        res = json.loads(out.read_text())
    return {name: case["variants"]["ours"]["median_s"] for name, case in res["cases"].items()}


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=DEFAULT_CASES, help="bench.py case names or globs, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="bench.py --quick shapes, one round")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    have = {k: v for k, v in ALLOCATORS.items() if v is None or v.exists()}
    missing = sorted(set(ALLOCATORS) - set(have))
    rounds = 1 if a.quick else a.rounds
    times: dict[str, dict[str, list[float]]] = {k: {} for k in have}
    t0 = time.perf_counter()
    for r in range(rounds):
        order = list(have) if r % 2 == 0 else list(reversed(have))  # interleaved: A B C, C B A, ...
        for name in order:
            for case, s in run_bench(a.cases, a.threads, a.quick, have[name], ENV.get(name)).items():
                times[name].setdefault(case, []).append(s)
    cases = sorted(times["glibc"])
    rows = []
    for case in cases:
        med = {k: statistics.median(times[k][case]) for k in have}
        rows.append(
            {
                "case": case,
                "median_s": med,
                "speedup_vs_glibc": {k: med["glibc"] / med[k] for k in have if k != "glibc"},
                "rounds_s": {k: times[k][case] for k in have},
            }
        )
    suffix = "_quick" if a.quick else ""
    out = Path(a.out) if a.out else HERE / "results" / f"allocator_cpu{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "what": "capsule_lib's median step (bench.py, variant 'ours') per allocator, median over interleaved rounds",
        "machine": machine_info("cpu") | {"torch_threads": a.threads},
        "allocators": {k: (str(v) if v else "glibc malloc (no LD_PRELOAD)") + _env_note(k) for k, v in have.items()},
        "missing": missing,
        "rounds": rounds,
        "quick": a.quick,
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    for row in rows:
        print(
            f"{row['case']:>28}: glibc {1e3 * row['median_s']['glibc']:8.1f} ms  "
            + "  ".join(f"{k} x{v:.2f}" for k, v in row["speedup_vs_glibc"].items())
        )
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
